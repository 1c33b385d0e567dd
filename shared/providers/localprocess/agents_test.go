package localprocess

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDefaultEnvIsMinimal: without WithBaseEnv a command sees PATH, HOME, LANG and TMPDIR
// of this process and its sandbox's variables, never this process's credentials.
func TestDefaultEnvIsMinimal(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "canary-secret")
	t.Setenv("SANDKEEP_E2B_API_KEY", "canary-key")
	t.Setenv("LANG", "C.UTF-8")
	p := New(filepath.Join(t.TempDir(), "b"))
	id := create(t, p, "sk_minenv")
	if err := p.SetEnv(t.Context(), id, map[string]string{"OWN": "1"}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(t.Context(), id, "env")
	if err != nil {
		t.Fatal(err)
	}
	out := string(res.Stdout)
	for _, want := range []string{"PATH=", "LANG=C.UTF-8", "OWN=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("env lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "canary") || strings.Contains(out, "AWS_") || strings.Contains(out, "SANDKEEP_") {
		t.Errorf("a sandbox command inherited this process's credentials:\n%s", out)
	}
}

func TestMinimalEnv(t *testing.T) {
	got := MinimalEnv([]string{"HOME=/h", "AWS_REGION=x", "PATH=/p", "PATH=/second", "TMPDIR=/t", "LANGUAGE=fr", "bogus"})
	if want := "HOME=/h PATH=/p TMPDIR=/t"; strings.Join(got, " ") != want {
		t.Fatalf("MinimalEnv = %q, want %q", got, want)
	}
	if got := MinimalEnv(nil); len(got) != 1 || got[0] != "PATH="+DefaultPath {
		t.Fatalf("MinimalEnv(nil) = %q", got)
	}
}

// TestStopStarted: the groups Start launched that still run are killed (a background child
// included) and counted, one that ended is not, and nothing starts afterwards.
func TestStopStarted(t *testing.T) {
	p := New(filepath.Join(t.TempDir(), "b"))
	id := create(t, p, "sk_stop")
	var live []int
	for range 2 {
		pgid, err := p.Start(t.Context(), id, "sleep 600 & sleep 600")
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, pgid)
	}
	done, err := p.Start(t.Context(), id, "true")
	if err != nil {
		t.Fatal(err)
	}
	// Ended and reaped: its record is dropped once the group is empty.
	eventually(t, "the short command to end", func() bool {
		_, err := os.Stat(filepath.Join(p.base, id, metaDir, pgidDir, strconv.Itoa(done)))
		return processGone(done) && errors.Is(err, fs.ErrNotExist)
	})
	n, ships, err := p.StopStarted()
	if err != nil || n != 2 || ships != 0 {
		t.Fatalf("StopStarted = %d agents, %d shippers, %v; want 2 agents", n, ships, err)
	}
	for _, g := range live {
		eventually(t, "the group to die", func() bool { return processGone(g) })
	}
	if _, err := p.Start(t.Context(), id, "sleep 600"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after StopStarted: %v, want ErrClosed", err)
	}
	if n, ships, err := p.StopStarted(); err != nil || n != 0 || ships != 0 {
		t.Fatalf("second StopStarted = %d, %d, %v", n, ships, err)
	}
}
