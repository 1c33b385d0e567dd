package localprocess

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/envtest"
)

func newProvider(t *testing.T) *Provider {
	t.Helper()
	return New(filepath.Join(t.TempDir(), "sandboxes"))
}

func create(t *testing.T, p *Provider, name string) string {
	t.Helper()
	id, err := p.Create(t.Context(), contract.CreateInput{Name: name})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), id) })
	return id
}

// processGone reports whether pid no longer runs (absent, or a zombie nobody reaped yet).
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// eventually polls cond every 10 ms until it holds or the deadline passes.
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

func TestName(t *testing.T) {
	if got := newProvider(t).Name(); got != "local-process" {
		t.Fatalf("Name() = %q", got)
	}
}

func TestCreateMintsFreshIDPerCall(t *testing.T) {
	p := newProvider(t)
	a := create(t, p, "sk_abc")
	b := create(t, p, "sk_abc")
	if a == b {
		t.Fatalf("two creates with one name share id %s", a)
	}
	for _, id := range []string{a, b} {
		if !strings.HasPrefix(id, "sk_abc.") {
			t.Errorf("id %s lacks the <key>. prefix", id)
		}
		if fi, err := os.Stat(filepath.Join(p.BaseDir(), id)); err != nil || !fi.IsDir() {
			t.Errorf("sandbox dir of %s: %v", id, err)
		}
	}
}

func TestCreateRejectsBadNames(t *testing.T) {
	p := newProvider(t)
	for _, name := range []string{"", "a.b", "../x", "a/b", ".", "..", "x y", strings.Repeat("k", 129)} {
		_, err := p.Create(t.Context(), contract.CreateInput{Name: name})
		if !errors.Is(err, contract.ErrInvalid) {
			t.Errorf("create %q: err %v, want ErrInvalid", name, err)
		}
	}
	if entries, _ := os.ReadDir(p.BaseDir()); len(entries) != 0 {
		t.Errorf("rejected creates left %d entries", len(entries))
	}
}

func TestIDsValidatedStrictly(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, "sk_v")
	bad := []string{
		"", "x", "..", "../" + id, id + "/..", "/etc", "sk_v.0123456789ABCDEF", "sk_v.0123456789abcde",
		"sk_v.0123456789abcdef0", "sk.v.0123456789abcdef", ".0123456789abcdef", "sk_v.01234567/9abcdef",
	}
	ctx := t.Context()
	for _, b := range bad {
		checks := map[string]error{}
		checks["Resume"] = p.Resume(ctx, b)
		_, checks["Status"] = p.Status(ctx, b)
		checks["Destroy"] = p.Destroy(ctx, b)
		_, checks["Exec"] = p.Exec(ctx, b, "true")
		_, checks["Start"] = p.Start(ctx, b, "true")
		checks["Kill"] = p.Kill(ctx, b, 12345)
		_, checks["Snapshot"] = p.Snapshot(ctx, b, "")
		checks["SetEnv"] = p.SetEnv(ctx, b, nil)
		_, checks["Restore"] = p.Restore(ctx, contract.CreateInput{Name: "sk_v", SnapshotID: b})
		_, checks["Path"] = p.Path(b)
		for op, err := range checks {
			if !errors.Is(err, contract.ErrInvalid) || errors.Is(err, contract.ErrSandboxGone) {
				t.Errorf("%s(%q): err %v, want ErrInvalid", op, b, err)
			}
		}
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("the valid sandbox was harmed: %v", err)
	}
}

func TestLookupByPrefixNewestWins(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	if _, found, err := p.Lookup(ctx, "sk_k"); found || err != nil {
		t.Fatalf("lookup before any create (no base dir): found=%v err=%v", found, err)
	}
	first := create(t, p, "sk_k")
	second := create(t, p, "sk_k")
	other := create(t, p, "sk_k-2") // "sk_k-2." does not start with "sk_k."
	// Make the creation order unambiguous whatever the clock resolution.
	if err := os.WriteFile(filepath.Join(p.BaseDir(), first, metaDir, createdFile), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, found, err := p.Lookup(ctx, "sk_k")
	if err != nil || !found || got != second {
		t.Fatalf("lookup sk_k = %q %v %v, want newest %q", got, found, err, second)
	}
	if got, found, _ := p.Lookup(ctx, "sk_k-2"); !found || got != other {
		t.Fatalf("lookup sk_k-2 = %q %v, want %q", got, found, other)
	}
	if _, found, _ := p.Lookup(ctx, "sk_none"); found {
		t.Fatal("lookup of an unknown name found something")
	}
	if err := p.Destroy(ctx, second); err != nil {
		t.Fatal(err)
	}
	if got, found, _ := p.Lookup(ctx, "sk_k"); !found || got != first {
		t.Fatalf("after destroying the newest, lookup = %q %v, want %q", got, found, first)
	}
	if _, _, err := p.Lookup(ctx, "../sk_k"); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("lookup of a path: %v", err)
	}
}

func TestResumeAliveStoppedGone(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	id := create(t, p, "sk_r")

	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("resume alive: %v", err)
	}
	if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxAlive {
		t.Fatalf("status alive = %v %v", st, err)
	}

	if err := p.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	for range 2 { // Status never starts a stopped sandbox
		if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxStopped {
			t.Fatalf("status stopped = %v %v", st, err)
		}
	}
	if _, err := p.Exec(ctx, id, "true"); !errors.Is(err, ErrStopped) {
		t.Fatalf("exec in a stopped sandbox: %v", err)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("resume stopped: %v", err)
	}
	if st, _ := p.Status(ctx, id); st != contract.SandboxAlive {
		t.Fatalf("status after resume = %v", st)
	}
	if res, err := p.Exec(ctx, id, "echo ok"); err != nil || string(res.Stdout) != "ok\n" {
		t.Fatalf("exec after resume = %q %v", res.Stdout, err)
	}

	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx, id); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("resume gone: %v", err)
	}
	if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxGone {
		t.Fatalf("status gone = %v %v", st, err)
	}
	if err := p.Stop(ctx, id); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("stop gone: %v", err)
	}
	if _, err := p.Exec(ctx, id, "true"); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("exec gone: %v", err)
	}
	if _, err := p.Start(ctx, id, "true"); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("start gone: %v", err)
	}
	if err := p.SetEnv(ctx, id, map[string]string{"A": "1"}); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("setenv gone: %v", err)
	}
	if err := p.Kill(ctx, id, 4242); err != nil {
		t.Fatalf("kill in a gone sandbox: %v", err)
	}
}

func TestTransientErrorIsNotGone(t *testing.T) {
	ctx := t.Context()
	id := "sk_t.0123456789abcdef"
	check := func(t *testing.T, p *Provider) {
		t.Helper()
		if err := p.Resume(ctx, id); err == nil || errors.Is(err, contract.ErrSandboxGone) {
			t.Errorf("resume: %v, want a transient error", err)
		}
		if st, err := p.Status(ctx, id); err == nil || st == contract.SandboxGone {
			t.Errorf("status: %v %v, want a transient error", st, err)
		}
		if err := p.Destroy(ctx, id); err == nil {
			t.Error("destroy read an unreadable sandbox as already gone")
		}
		if _, err := p.Exec(ctx, id, "true"); err == nil || errors.Is(err, contract.ErrSandboxGone) {
			t.Errorf("exec: %v, want a transient error", err)
		}
	}
	t.Run("base dir is a file (ENOTDIR)", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		check(t, New(filepath.Join(file, "base")))
	})
	t.Run("symlink loop (ELOOP)", func(t *testing.T) {
		dir := t.TempDir()
		loop := filepath.Join(dir, "loop")
		if err := os.Symlink(loop, loop); err != nil {
			t.Fatal(err)
		}
		check(t, New(loop))
	})
	t.Run("permission denied (EACCES)", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root bypasses directory permissions; ENOTDIR and ELOOP cover transient errors")
		}
		base := filepath.Join(t.TempDir(), "base")
		if err := os.Mkdir(base, 0o000); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(base, 0o755) })
		check(t, New(base))
	})
}

func TestDestroyTwiceIsIdempotent(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	id := create(t, p, "sk_d")
	for i := range 2 {
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatalf("destroy #%d: %v", i+1, err)
		}
	}
	if entries, err := os.ReadDir(p.BaseDir()); err != nil || len(entries) != 0 {
		t.Fatalf("base dir after destroy: %v %v", entries, err)
	}
}

func TestDestroyFinishesAnInterruptedDestroy(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	id := create(t, p, "sk_i")
	pgid, err := p.Start(ctx, id, "sleep 300")
	if err != nil {
		t.Fatal(err)
	}
	// A destroy that crashed right after its rename: the sandbox is gone, the trash not.
	trash := filepath.Join(p.BaseDir(), destroyingPfx+id)
	if err := os.Rename(filepath.Join(p.BaseDir(), id), trash); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx, id); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("resume mid-destroy: %v", err)
	}
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the group to die", func() bool { return processGone(pgid) })
	if _, err := os.Lstat(trash); !os.IsNotExist(err) {
		t.Fatalf("trash left behind: %v", err)
	}
}

func TestDestroyKillsBackgroundGroups(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	id := create(t, p, "sk_bg")
	dir, _ := p.Path(id)
	// The real work is a grandchild of the started shell, as in an agent launcher.
	leader, err := p.Start(ctx, id, "( sleep 300 ) & echo $! > bg.pid; wait")
	if err != nil {
		t.Fatal(err)
	}
	// A background process left behind by a foreground Exec must be killed as well.
	res, err := p.Exec(ctx, id, "sleep 300 & echo $!")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	stray, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil {
		t.Fatalf("stray pid %q: %v", res.Stdout, err)
	}
	var bg int
	eventually(t, "bg.pid", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "bg.pid"))
		bg, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && bg > 0
	})
	for _, pid := range []int{leader, bg, stray} {
		if processGone(pid) {
			t.Fatalf("premise: process %d not running before destroy", pid)
		}
	}
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{leader, bg, stray} {
		eventually(t, "process "+strconv.Itoa(pid)+" to die", func() bool { return processGone(pid) })
	}
}

func TestStartReapsItsChild(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, "sk_z")
	pgid, err := p.Start(t.Context(), id, "exit 3")
	if err != nil {
		t.Fatal(err)
	}
	// Reaped: the /proc entry disappears entirely (a zombie would keep it).
	eventually(t, "the child to be reaped", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(pgid))
		return os.IsNotExist(err)
	})
	dir, _ := p.Path(id)
	eventually(t, "the record of an empty group to be dropped", func() bool {
		_, err := os.Stat(filepath.Join(dir, metaDir, pgidDir, strconv.Itoa(pgid)))
		return os.IsNotExist(err)
	})
}

func TestKillOnlyRecordedGroups(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	id := create(t, p, "sk_kill")
	pgid, err := p.Start(ctx, id, "sleep 300")
	if err != nil {
		t.Fatal(err)
	}
	if processGone(pgid) {
		t.Fatal("premise: started group not running")
	}
	if err := p.Kill(ctx, id, pgid); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the killed group to die", func() bool { return processGone(pgid) })
	if err := p.Kill(ctx, id, pgid); err != nil {
		t.Fatalf("second kill: %v", err)
	}

	// A group the sandbox never started is never signalled.
	outsider := exec.Command("sleep", "300")
	outsider.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := outsider.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outsider.Process.Kill(); _ = outsider.Wait() })
	if err := p.Kill(ctx, id, outsider.Process.Pid); err != nil {
		t.Fatalf("kill of an unrecorded group: %v", err)
	}
	if processGone(outsider.Process.Pid) {
		t.Fatal("Kill signalled a group the sandbox never started")
	}
	for _, bad := range []int{-5, 0, 1} {
		if err := p.Kill(ctx, id, bad); !errors.Is(err, contract.ErrInvalid) {
			t.Errorf("kill(%d): %v, want ErrInvalid", bad, err)
		}
	}
}

func TestExecCapturesOutputExitAndEnv(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	id, err := p.Create(ctx, contract.CreateInput{Name: "sk_x", Env: map[string]string{"FROM_CREATE": "c"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), id) })
	if err := p.SetEnv(ctx, id, map[string]string{"FROM_SETENV": "s p'a\"ce"}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(ctx, id, `pwd -P; printf '%s|%s\n' "$FROM_CREATE" "$FROM_SETENV"; echo oops >&2; exit 7`)
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := p.Path(id)
	real, _ := filepath.EvalSymlinks(dir)
	want := real + "\nc|s p'a\"ce\n"
	if string(res.Stdout) != want || string(res.Stderr) != "oops\n" || res.ExitCode != 7 {
		t.Fatalf("exec = %+v (stdout %q), want stdout %q stderr oops exit 7", res, res.Stdout, want)
	}
	if res, err := p.Exec(ctx, id, "kill -9 $$"); err != nil || res.ExitCode != 128+9 {
		t.Fatalf("self-killed shell: %+v %v, want exit 137", res, err)
	}
	if err := p.SetEnv(ctx, id, map[string]string{"A=B": "x"}); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("bad env name: %v", err)
	}

	// A cancelled ctx kills the command's group and Exec returns.
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := p.Exec(cctx, id, "echo $$ > exec.pid; sleep 300")
		errc <- err
	}()
	var pid int
	eventually(t, "exec.pid", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "exec.pid"))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled exec: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled exec did not return")
	}
	eventually(t, "the cancelled command to die", func() bool { return processGone(pid) })
}

// TestStartEnv: the providers' one StartEnv check (envtest), on local processes.
func TestStartEnv(t *testing.T) {
	p := newProvider(t)
	envtest.StartEnv(t.Context(), t, p, create(t, p, "sk_startenv"), nil)
}

func TestEnvIsPerSandbox(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	a := create(t, p, "sk_e")
	b := create(t, p, "sk_e")
	if err := p.SetEnv(ctx, a, map[string]string{"SECRET": "a"}); err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(ctx, b, `printf '%s' "${SECRET-unset}"`)
	if err != nil || string(res.Stdout) != "unset" {
		t.Fatalf("env leaked across sandboxes: %q %v", res.Stdout, err)
	}
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	id := create(t, p, "sk_s")
	sleeper, err := p.Start(ctx, id, "sleep 300") // a recorded group: must not travel
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Exec(ctx, id, "mkdir -p sub && printf one > sub/a && printf '#!/bin/sh\\n' > run.sh && chmod 750 run.sh && ln -s sub/a link"); err != nil || res.ExitCode != 0 {
		t.Fatalf("populate: %v %+v", err, res)
	}
	recorded := "test -e .sandkeep/pgid/" + strconv.Itoa(sleeper) + " && echo recorded || echo clean"
	if res, _ := p.Exec(ctx, id, recorded); string(res.Stdout) != "recorded\n" {
		t.Fatalf("premise: the started group is not recorded: %q", res.Stdout)
	}
	snap, err := p.Snapshot(ctx, id, "after-setup")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Exec(ctx, id, "printf two > sub/a && rm run.sh"); err != nil || res.ExitCode != 0 {
		t.Fatalf("modify: %v %+v", err, res)
	}

	for _, restore := range []func() (string, error){
		func() (string, error) { return p.Restore(ctx, contract.CreateInput{Name: "sk_s", SnapshotID: snap}) },
		func() (string, error) { return p.Create(ctx, contract.CreateInput{Name: "sk_s", SnapshotID: snap}) },
	} {
		rid, err := restore()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Destroy(context.Background(), rid) })
		if rid == id || !strings.HasPrefix(rid, "sk_s.") {
			t.Fatalf("restored id %q", rid)
		}
		res, err := p.Exec(ctx, rid, "cat sub/a; echo; cat link; echo; stat -c %a run.sh; "+recorded)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(res.Stdout), "one\none\n750\nclean\n"; got != want {
			t.Fatalf("restored contents %q, want %q", got, want)
		}
	}
	if res, _ := p.Exec(ctx, id, "cat sub/a"); string(res.Stdout) != "two" {
		t.Fatalf("original changed by restore: %q", res.Stdout)
	}

	if err := p.DeleteSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Restore(ctx, contract.CreateInput{Name: "sk_s", SnapshotID: snap}); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("restore of a deleted snapshot: %v", err)
	}
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Snapshot(ctx, id, ""); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("snapshot of a gone sandbox: %v", err)
	}
}

func TestConcurrentCreatesAndDestroys(t *testing.T) {
	p := newProvider(t)
	ctx := t.Context()
	const n = 16
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id, err := p.Create(ctx, contract.CreateInput{Name: "sk_c"})
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("id %s minted twice", id)
		}
		seen[id] = true
	}
	got, found, err := p.Lookup(ctx, "sk_c")
	if err != nil || !found || !seen[got] {
		t.Fatalf("lookup = %q %v %v", got, found, err)
	}

	// Racing destroys of one sandbox with a running group: all succeed, the group dies,
	// nothing is left behind.
	victim := ids[0]
	pgid, err := p.Start(ctx, victim, "sleep 300")
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		wg.Go(func() {
			if err := p.Destroy(ctx, victim); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	eventually(t, "the group to die", func() bool { return processGone(pgid) })
	for _, id := range ids[1:] {
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if entries, err := os.ReadDir(p.BaseDir()); err != nil || len(entries) != 0 {
		t.Fatalf("left behind: %v %v", entries, err)
	}
}

func TestBaseEnvReplacesInheritedEnvironment(t *testing.T) {
	p := New(filepath.Join(t.TempDir(), "b"), WithBaseEnv([]string{"PATH=/usr/bin:/bin", "ONLY=1"}))
	id := create(t, p, "sk_env")
	res, err := p.Exec(t.Context(), id, `printf '%s|%s' "${HOME-unset}" "$ONLY"`)
	if err != nil || string(res.Stdout) != "unset|1" {
		t.Fatalf("env = %q %v, want unset|1", res.Stdout, err)
	}
}
