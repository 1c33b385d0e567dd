package daytona_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/daytona"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

// TestStopResumeRoundTrip: Stop stops a started sandbox and waits for stopped; the
// sandbox keeps its id and files; stopping a stopped or archived one is nil with no
// second stop request; Resume starts either with its files; Status tells them apart.
func TestStopResumeRoundTrip(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_stop")
	stopPath := "/sandbox/" + id + "/stop"
	if _, err := p.Exec(ctx, id, "echo kept > work.txt"); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := f.state(id); got != "stopped" {
		t.Fatalf("state after Stop: %s, want stopped", got)
	}
	if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxStopped {
		t.Fatalf("status after Stop: %v %v", st, err)
	}
	if _, err := p.Exec(ctx, id, "true"); !errors.Is(err, daytona.ErrNotStarted) {
		t.Fatalf("exec in a stopped sandbox: %v, want ErrNotStarted", err)
	}
	for _, st := range []string{"stopped", "archived", "archiving"} {
		f.set(id, st)
		if err := p.Stop(ctx, id); err != nil {
			t.Fatalf("stop of a %s sandbox: %v", st, err)
		}
	}
	if n := f.Count("POST", stopPath); n != 1 {
		t.Fatalf("stop requests: %d, want 1 (an already stopped sandbox is not asked again)", n)
	}
	f.set(id, "archived")
	if st, err := p.Status(ctx, id); err != nil || st != contract.SandboxArchived || !st.Resumable() {
		t.Fatalf("status of an archived sandbox: %v %v", st, err)
	}
	for _, from := range []string{"archived", "stopped"} {
		f.set(id, from)
		if err := p.Resume(ctx, id); err != nil {
			t.Fatalf("resume from %s: %v", from, err)
		}
		res, err := p.Exec(ctx, id, "cat work.txt")
		if err != nil || string(res.Stdout) != "kept\n" {
			t.Fatalf("files after resume from %s: %q %v", from, res.Stdout, err)
		}
		if got, found, err := p.Lookup(ctx, "sk_stop"); err != nil || !found || got != id {
			t.Fatalf("lookup after resume from %s: %s %v %v, want the same id %s", from, got, found, err, id)
		}
	}
	if f.created != 1 {
		t.Fatalf("sandboxes created: %d, want 1", f.created)
	}
}

// TestStopWaitsAndFails: a stopping sandbox is waited for, a starting one is waited for
// and then stopped; gone is ErrSandboxGone; a failed state, a refused or failing stop,
// and a deadline are transient errors, never gone.
func TestStopWaitsAndFails(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_stopwait")
	stopPath := "/sandbox/" + id + "/stop"

	t.Run("stopping", func(t *testing.T) {
		f.mu.Lock()
		f.transition(f.sandboxes[id], "stopping", "stopped")
		f.mu.Unlock()
		if err := p.Stop(ctx, id); err != nil || f.state(id) != "stopped" || f.Count("POST", stopPath) != 0 {
			t.Fatalf("stop of a stopping sandbox: %v, state %s, %d stop requests", err, f.state(id), f.Count("POST", stopPath))
		}
	})
	t.Run("starting", func(t *testing.T) {
		f.mu.Lock()
		f.transition(f.sandboxes[id], "starting", "started")
		f.mu.Unlock()
		if err := p.Stop(ctx, id); err != nil || f.state(id) != "stopped" || f.Count("POST", stopPath) != 1 {
			t.Fatalf("stop of a starting sandbox: %v, state %s, %d stop requests", err, f.state(id), f.Count("POST", stopPath))
		}
	})
	t.Run("transient", func(t *testing.T) {
		for _, st := range []string{"error", "build_failed", "unknown", "some_new_state"} {
			f.set(id, st)
			if err := p.Stop(ctx, id); err == nil || errors.Is(err, contract.ErrSandboxGone) || !errors.Is(err, daytona.ErrTransient) {
				t.Fatalf("%s: %v, want a transient error", st, err)
			}
		}
		f.set(id, "started")
		f.inject(fault{method: "POST", prefix: stopPath, status: 503})
		if err := p.Stop(ctx, id); err == nil || errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("stop answered 503: %v, want a transient error", err)
		}
		f.mu.Lock()
		f.faults = nil
		f.mu.Unlock()
		if got := f.state(id); got != "started" {
			t.Fatalf("state after a failed stop: %s", got)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		f.set(id, "started")
		_, release := f.holdStop(id)
		defer release()
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		err := p.Stop(short, id)
		if err == nil || errors.Is(err, contract.ErrSandboxGone) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "stopping") {
			t.Fatalf("stop that never completes: %v", err)
		}
		release()
		if err := p.Stop(ctx, id); err != nil || f.state(id) != "stopped" {
			t.Fatalf("stop after release: %v, state %s", err, f.state(id))
		}
	})
	t.Run("gone", func(t *testing.T) {
		f.set(id, "started")
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ { // destroying, then 404
			if err := p.Stop(ctx, id); !errors.Is(err, contract.ErrSandboxGone) {
				t.Fatalf("read %d: %v, want ErrSandboxGone", i, err)
			}
		}
		if err := p.Stop(ctx, "no-such-sandbox"); !errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("unknown id: %v", err)
		}
		f.inject(fault{method: "GET", prefix: "/sandbox/x-404", status: 500})
		if err := p.Stop(ctx, "x-404"); err == nil || errors.Is(err, contract.ErrSandboxGone) {
			t.Fatalf("a failing read: %v, want a transient error", err)
		}
	})
}

// TestResumeWaitsForAStop: a Resume that arrives while a stop is in progress waits for
// the stop to complete and then starts the sandbox (it is never handed a sandbox that is
// stopping); the Stop, seeing the sandbox started again, does not stop it a second time.
func TestResumeWaitsForAStop(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_race")
	reached, release := f.holdStop(id)
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop(ctx, id) }()
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the stop never reached the fake")
	}
	resumed := make(chan error, 1)
	go func() { resumed <- p.Resume(ctx, id) }()
	// Resume keeps polling "stopping" while the stop is held: it must not return.
	deadline := time.Now().Add(5 * time.Second)
	for f.Count("GET", "/sandbox/"+id) < 20 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling the fake's request counter, bounded
	}
	select {
	case err := <-resumed:
		t.Fatalf("resume returned while the sandbox was stopping: %v (state %s)", err, f.state(id))
	default:
	}
	release()
	if err := <-resumed; err != nil {
		t.Fatal(err)
	}
	if got := f.state(id); got != "started" {
		t.Fatalf("state after resume: %s", got)
	}
	err := <-stopped
	if f.state(id) != "started" || f.Count("POST", "/sandbox/"+id+"/stop") != 1 {
		t.Fatalf("the stop stopped the resumed sandbox again: %v, state %s", err, f.state(id))
	}
	if err != nil && (errors.Is(err, contract.ErrSandboxGone) || !errors.Is(err, daytona.ErrTransient)) {
		t.Fatalf("stop overtaken by a resume: %v, want nil or a transient error", err)
	}
}

// TestBillingClock: the fake bills compute only while a sandbox runs, on its own clock:
// ten minutes started, an hour stopped, five minutes started again = fifteen minutes.
func TestBillingClock(t *testing.T) {
	f := newFake(t, testKey)
	clock := manualclock.New()
	f.SetClock(clock.Now)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_bill")
	clock.Add(10 * time.Minute)
	if err := p.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour)
	if got := f.RunningTime(id); got != 10*time.Minute {
		t.Fatalf("running time after 10 min running and an hour stopped: %s", got)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	clock.Add(5 * time.Minute)
	if got := f.RunningTime(id); got != 15*time.Minute {
		t.Fatalf("running time after resuming for 5 min: %s", got)
	}
	id2 := mustCreate(t, p, "sk_bill2")
	clock.Add(time.Minute)
	if err := p.Destroy(ctx, id2); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour)
	if got := f.TotalRunningTime(); got != 16*time.Minute+time.Hour+time.Minute {
		t.Fatalf("total running time: %s", got)
	}
	if f.Count("POST", "/sandbox/"+id+"/stop") != 1 || f.Count("POST", "/sandbox/"+id+"/start") != 1 {
		t.Fatalf("calls: %d stop, %d start", f.Count("POST", "/sandbox/"+id+"/stop"), f.Count("POST", "/sandbox/"+id+"/start"))
	}
}
