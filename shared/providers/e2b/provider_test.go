package e2b

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/e2b/internal/e2bfake"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{DetachedTTL: time.Minute}); !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), "APIKey") {
		t.Fatalf("no key: %v", err)
	}
	if _, err := New(Config{APIKey: "k"}); !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), "DetachedTTL") {
		t.Fatalf("no TTL: %v", err)
	}
	p, err := New(Config{APIKey: "k", DetachedTTL: 30 * time.Minute, SweepPeriod: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Lifetime(), 37*time.Minute; got != want {
		t.Fatalf("Lifetime = %s, want TTL+sweep+margin = %s", got, want)
	}
	p, _ = New(Config{APIKey: "k", DetachedTTL: time.Minute, Timeout: 2 * time.Hour})
	if got := p.Lifetime(); got != 2*time.Hour {
		t.Fatalf("Lifetime = %s, want the larger Timeout", got)
	}
	if got := p.envdURL("abc123", conn{}); got != "https://49983-abc123.e2b.app" {
		t.Fatalf("envd URL = %s", got)
	}
	if p.Name() != "e2b" {
		t.Fatalf("Name = %q", p.Name())
	}
}

func TestCreate(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	id := mustCreate(t.Context(), t, p, contract.CreateInput{Name: "sk_abc", Env: map[string]string{"A": "1"}})
	b, ok := f.Box(id)
	if !ok {
		t.Fatalf("created %q, not on the server", id)
	}
	if b.Meta[MetaKey] != "sk_abc" || len(b.Meta[MetaCreate]) != 32 || b.Template != "tmpl-test" || !b.Secure || !b.AutoPause {
		t.Fatalf("created box = %+v", b)
	}
	if want := p.lifetimeSeconds(); f.TimeoutAt(0) != want || want != int((15*time.Minute+time.Minute+LifetimeMargin)/time.Second) {
		t.Fatalf("create timeout = %d, want %d", f.TimeoutAt(0), want)
	}
	id2, err := p.Create(t.Context(), contract.CreateInput{Name: "sk_abc"})
	if err != nil || id2 == id {
		t.Fatalf("a second create of the same name = %q, %v; want a fresh id", id2, err)
	}
	if _, err := p.Create(t.Context(), contract.CreateInput{}); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("no name: %v", err)
	}
	if _, err := p.Create(t.Context(), contract.CreateInput{Name: "x", SnapshotID: "s"}); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("snapshot: %v", err)
	}
}

func TestResume(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_r"})

	t.Run("running", func(t *testing.T) {
		soon := time.Now().Add(10 * time.Second)
		f.SetEnd(id, soon)
		if err := p.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		b, _ := f.Box(id)
		if b.State != "running" || !b.End.After(soon.Add(p.Lifetime()/2)) {
			t.Fatalf("after resume: state %s, ends in %s; want running, about %s", b.State, time.Until(b.End), p.Lifetime())
		}
	})
	t.Run("paused", func(t *testing.T) {
		f.SetState(id, "paused")
		if err := p.Resume(ctx, id); err != nil {
			t.Fatal(err)
		}
		if b, _ := f.Box(id); b.State != "running" {
			t.Fatalf("state after resuming a paused sandbox = %s", b.State)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := p.Resume(ctx, id); !errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("resume of a killed sandbox = %v, want ErrSandboxGone", err)
		}
		if err := p.Resume(ctx, "never-existed"); !errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("resume of an unknown id = %v, want ErrSandboxGone", err)
		}
	})
	t.Run("transient is never gone", func(t *testing.T) {
		id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_r2"})
		f.Inject("connectSandbox", e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 503})
		before := f.Count("connectSandbox")
		err := p.Resume(ctx, id)
		if err == nil || errors.Is(err, contract.ErrSandboxGone) || errors.Is(err, ErrConfig) {
			t.Fatalf("resume through 503s = %v, want a transient error", err)
		}
		if n := f.Count("connectSandbox") - before; n != 4 {
			t.Fatalf("connect attempts = %d, want 4", n)
		}
	})
	if err := p.Resume(ctx, "bad/id"); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("malformed id: %v", err)
	}
}

func TestDestroyTwice(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	id := mustCreate(t.Context(), t, p, contract.CreateInput{Name: "sk_d"})
	for i := range 2 {
		if err := p.Destroy(t.Context(), id); err != nil {
			t.Fatalf("destroy #%d: %v", i+1, err)
		}
	}
	if f.Count("killSandbox") != 2 || f.NumBoxes() != 0 {
		t.Fatalf("kill calls %d, boxes left %d", f.Count("killSandbox"), f.NumBoxes())
	}
	// A kill whose success was lost is retried and the retry's 404 is success.
	id, _ = p.Create(t.Context(), contract.CreateInput{Name: "sk_d"})
	f.Inject("killSandbox", e2bfake.Fault{Status: 502, Apply: true})
	if err := p.Destroy(t.Context(), id); err != nil {
		t.Fatalf("destroy after a lost success: %v", err)
	}
	if _, ok := f.Box(id); ok {
		t.Fatal("sandbox survived")
	}
}

func TestUnauthorized(t *testing.T) {
	f := newFake(t)
	good := f.provider()
	id := mustCreate(t.Context(), t, good, contract.CreateInput{Name: "sk_u"})
	p := f.provider(func(c *Config) { c.APIKey = "e2b_wrong_key" })
	ctx := t.Context()
	_, cerr := p.Create(ctx, contract.CreateInput{Name: "sk_u"})
	_, serr := p.Status(ctx, id)
	_, _, lerr := p.Lookup(ctx, "sk_u")
	errs := map[string]error{"create": cerr, "status": serr, "lookup": lerr, "resume": p.Resume(ctx, id), "destroy": p.Destroy(ctx, id)}
	for op, err := range errs {
		if !errors.Is(err, ErrConfig) || errors.Is(err, contract.ErrSandboxGone) || !strings.Contains(err.Error(), "e2b") {
			t.Errorf("%s with a wrong key = %v; want ErrConfig naming e2b", op, err)
		}
	}
	for _, op := range []string{"createSandbox", "getSandbox", "listSandboxes", "connectSandbox", "killSandbox"} {
		if n := f.Count(op); (op == "createSandbox" && n != 2) || (op != "createSandbox" && n != 1) {
			t.Errorf("%s calls = %d; a 401 is never retried", op, n)
		}
	}
	if f.NumBoxes() != 1 {
		t.Fatalf("boxes = %d", f.NumBoxes())
	}
	// 403 too.
	f.Inject("getSandbox", e2bfake.Fault{Status: 403})
	if _, err := good.Status(ctx, id); !errors.Is(err, ErrConfig) {
		t.Fatalf("403 = %v, want ErrConfig", err)
	}
}

func TestRateLimitedThenSuccess(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	f.Inject("createSandbox", e2bfake.Fault{Status: 429, RetryAfter: "0"}, e2bfake.Fault{Status: 429})
	id := mustCreate(t.Context(), t, p, contract.CreateInput{Name: "sk_429"})
	if f.Count("createSandbox") != 3 || f.NumBoxes() != 1 {
		t.Fatalf("create calls %d, boxes %d; want 3 and 1", f.Count("createSandbox"), f.NumBoxes())
	}
	if f.Count("listSandboxes") != 0 {
		t.Fatalf("a 429 is unambiguous (nothing created), yet the client listed %d times", f.Count("listSandboxes"))
	}
	f.Inject("getSandbox", e2bfake.Fault{Status: 429})
	if st, err := p.Status(t.Context(), id); err != nil || st != contract.SandboxAlive {
		t.Fatalf("status after a 429 = %s, %v", st, err)
	}
}

func TestAmbiguousCreate(t *testing.T) {
	cases := []struct {
		name         string
		faults       []e2bfake.Fault
		wantCreates  int
		wantListings int
	}{
		{"500 after creating", []e2bfake.Fault{{Status: 500, Apply: true}}, 1, 1},
		{"500 before creating", []e2bfake.Fault{{Status: 500}}, 2, 1},
		{"timeout after creating", []e2bfake.Fault{{Hang: true, Apply: true}}, 1, 1},
		{"two 503s, the second after creating", []e2bfake.Fault{{Status: 503}, {Status: 503, Apply: true}}, 2, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			p := f.provider(func(c *Config) { c.RequestTimeout = 300 * time.Millisecond })
			// Another creator's sandbox of the same name must not be adopted.
			other := f.provider()
			otherID := mustCreate(t.Context(), t, other, contract.CreateInput{Name: "sk_amb"})
			f.Inject("createSandbox", tc.faults...)
			id := mustCreate(t.Context(), t, p, contract.CreateInput{Name: "sk_amb"})
			if id == otherID {
				t.Fatal("adopted another creator's sandbox")
			}
			if got := f.NumBoxes(); got != 2 {
				t.Fatalf("sandboxes = %d, want 2 (the other's and exactly one of ours)", got)
			}
			if n := f.Count("createSandbox") - 1; n != tc.wantCreates {
				t.Fatalf("create calls = %d, want %d", n, tc.wantCreates)
			}
			if n := f.Count("listSandboxes"); n != tc.wantListings {
				t.Fatalf("listings = %d, want %d", n, tc.wantListings)
			}
		})
	}
	t.Run("gives up with a hint", func(t *testing.T) {
		f := newFake(t)
		p := f.provider()
		f.Inject("createSandbox", e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500})
		_, err := p.Create(t.Context(), contract.CreateInput{Name: "sk_amb"})
		if err == nil || errors.Is(err, contract.ErrSandboxGone) || !strings.Contains(err.Error(), "Lookup") {
			t.Fatalf("err = %v, want a transient error pointing at Lookup", err)
		}
	})
}

func TestTimeout(t *testing.T) {
	f := newFake(t)
	p := f.provider(func(c *Config) { c.RequestTimeout = 50 * time.Millisecond })
	id := mustCreate(t.Context(), t, p, contract.CreateInput{Name: "sk_t"})
	f.Inject("getSandbox", e2bfake.Fault{Hang: true}, e2bfake.Fault{Hang: true}, e2bfake.Fault{Hang: true}, e2bfake.Fault{Hang: true})
	st, err := p.Status(t.Context(), id)
	if err == nil || st != "" || errors.Is(err, contract.ErrSandboxGone) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("status through hung requests = %q, %v; want a transient deadline error", st, err)
	}
	if n := f.SentCount("GET /sandboxes/" + id); n != 4 {
		t.Fatalf("attempts = %d, want all 4", n)
	}
	// The caller's deadline bounds the retries: an expired ctx makes no more attempts.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	before := f.SentCount("GET /sandboxes/" + id)
	if _, err := p.Status(ctx, id); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: %v", err)
	}
	if f.SentCount("GET /sandboxes/"+id) != before {
		t.Fatal("a cancelled ctx still called the API")
	}
}

func TestLookup(t *testing.T) {
	f := newFake(t)
	f.SetPageSize(1) // every listing pages
	p := f.provider()
	ctx := t.Context()
	a1 := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_a"})
	b1 := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_b"})
	a2 := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_a"})
	f.SetState(a2, "paused")

	id, found, err := p.Lookup(ctx, "sk_a")
	if err != nil || !found || id != a1 {
		t.Fatalf("Lookup(sk_a) = %q %v %v; want the running %q over the paused %q", id, found, err, a1, a2)
	}
	if err := p.Destroy(ctx, a1); err != nil {
		t.Fatal(err)
	}
	if id, found, err := p.Lookup(ctx, "sk_a"); err != nil || !found || id != a2 {
		t.Fatalf("Lookup(sk_a) = %q %v %v; want the paused %q", id, found, err, a2)
	}
	if id, found, err := p.Lookup(ctx, "sk_b"); err != nil || !found || id != b1 {
		t.Fatalf("Lookup(sk_b) = %q %v %v", id, found, err)
	}
	if id, found, err := p.Lookup(ctx, "sk_none"); err != nil || found || id != "" {
		t.Fatalf("Lookup(sk_none) = %q %v %v; want not found", id, found, err)
	}
	if _, _, err := p.Lookup(ctx, ""); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("empty name: %v", err)
	}
	// Two of the same name both running: the newest.
	a3 := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_a"})
	f.SetState(a2, "running")
	if id, _, _ := p.Lookup(ctx, "sk_a"); id != a3 {
		t.Fatalf("Lookup among two running = %q, want the newest %q", id, a3)
	}
	f.Inject("listSandboxes", e2bfake.Fault{Status: 500})
	if _, found, err := p.Lookup(ctx, "sk_b"); err != nil || !found {
		t.Fatalf("lookup through a 500: %v %v", found, err)
	}
}

func TestStatus(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_s"})

	f.SetEnd(id, time.Now().Add(time.Minute))
	before := f.Count("setSandboxTimeout")
	if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxAlive {
		t.Fatalf("running: %s %v", st, err)
	}
	if b, _ := f.Box(id); f.Count("setSandboxTimeout") != before+1 || time.Until(b.End) < p.Lifetime()/2 {
		t.Fatalf("the probe did not push the end out: ends in %s", time.Until(b.End))
	}

	f.SetState(id, "paused")
	before = f.Count("setSandboxTimeout")
	if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxStopped {
		t.Fatalf("paused: %s %v", st, err)
	}
	if b, _ := f.Box(id); b.State != "paused" || f.Count("setSandboxTimeout") != before || f.Count("connectSandbox") != 0 {
		t.Fatal("Status started or touched a paused sandbox")
	}

	if st, err := p.Status(ctx, "gone1"); err != nil || st != contract.SandboxGone {
		t.Fatalf("missing: %s %v", st, err)
	}
	f.Inject("getSandbox", e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 502}, e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 504})
	if st, err := p.Status(ctx, id); err == nil || st == contract.SandboxGone {
		t.Fatalf("5xx: %s %v; want a transient error, never gone", st, err)
	}
}

// syncBuffer is a log sink the handler may write from several goroutines.
type syncBuffer = syncbuf.Buffer

// TestNoSecretsInErrorsOrLogs drives every failure path against a hostile server that
// echoes the API key, envd tokens and env values in its error messages, with debug
// logging on, and looks for the secrets in every error and log line.
func TestNoSecretsInErrorsOrLogs(t *testing.T) {
	f := newFake(t)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const envSecret = "CANARY-workspace-secret-7f3a"
	p := f.provider(func(c *Config) { c.Logger = logger })
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_c", Env: map[string]string{"TOKEN": envSecret}})
	box, _ := f.Box(id)
	f.SetHostile(true)
	var errs []error
	add := func(err error) {
		if err == nil {
			t.Errorf("expected an error")
			return
		}
		errs = append(errs, err)
	}
	bad := f.provider(func(c *Config) { c.Logger = logger; c.APIKey = "e2b_CANARY_wrong_key_91c2" })
	_, err := bad.Create(ctx, contract.CreateInput{Name: "sk_c"})
	add(err)
	add(bad.Resume(ctx, id))
	f.Inject("getSandbox", e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500})
	_, err = p.Status(ctx, id)
	add(err)
	f.Inject("createSandbox", e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500}, e2bfake.Fault{Status: 500})
	_, err = p.Create(ctx, contract.CreateInput{Name: "sk_c2", Env: map[string]string{"TOKEN": envSecret}})
	add(err)
	_, err = p.Exec(ctx, id, "true") // the hostile envd echoes the env values
	add(err)
	p.mu.Lock()
	p.conns[id].token = "stale-token-that-is-long" // envd echoes the wrong token on 401
	p.mu.Unlock()
	f.SetHostile(true)
	_, err = p.Exec(ctx, id, "true")
	add(err)
	secrets := []string{e2bfake.APIKey, "e2b_CANARY_wrong_key_91c2", envSecret, box.Token, "stale-token-that-is-long"}
	for _, e := range errs {
		for _, s := range secrets {
			if strings.Contains(e.Error(), s) {
				t.Errorf("error carries a secret: %v", e)
			}
		}
	}
	out := logs.String()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("log carries secret %q", s)
		}
	}
	if len(errs) != 6 || !strings.Contains(out, "retrying") {
		t.Fatalf("the canary did not reach the paths: %d errors, logs %q", len(errs), out)
	}
	if !strings.Contains(errs[0].Error(), "[redacted]") {
		t.Fatalf("the hostile 401 echo was not redacted: %v", errs[0])
	}
}

func TestLookupOddNames(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	odd := "sk a&b=c%d+é"
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: odd})
	if b, _ := f.Box(id); b.Meta[MetaKey] != odd {
		t.Fatalf("label = %q", b.Meta[MetaKey])
	}
	if got, found, err := p.Lookup(ctx, odd); err != nil || !found || got != id {
		t.Fatalf("Lookup(%q) = %q %v %v", odd, got, found, err)
	}
	// A name that is a prefix or a decoding away from it is another name.
	for _, other := range []string{"sk a", "sk a&b=c%25d+é", "sk a&b=c%d é"} {
		if _, found, err := p.Lookup(ctx, other); err != nil || found {
			t.Fatalf("Lookup(%q) found=%v err=%v; want not found", other, found, err)
		}
	}
}

// TestConcurrentUse drives one provider from several goroutines: each sets its own
// variable and reads it back through envd while others do the same, and two destroys
// race at the end. The race detector watches the shared maps.
func TestConcurrentUse(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_cc"})
	const n = 6
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			k := "K" + strconv.Itoa(i)
			if err := p.SetEnv(ctx, id, map[string]string{k: "v" + strconv.Itoa(i)}); err != nil {
				errs <- err
				return
			}
			res, err := p.Exec(ctx, id, `printf %s "$`+k+`"`)
			if err != nil {
				errs <- err
				return
			}
			if got := string(res.Stdout); got != "v"+strconv.Itoa(i) {
				errs <- fmt.Errorf("%s = %q", k, got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := f.Count("envd"); got != n {
		t.Fatalf("envd calls = %d, want %d", got, n)
	}
	var d sync.WaitGroup
	derrs := make([]error, 2)
	for i := range 2 {
		d.Go(func() { derrs[i] = p.Destroy(ctx, id) })
	}
	d.Wait()
	if derrs[0] != nil || derrs[1] != nil || f.Count("killSandbox") != 2 || f.NumBoxes() != 0 {
		t.Fatalf("racing destroys: %v %v, kills %d, boxes %d", derrs[0], derrs[1], f.Count("killSandbox"), f.NumBoxes())
	}
}
