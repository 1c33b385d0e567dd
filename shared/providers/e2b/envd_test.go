package e2b

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/e2b/internal/e2bfake"
	"github.com/sandkeep/sandkeep/shared/testkit/envtest"
)

// eventually polls cond until it holds or a deadline passes (the condition is a real
// process's state: no signal exists to wait on).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sessionOf reads a process's session id from /proc (field 6 of stat).
func sessionOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 4 {
		return 0, errors.New("short stat")
	}
	return strconv.Atoi(fields[3])
}

func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func TestExec(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_x", Env: map[string]string{"FROM_CREATE": "c1"}})
	res, err := p.Exec(ctx, id, `printf out; printf err >&2; exit 3`)
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 || string(res.Stdout) != "out" || string(res.Stderr) != "err" {
		t.Fatalf("exec = %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res, err := p.Exec(ctx, id, `true`); err != nil || res.ExitCode != 0 || len(res.Stdout) != 0 {
		t.Fatalf("true = %+v %v", res, err)
	}
	if res, err := p.Exec(ctx, id, `kill -TERM $$`); err != nil || res.ExitCode != 128+15 {
		t.Fatalf("a shell killed by SIGTERM = %+v %v; want 143", res, err)
	}
	// Binary output and a long stream arrive whole and in order.
	res, err = p.Exec(ctx, id, `head -c 300000 /dev/zero | tr '\0' 'a'; printf '\001\377'`)
	if err != nil || len(res.Stdout) != 300002 || res.Stdout[300001] != 0xff || strings.Trim(string(res.Stdout[:300000]), "a") != "" {
		t.Fatalf("long output: %d bytes, %v", len(res.Stdout), err)
	}
	// Env: from Create, then SetEnv merges; passed on every start.
	if err := p.SetEnv(ctx, id, map[string]string{"FOO": "bar baz", "FROM_CREATE": "c2"}); err != nil {
		t.Fatal(err)
	}
	res, err = p.Exec(ctx, id, `printf '%s|%s' "$FOO" "$FROM_CREATE"`)
	if err != nil || string(res.Stdout) != "bar baz|c2" {
		t.Fatalf("env = %q %v", res.Stdout, err)
	}
	if err := p.SetEnv(ctx, id, map[string]string{"A=B": "x"}); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("bad env name: %v", err)
	}
	// Output cap.
	small := f.provider(func(c *Config) { c.MaxOutput = 1000 })
	if _, err := small.Exec(ctx, id, `head -c 5000 /dev/zero`); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("over the cap: %v", err)
	}
}

func TestStartAndKill(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_bg"})
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The journal launcher's pattern: the script records $$ as the agent's group.
	pgid, err := p.Start(ctx, id, "echo $$ > "+quote(pidFile)+"\nsleep 300\n")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	if got, err := syscall.Getpgid(pgid); err != nil || got != pgid {
		t.Fatalf("Getpgid(%d) = %d %v; want a group leader", pgid, got, err)
	}
	if sid, err := sessionOf(pgid); err != nil || sid != pgid {
		t.Fatalf("session of %d = %d %v; want its own session", pgid, sid, err)
	}
	eventually(t, "the pid file", func() bool {
		b, err := os.ReadFile(pidFile)
		return err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(pgid)
	})
	// The Start call returned while the command runs on.
	if !groupAlive(pgid) {
		t.Fatal("the background group died with its launcher")
	}
	if err := p.Kill(ctx, id, pgid); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the group to die", func() bool {
		// A zombie leader still counts for kill(2) until reaped by its parent (init
		// here, since setsid detached it); its state says it is dead.
		if !groupAlive(pgid) {
			return true
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pgid) + "/stat")
		return err != nil || strings.Contains(string(b), ") Z ")
	})
	if err := p.Kill(ctx, id, pgid); err != nil {
		t.Fatalf("killing a gone group = %v, want nil", err)
	}
	if err := p.Kill(ctx, id, 1); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("pgid 1: %v", err)
	}
}

func TestExecGoneOrPaused(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_g"})
	// A client that has never seen the sandbox reads it first.
	fresh := f.provider()
	f.SetState(id, "paused")
	if _, err := fresh.Exec(ctx, id, "true"); !errors.Is(err, ErrStopped) || errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("exec in a paused sandbox (fresh client) = %v, want ErrStopped", err)
	}
	// A client with the sandbox cached meets the proxy's 502 and asks the control plane.
	if _, err := p.Exec(ctx, id, "true"); !errors.Is(err, ErrStopped) {
		t.Fatalf("exec in a paused sandbox (cached) = %v, want ErrStopped", err)
	}
	if b, _ := f.Box(id); b.State != "paused" || f.Count("connectSandbox") != 0 {
		t.Fatal("Exec resumed a paused sandbox")
	}
	f.SetState(id, "running")
	if err := fresh.SetEnv(ctx, id, map[string]string{"K": "v"}); err != nil {
		t.Fatal(err)
	}
	if res, err := fresh.Exec(ctx, id, `printf %s "$K"`); err != nil || string(res.Stdout) != "v" {
		t.Fatalf("fresh client exec = %q %v", res.Stdout, err)
	}
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Provider{"cached": fresh, "fresh": f.provider()} {
		if _, err := c.Exec(ctx, id, "true"); !errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("%s: exec in a killed sandbox = %v, want ErrSandboxGone", name, err)
		}
		if _, err := c.Start(ctx, id, "true"); !errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("%s: start in a killed sandbox = %v", name, err)
		}
	}
	if err := f.provider().SetEnv(ctx, id, map[string]string{"K": "v"}); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("SetEnv on a killed sandbox = %v", err)
	}
}

func TestEnvdRetries(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_e"})
	f.Inject("envd", e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 429})
	before := f.Count("envd")
	res, err := p.Exec(ctx, id, "printf ok")
	if err != nil || string(res.Stdout) != "ok" {
		t.Fatalf("exec after refusals = %q %v", res.Stdout, err)
	}
	if n := f.Count("envd") - before; n != 3 {
		t.Fatalf("envd calls = %d, want 3 (two refused, one run)", n)
	}
	// A stale access token is read again once.
	p.mu.Lock()
	p.conns[id].token = "stale"
	p.mu.Unlock()
	if res, err := p.Exec(ctx, id, "printf ok"); err != nil || string(res.Stdout) != "ok" {
		t.Fatalf("exec with a stale token = %q %v", res.Stdout, err)
	}
}

func TestExecKeepsSandboxAlive(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_k"})
	before := f.Count("setSandboxTimeout")
	if _, err := p.Exec(ctx, id, "true"); err != nil {
		t.Fatal(err)
	}
	if f.Count("setSandboxTimeout") != before {
		t.Fatal("refreshed right after create")
	}
	p.mu.Lock()
	p.conns[id].refreshed = time.Now().Add(-p.Lifetime() / 2)
	p.mu.Unlock()
	f.SetEnd(id, time.Now().Add(time.Minute))
	if _, err := p.Exec(ctx, id, "true"); err != nil {
		t.Fatal(err)
	}
	if b, _ := f.Box(id); f.Count("setSandboxTimeout") != before+1 || time.Until(b.End) < p.Lifetime()/2 {
		t.Fatalf("an Exec a quarter-lifetime after the last refresh did not refresh (ends in %s)", time.Until(b.End))
	}
}

func TestEnvdStreamFailures(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_sf"})
	cases := []struct {
		mode string
		want string
	}{
		{"truncate", "truncated"},
		{"end-error", "internal"},
	}
	for _, tc := range cases {
		before := f.Count("envd")
		f.Inject("envd", e2bfake.Fault{Envd: tc.mode})
		res, err := p.Exec(ctx, id, "printf whole")
		if err == nil || errors.Is(err, contract.ErrSandboxGone) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: Exec = %+v, %v; want an error mentioning %q, never a partial result", tc.mode, res, err, tc.want)
		}
		// The process may have started: the call is not repeated.
		if n := f.Count("envd") - before; n != 1 {
			t.Fatalf("%s: envd calls = %d, want 1", tc.mode, n)
		}
	}
	if res, err := p.Exec(ctx, id, "printf whole"); err != nil || string(res.Stdout) != "whole" {
		t.Fatalf("after the failures: %q %v", res.Stdout, err)
	}
}

// TestStartEnv: a process's own variables reach it beside the sandbox's, a later process
// does not see them, and a bad name is refused before anything runs.
func TestStartEnv(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	envtest.StartEnv(ctx, t, p, mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_startenv"}), nil)
}
