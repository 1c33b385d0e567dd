package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/e2b/internal/e2bfake"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

// TestStopResumeRoundTrip: Stop pauses a running sandbox; Status reads it stopped and a
// command is refused with ErrStopped; a second Stop is nil (E2B's 409 read as already
// paused); Resume connects to it again: same id, files intact.
func TestStopResumeRoundTrip(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_stop"})
	if _, err := p.Exec(ctx, id, "echo kept > work.txt"); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if b, _ := f.Box(id); b.State != "paused" {
		t.Fatalf("state after Stop: %s, want paused", b.State)
	}
	if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxStopped {
		t.Fatalf("status after Stop: %v %v", st, err)
	}
	if _, err := p.Exec(ctx, id, "true"); !errors.Is(err, ErrStopped) {
		t.Fatalf("exec in a paused sandbox: %v, want ErrStopped", err)
	}
	if err := p.Stop(ctx, id); err != nil {
		t.Fatalf("stop of a paused sandbox: %v", err)
	}
	if n := f.Count(e2bfake.OpPause); n != 2 {
		t.Fatalf("pause calls: %d, want 2", n)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(ctx, id, "cat work.txt")
	if err != nil || string(res.Stdout) != "kept\n" {
		t.Fatalf("files after resume: %q %v", res.Stdout, err)
	}
	if got, found, err := p.Lookup(ctx, "sk_stop"); err != nil || !found || got != id {
		t.Fatalf("lookup after resume: %s %v %v, want the same id %s", got, found, err, id)
	}
	if f.NumBoxes() != 1 {
		t.Fatalf("sandboxes: %d, want 1", f.NumBoxes())
	}
}

// TestStopErrors: gone is ErrSandboxGone; a 409 on a running sandbox, 5xx and transport
// trouble are transient (never gone, the sandbox untouched); 401 is ErrConfig.
func TestStopErrors(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_stoperr"})
	f.Inject(e2bfake.OpPause, e2bfake.Fault{Status: http.StatusConflict})
	if err := p.Stop(ctx, id); err == nil || errors.Is(err, contract.ErrSandboxGone) || !strings.Contains(err.Error(), "running") {
		t.Fatalf("409 on a running sandbox: %v, want a transient error naming its state", err)
	}
	f.Inject(e2bfake.OpPause, e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 503}, e2bfake.Fault{Status: 503})
	before := f.Count(e2bfake.OpPause)
	if err := p.Stop(ctx, id); err == nil || errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("persistent 503: %v, want a transient error", err)
	}
	if n := f.Count(e2bfake.OpPause) - before; n != 4 {
		t.Fatalf("pause attempts: %d, want 4 (retried)", n)
	}
	f.Inject(e2bfake.OpPause, e2bfake.Fault{Hang: true})
	short := f.provider(func(c *Config) { c.RequestTimeout = 50 * time.Millisecond; c.Retry.Attempts = 1 })
	if err := short.Stop(ctx, id); err == nil || errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("a hung pause: %v, want a transient error", err)
	}
	if b, _ := f.Box(id); b.State != "running" {
		t.Fatalf("state after failed stops: %s", b.State)
	}
	// A 503 after the pause landed (a lost success): the retry's 409 reads it paused.
	f.Inject(e2bfake.OpPause, e2bfake.Fault{Status: 503, Apply: true})
	if err := p.Stop(ctx, id); err != nil {
		t.Fatalf("a lost pause success: %v", err)
	}
	f.Inject(e2bfake.OpPause, e2bfake.Fault{Status: http.StatusUnauthorized})
	if err := p.Stop(ctx, id); !errors.Is(err, ErrConfig) {
		t.Fatalf("401: %v, want ErrConfig", err)
	}
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx, id); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("stop of a killed sandbox: %v, want ErrSandboxGone", err)
	}
	if err := p.Stop(ctx, "sbx-unknown"); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("stop of an unknown sandbox: %v, want ErrSandboxGone", err)
	}
	if err := p.Stop(ctx, "bad/id"); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("a malformed id: %v", err)
	}
}

// TestResumeWaitsForAPause: a Resume arriving while a pause is in progress is answered
// only once the pause completed, and then resumes the sandbox: it is never handed a
// sandbox being paused under it, and the pause is not repeated.
func TestResumeWaitsForAPause(t *testing.T) {
	f := newFake(t)
	p := f.provider()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_race"})
	reached, release := f.HoldPause(id)
	defer release()
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop(ctx, id) }()
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the pause never reached the fake")
	}
	resumed := make(chan error, 1)
	go func() { resumed <- p.Resume(ctx, id) }()
	for f.Count(e2bfake.OpConnect) == 0 { // the connect reached the fake, which holds it
		select {
		case err := <-resumed:
			t.Fatalf("resume returned before its connect reached E2B: %v", err)
		case <-ctx.Done():
			t.Fatal("the connect never reached the fake")
		case <-time.After(time.Millisecond): // polling the fake's call counter, bounded by ctx
		}
	}
	select {
	case err := <-resumed:
		t.Fatalf("resume returned while the sandbox was being paused: %v", err)
	default:
	}
	release()
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := <-resumed; err != nil {
		t.Fatalf("resume: %v", err)
	}
	if b, _ := f.Box(id); b.State != "running" || f.Count(e2bfake.OpPause) != 1 || f.Count(e2bfake.OpConnect) != 1 {
		t.Fatalf("after the race: state %s, %d pauses, %d connects", b.State, f.Count(e2bfake.OpPause), f.Count(e2bfake.OpConnect))
	}
}

// TestBillingClock: the fake bills only running time, on its own clock: ten minutes
// running, an hour paused, five running again = fifteen minutes. A time to live that
// runs out pauses the sandbox (autoPause, the default) or kills it (KillOnTimeout);
// either way its bill ends there.
func TestBillingClock(t *testing.T) {
	f := newFake(t)
	clock := manualclock.New()
	f.SetClock(clock.Now)
	p := f.provider()
	ctx := t.Context()
	id := mustCreate(ctx, t, p, contract.CreateInput{Name: "sk_bill"})
	clock.Add(10 * time.Minute)
	if err := p.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour)
	if got := f.RunningTime(id); got != 10*time.Minute {
		t.Fatalf("running time after 10 min running and an hour paused: %s", got)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	clock.Add(5 * time.Minute)
	if got := f.RunningTime(id); got != 15*time.Minute {
		t.Fatalf("running time after resuming for 5 min: %s", got)
	}

	// Left running: the time to live ends it after Lifetime(), paused by default.
	clock.Add(p.Lifetime() + time.Hour)
	if b, ok := f.Box(id); !ok || b.State != "paused" {
		t.Fatalf("after its time to live: %+v %v, want paused (autoPause)", b, ok)
	}
	if got := f.RunningTime(id); got != 10*time.Minute+p.Lifetime() {
		t.Fatalf("running time after its time to live ran out: %s, want %s", got, 10*time.Minute+p.Lifetime())
	}
	k := f.provider(func(c *Config) { c.KillOnTimeout = true })
	id2 := mustCreate(ctx, t, k, contract.CreateInput{Name: "sk_bill2"})
	if b, _ := f.Box(id2); b.AutoPause {
		t.Fatal("KillOnTimeout created a sandbox with autoPause")
	}
	clock.Add(k.Lifetime() + time.Hour)
	if _, ok := f.Box(id2); ok {
		t.Fatal("a sandbox created with KillOnTimeout outlived its time to live")
	}
	if got, want := f.TotalRunningTime(), 10*time.Minute+p.Lifetime()+k.Lifetime(); got != want {
		t.Fatalf("total running time %s, want %s", got, want)
	}
	if err := k.Resume(ctx, id2); !errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("resume of a sandbox killed by its time to live: %v", err)
	}
}

// recordingTB records the contract violations a fake reports instead of failing.
type recordingTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestPauseContractChecked is the negative control of the pause exchange's validation:
// a body the documents do not allow is reported against each document the fake loaded,
// while the client's own pause passes.
func TestPauseContractChecked(t *testing.T) {
	docs, err := loadDocs()
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingTB{TB: t}
	srv := e2bfake.New(rec, docs)
	f := &fake{Server: srv, t: t}
	p := f.provider()
	id := mustCreate(t.Context(), t, p, contract.CreateInput{Name: "sk_contract"})
	if err := p.Stop(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	clean := len(rec.errs)
	rec.mu.Unlock()
	if clean != 0 {
		t.Fatalf("the client's own exchanges broke the contract: %v", rec.errs)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e2bfake.BaseURL+"/sandboxes/"+id+"/pause", strings.NewReader(`{"memory":"yes"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", e2bfake.APIKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := 1
	if docs.Published != nil {
		want = 2
	}
	n := 0
	for _, e := range rec.errs {
		if strings.Contains(e, "request POST /sandboxes/"+id+"/pause") {
			n++
		}
	}
	if n != want {
		t.Fatalf("a non-boolean memory was reported by %d documents, want %d: %v", n, want, rec.errs)
	}
}
