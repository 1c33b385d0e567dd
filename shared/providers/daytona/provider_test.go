package daytona_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/daytona"
	"github.com/sandkeep/sandkeep/shared/testkit/envtest"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

const testKey = "test-api-key-0123456789"

// syncBuffer is a goroutine-safe log sink.
type syncBuffer = syncbuf.Buffer

// newProvider returns a provider on the fake with fast polling and retries, logging at
// debug level into the returned buffer.
func newProvider(t *testing.T, f *fakeDaytona, mods ...func(*daytona.Config)) (*daytona.Provider, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	cfg := daytona.Config{
		APIKey:         f.apiKey,
		BaseURL:        f.URL(),
		Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		PollInterval:   time.Millisecond,
		RetryBase:      time.Millisecond,
		RetryMax:       5 * time.Millisecond,
		RequestTimeout: 5 * time.Second,
	}
	for _, m := range mods {
		m(&cfg)
	}
	p, err := daytona.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, logs
}

// ctxFor bounds a test's calls (generously: timing never decides a verdict).
func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustCreate(t *testing.T, p *daytona.Provider, key string) string {
	t.Helper()
	id, err := p.Create(ctxFor(t), contract.CreateInput{Name: key})
	if err != nil {
		t.Fatalf("create %s: %v", key, err)
	}
	return id
}

func TestCreate(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id, err := p.Create(ctx, contract.CreateInput{Name: "sk_key1", Env: map[string]string{"TOKEN": "secret-value-1"}})
	if err != nil {
		t.Fatal(err)
	}
	live := f.live()
	if len(live) != 1 || live[0].ID != id {
		t.Fatalf("live sandboxes %+v, want exactly %s", live, id)
	}
	sb := live[0]
	if !strings.HasPrefix(sb.Name, "sk_key1-") || sb.Labels[daytona.KeyLabel] != "sk_key1" {
		t.Fatalf("name %q labels %v", sb.Name, sb.Labels)
	}
	if sb.State != "started" || sb.AutoStop != 0 {
		t.Fatalf("state %s autostop %d, want started and 0", sb.State, sb.AutoStop)
	}
	for _, b := range f.bodies {
		if strings.Contains(b, "secret-value-1") && !strings.Contains(b, `"envs"`) {
			t.Fatalf("a secret left in a non-command request: %s", b)
		}
	}
	// A second create of the same key is a second, fresh sandbox (a name is not an identity).
	id2 := mustCreate(t, p, "sk_key1")
	if id2 == id || len(f.live()) != 2 {
		t.Fatalf("second create: %s (first %s), live %d", id2, id, len(f.live()))
	}
}

func TestResume(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_resume")
	startPath := "/api/sandbox/" + id + "/start"

	t.Run("running", func(t *testing.T) {
		if err := p.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		if n := f.count("POST", startPath); n != 0 {
			t.Fatalf("a running sandbox got %d start calls", n)
		}
	})
	for _, st := range []string{"stopped", "archived", "stopping"} {
		t.Run(st, func(t *testing.T) {
			f.set(id, st)
			if st == "stopping" {
				f.mu.Lock()
				f.transition(f.sandboxes[id], "stopping", "stopped")
				f.mu.Unlock()
			}
			before := f.count("POST", startPath)
			if err := p.Resume(ctx, id); err != nil {
				t.Fatal(err)
			}
			if got := f.state(id); got != "started" {
				t.Fatalf("state after resume: %s", got)
			}
			if n := f.count("POST", startPath) - before; n != 1 {
				t.Fatalf("start calls: %d, want 1", n)
			}
		})
	}
	t.Run("transient states are not gone", func(t *testing.T) {
		for _, st := range []string{"error", "build_failed", "unknown", "some_new_state"} {
			f.set(id, st)
			err := p.Resume(ctx, id)
			if err == nil || errors.Is(err, contract.ErrSandboxGone) || !errors.Is(err, daytona.ErrTransient) {
				t.Fatalf("%s: %v, want a transient error", st, err)
			}
		}
		f.set(id, "started")
	})
	t.Run("deleted", func(t *testing.T) {
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		// Destroying (desired state destroyed), then destroyed (404): both gone.
		for i := 0; i < 2; i++ {
			if err := p.Resume(ctx, id); !errors.Is(err, contract.ErrSandboxGone) {
				t.Fatalf("read %d: %v, want ErrSandboxGone", i, err)
			}
		}
		if err := p.Resume(ctx, "no-such-sandbox"); !errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("unknown id: %v", err)
		}
	})
}

func TestResumeWaitsWithinDeadline(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f, func(c *daytona.Config) { c.PollInterval = 5 * time.Millisecond })
	id := mustCreate(t, p, "sk_slow")
	f.set(id, "stopped")
	f.mu.Lock()
	f.steps = 1 << 30 // "starting" never ends
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := p.Resume(ctx, id)
	if err == nil || errors.Is(err, contract.ErrSandboxGone) || !errors.Is(err, daytona.ErrTransient) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("resume of a sandbox that never starts: %v", err)
	}
	if !strings.Contains(err.Error(), "starting") {
		t.Fatalf("error does not name the state: %v", err)
	}
}

func TestStatusNeverStarts(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_status")
	cases := []struct {
		state string
		want  contract.SandboxStatus
	}{{"started", contract.SandboxAlive}, {"stopped", contract.SandboxStopped}, {"archived", contract.SandboxArchived}, {"archiving", contract.SandboxArchived}, {"stopping", contract.SandboxStopped}}
	for _, c := range cases {
		f.set(id, c.state)
		got, err := p.Status(ctx, id)
		if err != nil || got != c.want {
			t.Fatalf("%s: %v %v, want %v", c.state, got, err, c.want)
		}
		if f.state(id) != c.state {
			t.Fatalf("status changed the state %s → %s", c.state, f.state(id))
		}
	}
	if n := f.count("POST", "/api/sandbox/"+id+"/start"); n != 0 {
		t.Fatalf("status sent %d start calls", n)
	}
	for _, st := range []string{"error", "unknown", "starting", "snapshotting"} {
		f.set(id, st)
		if got, err := p.Status(ctx, id); err == nil || got == contract.SandboxGone || errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("%s: %v %v, want a transient error", st, got, err)
		}
	}
	f.set(id, "started")
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // destroying, then 404
		if got, err := p.Status(ctx, id); err != nil || got != contract.SandboxGone {
			t.Fatalf("after destroy (read %d): %v %v", i, got, err)
		}
	}
}

func TestSnapshotAndRestore(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_snap")
	snap, err := p.Snapshot(ctx, id, "After Setup!")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(snap, "sandkeep-") || !strings.Contains(snap, "after-setup") {
		t.Fatalf("snapshot name %q", snap)
	}
	if f.state(id) != "started" {
		t.Fatalf("snapshot left the sandbox %s", f.state(id))
	}
	rid, err := p.Restore(ctx, contract.CreateInput{Name: "sk_snap", SnapshotID: snap})
	if err != nil {
		t.Fatal(err)
	}
	if rid == id {
		t.Fatal("restore returned the source sandbox")
	}
	if got := f.sandbox(rid); got.Snapshot != snap || got.State != "started" || got.Labels[daytona.KeyLabel] != "sk_snap" {
		t.Fatalf("restored sandbox %+v", got)
	}
	if _, err := p.Restore(ctx, contract.CreateInput{Name: "sk_snap", SnapshotID: "sandkeep-vanished"}); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("restore from a missing snapshot: %v, want ErrSandboxGone", err)
	}
	if _, err := p.Snapshot(ctx, "no-such-sandbox", "x"); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("snapshot of a missing sandbox: %v", err)
	}
	// A superseded snapshot is deleted by name (looked up, deleted by id); twice is fine.
	for i := 0; i < 2; i++ {
		if err := p.DeleteSnapshot(ctx, snap); err != nil {
			t.Fatalf("delete snapshot %d: %v", i, err)
		}
	}
	if _, err := p.Restore(ctx, contract.CreateInput{Name: "sk_snap", SnapshotID: snap}); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("restore from a deleted snapshot: %v, want ErrSandboxGone", err)
	}
}

func TestDestroyTwice(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_destroy")
	for i := 0; i < 2; i++ {
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatalf("destroy %d: %v", i, err)
		}
	}
	if len(f.live()) != 0 {
		t.Fatal("sandbox still live")
	}
	if n := f.count("DELETE", "/api/sandbox/"+id); n != 2 {
		t.Fatalf("DELETE calls %d, want 2 (the second answered 404)", n)
	}
	// A delete refused while a state change is pending is retried once it settles.
	id2 := mustCreate(t, p, "sk_destroy")
	f.set(id2, "stopped")
	f.mu.Lock()
	f.transition(f.sandboxes[id2], "starting", "started")
	f.mu.Unlock()
	if err := p.Destroy(ctx, id2); err != nil {
		t.Fatal(err)
	}
	if n := f.count("DELETE", "/api/sandbox/"+id2); n != 2 {
		t.Fatalf("DELETE calls %d, want 2 (409, then accepted)", n)
	}
}

func TestUnauthorized(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f, func(c *daytona.Config) { c.APIKey = "wrong-key-abcdef" })
	ctx := ctxFor(t)
	_, err := p.Create(ctx, contract.CreateInput{Name: "sk_auth"})
	if !errors.Is(err, daytona.ErrAuth) || !errors.Is(err, daytona.ErrConfig) || errors.Is(err, daytona.ErrTransient) {
		t.Fatalf("create with a bad key: %v", err)
	}
	if !strings.HasPrefix(err.Error(), "daytona: API key rejected (401)") {
		t.Fatalf("message %q", err.Error())
	}
	if err := p.Resume(ctx, "some-id"); !errors.Is(err, daytona.ErrAuth) || errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("resume with a bad key: %v", err)
	}
	if n := f.total(); n != 2 {
		t.Fatalf("requests %d, want 2 (a rejected key is never retried)", n)
	}
	if strings.Contains(err.Error(), "wrong-key-abcdef") {
		t.Fatal("the key is in the error")
	}
}

func TestThrottledThenSuccess(t *testing.T) {
	f := newFake(t, testKey)
	p, logs := newProvider(t, f)
	ctx := ctxFor(t)
	f.inject(fault{method: "POST", prefix: "/sandbox", status: 429, retryAfter: "0", times: 2})
	id := mustCreate(t, p, "sk_429")
	if f.created != 1 || len(f.live()) != 1 {
		t.Fatalf("created %d live %d, want 1", f.created, len(f.live()))
	}
	if n := f.count("POST", "/api/sandbox"); n < 3 {
		t.Fatalf("create requests %d, want 3 (two throttled)", n)
	}
	f.inject(fault{method: "GET", prefix: "/sandbox/" + id, status: 503, times: 2})
	if err := p.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "daytona: retrying") {
		t.Fatal("retries were not logged")
	}
	// Throttled past the deadline: a transient error, never gone.
	f.inject(fault{method: "GET", prefix: "/sandbox/" + id, status: 429})
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err := p.Resume(sctx, id)
	if !errors.Is(err, daytona.ErrTransient) || errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("persistently throttled resume: %v", err)
	}
}

func TestCreateAmbiguousFailureNoSecondSandbox(t *testing.T) {
	cases := []struct {
		name  string
		fault fault
	}{
		{"500 after creating", fault{method: "POST", prefix: "/sandbox", status: 500, after: true, times: 1}},
		{"500 before creating", fault{method: "POST", prefix: "/sandbox", status: 500, times: 1}},
		{"502 after creating, twice", fault{method: "POST", prefix: "/sandbox", status: 502, after: true, times: 2}},
		{"timeout after creating", fault{method: "POST", prefix: "/sandbox", after: true, hang: true, times: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, testKey)
			p, _ := newProvider(t, f, func(cfg *daytona.Config) { cfg.RequestTimeout = 300 * time.Millisecond })
			f.inject(c.fault)
			id := mustCreate(t, p, "sk_amb")
			live := f.live()
			if f.created != 1 || len(live) != 1 || live[0].ID != id {
				t.Fatalf("created %d, live %d (want exactly the returned %s)", f.created, len(live), id)
			}
			// The outcome was read by name before anything was resent.
			if n := f.count("GET", "/api/sandbox/sk_amb-"); n < 1 {
				t.Fatal("no read by name after the ambiguous failure")
			}
		})
	}
}

func TestTimeouts(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f, func(c *daytona.Config) { c.RequestTimeout = 200 * time.Millisecond })
	id := mustCreate(t, p, "sk_timeout")
	// One hung read: the attempt times out and the retry answers.
	f.inject(fault{method: "GET", prefix: "/sandbox/" + id, hang: true, times: 1})
	if err := p.Resume(ctxFor(t), id); err != nil {
		t.Fatalf("resume after one hung read: %v", err)
	}
	// Every read hangs: the caller's deadline ends it with a transient error, never gone.
	f.inject(fault{method: "GET", prefix: "/sandbox/" + id, hang: true})
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	for _, call := range []func() error{
		func() error { return p.Resume(ctx, id) },
		func() error { _, err := p.Status(ctx, id); return err },
	} {
		err := call()
		if err == nil || errors.Is(err, contract.ErrSandboxGone) || !errors.Is(err, daytona.ErrTransient) {
			t.Fatalf("hung service: %v, want a transient error", err)
		}
	}
}

func TestLookup(t *testing.T) {
	f := newFake(t, testKey)
	f.pageSize = 1 // every page holds one sandbox: Lookup must follow the cursor
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	a := mustCreate(t, p, "sk_a")
	b := mustCreate(t, p, "sk_b")
	mustCreate(t, p, "sk_c")
	for key, want := range map[string]string{"sk_a": a, "sk_b": b} {
		got, found, err := p.Lookup(ctx, key)
		if err != nil || !found || got != want {
			t.Fatalf("lookup %s: %s %v %v, want %s", key, got, found, err, want)
		}
	}
	if _, found, err := p.Lookup(ctx, "sk_none"); found || err != nil {
		t.Fatalf("lookup of an unknown key: %v %v", found, err)
	}
	if err := p.Destroy(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, found, err := p.Lookup(ctx, "sk_a"); found || err != nil {
		t.Fatalf("lookup after destroy: %v %v", found, err)
	}
	// A healthy sandbox wins over a failed one of the same key.
	bad := mustCreate(t, p, "sk_b")
	f.set(b, "error")
	if got, _, _ := p.Lookup(ctx, "sk_b"); got != bad {
		t.Fatalf("lookup preferred %s over the healthy %s", got, bad)
	}
	if _, _, err := p.Lookup(ctx, "bad/key"); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("malformed key: %v", err)
	}
}

// procState returns the state letter and process group of pid from /proc ("" = gone).
func procState(t *testing.T, pid int) (string, int) {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	pgrp, _ := strconv.Atoi(fields[2])
	return fields[0], pgrp
}

func TestExecStartKill(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_exec")

	res, err := p.Exec(ctx, id, "echo out; echo err >&2; printf '\\377\\000x'; exit 7")
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 7 || string(res.Stdout) != "out\n\xff\x00x" || string(res.Stderr) != "err\n" {
		t.Fatalf("exec: %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	hostile := `it's "quoted" $(not run) ; ` + "`nor this`"
	res, err = p.Exec(ctx, id, "printf %s "+shQuote(hostile))
	if err != nil || string(res.Stdout) != hostile {
		t.Fatalf("quoting: %q %v", res.Stdout, err)
	}
	if err := p.SetEnv(ctx, id, map[string]string{"SECRET_TOKEN": "s3cret-token-value"}); err != nil {
		t.Fatal(err)
	}
	res, err = p.Exec(ctx, id, `printf %s "$SECRET_TOKEN"`)
	if err != nil || string(res.Stdout) != "s3cret-token-value" {
		t.Fatalf("env: %q %v", res.Stdout, err)
	}
	f.mu.Lock()
	lastEnv := f.lastEnv[len(f.lastEnv)-1]
	f.mu.Unlock()
	if lastEnv["SECRET_TOKEN"] != "s3cret-token-value" {
		t.Fatalf("the secret did not travel as an env: %v", lastEnv)
	}

	pgid, err := p.Start(ctx, id, "sleep 300")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill(context.WithoutCancel(ctx), id, pgid) })
	st, grp := procState(t, pgid)
	if st == "" || st == "Z" || grp != pgid {
		t.Fatalf("started process %d: state %q group %d, want a live group leader", pgid, st, grp)
	}
	if err := p.Kill(ctx, id, pgid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, _ := procState(t, pgid); st == "" || st == "Z" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process group %d survived Kill", pgid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Kill(ctx, id, pgid); err != nil {
		t.Fatalf("killing a gone group: %v", err)
	}
	if err := p.Kill(ctx, id, 1); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("kill 1: %v", err)
	}

	f.set(id, "stopped")
	if _, err := p.Exec(ctx, id, "true"); !errors.Is(err, daytona.ErrNotStarted) || errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("exec in a stopped sandbox: %v", err)
	}
	f.set(id, "started")
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, id, "true"); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("exec in a destroyed sandbox: %v", err)
	}
}

func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func TestSecretsNeverLeak(t *testing.T) {
	const canaryKey = "canary-api-key-7f3a9b"
	const canarySecret = "canary-secret-c0ffee"
	f := newFake(t, canaryKey)
	p, logs := newProvider(t, f, func(c *daytona.Config) { c.RequestTimeout = 300 * time.Millisecond })
	ctx := ctxFor(t)
	var errs []error
	id, err := p.Create(ctx, contract.CreateInput{Name: "sk_canary", Env: map[string]string{"API_TOKEN": canarySecret}})
	if err != nil {
		t.Fatal(err)
	}
	// A server that echoes credentials and secrets back in its error messages.
	echo := "rejected token " + canaryKey + " and env " + canarySecret
	f.inject(fault{method: "GET", prefix: "/sandbox/" + id, status: 400, message: echo, times: 1})
	errs = append(errs, p.Resume(ctx, id))
	f.inject(fault{method: "POST", prefix: "/toolbox/", status: 500, message: echo, times: 1})
	_, err = p.Exec(ctx, id, "true")
	errs = append(errs, err)
	f.inject(fault{method: "POST", prefix: "/sandbox", status: 500, message: strings.Repeat("x", 290) + echo})
	_, err = p.Create(ctx, contract.CreateInput{Name: "sk_canary2", Env: map[string]string{"API_TOKEN": canarySecret}})
	errs = append(errs, err)
	bad, _ := newProvider(t, f, func(c *daytona.Config) { c.APIKey = canaryKey + "-wrong" })
	errs = append(errs, bad.Resume(ctx, id))
	_, err = daytona.New(daytona.Config{APIKey: canaryKey, BaseURL: "ftp://" + canaryKey})
	errs = append(errs, err)
	seen := 0
	for _, e := range errs {
		if e == nil {
			t.Fatal("an injected failure did not fail")
		}
		seen++
		for _, c := range []string{canaryKey, canarySecret} {
			if strings.Contains(e.Error(), c) {
				t.Fatalf("canary %q in error: %v", c, e)
			}
		}
	}
	if !strings.Contains(errs[0].Error(), "[redacted]") {
		t.Fatalf("the echoed message was not redacted: %v", errs[0])
	}
	for _, c := range []string{canaryKey, canarySecret} {
		if strings.Contains(logs.String(), c) {
			t.Fatalf("canary %q in the logs", c)
		}
	}
	if seen != 5 || logs.String() == "" {
		t.Fatalf("checked %d errors, %d log bytes", seen, len(logs.String()))
	}
}

func TestAutoStop(t *testing.T) {
	f := newFake(t, testKey)
	base := daytona.Config{APIKey: testKey, BaseURL: f.URL()}
	bad := []daytona.Config{
		{},
		{APIKey: testKey, BaseURL: "not a url"},
		{APIKey: testKey, AutoStop: 15 * time.Minute},
		{APIKey: testKey, AutoStop: 30 * time.Minute, DetachedTTL: 30 * time.Minute, SweepPeriod: 5 * time.Minute},
		{APIKey: testKey, AutoStop: -time.Minute},
	}
	for i, c := range bad {
		if _, err := daytona.New(c); !errors.Is(err, contract.ErrInvalid) {
			t.Fatalf("config %d accepted: %v", i, err)
		}
	}
	ctx := ctxFor(t)
	p, _ := newProvider(t, f, func(c *daytona.Config) {
		c.AutoStop, c.DetachedTTL, c.SweepPeriod = 90*time.Second+40*time.Minute, 30*time.Minute, 5*time.Minute
	})
	id := mustCreate(t, p, "sk_autostop")
	if got := f.sandbox(id).AutoStop; got != 42 {
		t.Fatalf("auto-stop at create: %d, want 42 (rounded up)", got)
	}
	// Daytona (or a person) shortened it: Resume puts it back.
	f.mu.Lock()
	f.sandboxes[id].AutoStop = 15
	f.mu.Unlock()
	if err := p.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := f.sandbox(id).AutoStop; got != 42 {
		t.Fatalf("auto-stop after resume: %d, want 42", got)
	}
	// The default provider disables auto-stop and corrects a sandbox that has it.
	d, err := daytona.New(base)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := f.sandbox(id).AutoStop; got != 0 {
		t.Fatalf("auto-stop after a default resume: %d, want 0", got)
	}
	n := f.count("POST", "/api/sandbox/"+id+"/autostop/")
	if err := d.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if f.count("POST", "/api/sandbox/"+id+"/autostop/") != n {
		t.Fatal("a correct interval was set again")
	}
}

// TestContractDocuments proves the tests' traffic was validated against the subset and,
// when available, the published documents.
func TestContractDocuments(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_docs")
	if _, err := p.Exec(ctx, id, "true"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Lookup(ctx, "sk_docs"); err != nil {
		t.Fatal(err)
	}
	// The lifecycle's calls (docs/design.md §2.5): stop, the state read, start.
	if err := p.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if f.count("POST", "/api/sandbox/"+id+"/stop") != 1 || f.count("POST", "/api/sandbox/"+id+"/start") != 1 {
		t.Fatal("the stop and start calls did not reach the fake")
	}
	for _, u := range docs.used {
		t.Logf("openapi: %s", u)
	}
	checked := f.val.Checked()
	for _, d := range loadDocs(t) {
		if checked[d.name] == 0 {
			t.Fatalf("%s validated nothing", d.name)
		}
		t.Logf("%s: %d exchanges validated", d.name, checked[d.name])
	}
}

func TestRetriesAreBounded(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f, func(c *daytona.Config) { c.MaxAttempts = 4 })
	id := mustCreate(t, p, "sk_bounded")
	f.inject(fault{method: "GET", prefix: "/sandbox/" + id, status: 500})
	// No deadline at all: MaxAttempts still ends it, with a transient error.
	before := f.count("GET", "/api/sandbox/"+id)
	_, err := p.Status(t.Context(), id)
	if !errors.Is(err, daytona.ErrTransient) || errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("persistent 500: %v", err)
	}
	if n := f.count("GET", "/api/sandbox/"+id) - before; n != 4 {
		t.Fatalf("attempts %d, want 4", n)
	}
	if !strings.Contains(err.Error(), "after 4 attempts") {
		t.Fatalf("error does not say how often it tried: %v", err)
	}
}

func TestCreateRejectedIsConfig(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f, func(c *daytona.Config) { c.Snapshot = "no-such-base-image" })
	_, err := p.Create(ctxFor(t), contract.CreateInput{Name: "sk_cfg"})
	if !errors.Is(err, daytona.ErrConfig) || errors.Is(err, contract.ErrSandboxGone) || errors.Is(err, daytona.ErrTransient) {
		t.Fatalf("create from a missing base snapshot: %v", err)
	}
	if f.count("POST", "/api/sandbox") != 1 || f.created != 0 {
		t.Fatalf("a rejected create was resent (%d requests)", f.count("POST", "/api/sandbox"))
	}
}

func TestKillInStoppedSandbox(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_killstopped")
	f.set(id, "stopped")
	if err := p.Kill(ctx, id, 4242); err != nil {
		t.Fatalf("kill in a stopped sandbox: %v (no process survives a stop)", err)
	}
	// The same through a provider that never saw the sandbox running: no command is sent.
	q, _ := newProvider(t, f)
	before := f.count("POST", "/toolbox/")
	if err := q.Kill(ctx, id, 4242); err != nil {
		t.Fatalf("kill in a stopped sandbox (fresh provider): %v", err)
	}
	if n := f.count("POST", "/toolbox/") - before; n != 0 {
		t.Fatalf("%d commands sent to a sandbox known to be stopped", n)
	}
}

// TestValidatorCatchesDrift is the validator's negative control: a create carrying the
// secrets in its env (what this client must never send) and a toolbox call without a
// command are both reported.
func TestValidatorCatchesDrift(t *testing.T) {
	f := newFake(t, testKey)
	send := func(path, body string) {
		req, err := http.NewRequestWithContext(ctxFor(t), http.MethodPost, f.srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send("/api/sandbox", `{"name":"x-1","env":{"TOKEN":"v"}}`)
	errs := f.val.takeErrs()
	if len(errs) == 0 || !strings.Contains(strings.Join(errs, "\n"), "env") {
		t.Fatalf("an env at create went unnoticed: %v", errs)
	}
	send("/toolbox/some-id/process/execute", `{"envs":{}}`)
	if errs := f.val.takeErrs(); len(errs) == 0 {
		t.Fatal("a command-less execute went unnoticed")
	}
	// The stop operation is checked too: an undocumented path under it, and (against the
	// published document, which types it) a force flag that is not a boolean.
	send("/api/sandbox/some-id/stop/now", ``)
	if errs := f.val.takeErrs(); len(errs) == 0 {
		t.Fatal("an undocumented stop path went unnoticed")
	}
	for _, d := range loadDocs(t) {
		if d.kind == kindAPI {
			send("/api/sandbox/some-id/stop?force=maybe", ``)
			if errs := f.val.takeErrs(); !strings.Contains(strings.Join(errs, "\n"), "force") {
				t.Fatalf("a non-boolean force went unnoticed: %v", errs)
			}
		}
	}
}

// TestStartEnv: a command's own variables reach it as the request's envs (over the
// sandbox's), never in its command text, and a later command does not see them.
func TestStartEnv(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	envtest.StartEnv(ctx, t, p, mustCreate(t, p, "sk_startenv"), func() {
		f.mu.Lock()
		last := f.lastEnv[len(f.lastEnv)-1]
		f.mu.Unlock()
		if last["AGENT_TOKEN"] != envtest.Secret || last["SANDBOX_VAR"] != "from-the-sandbox" {
			t.Fatalf("start envs %v", last)
		}
	})
}
