package daytona_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/provider/daytona"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// The idle-stop benchmark of docs/bench.md on the Daytona stand-in: runs started and
// finished through the keeper (memstore), the stand-in billing compute on its own clock,
// which the keeper shares; a simulated hour passes in a moment.

// idleGrace is the idle grace the "after" runs use (the default of docs/design.md §2.5's
// idle stop).
const idleGrace = 10 * time.Minute

// idleRig is one scenario's world.
type idleRig struct {
	t     *testing.T
	ctx   context.Context
	f     *fakeDaytona
	clock *fakeClock
	prov  *daytona.Provider
	k     *keeper.Keeper
	// stopIdle, when set, is the idle stop, called once per simulated minute with the
	// rig's view of every sandbox: nil models the code before the idle stop (nothing
	// stops a sandbox until the instance retention destroys it).
	stopIdle func(r *idleRig, now time.Time)

	runs     int
	lastEnd  map[string]time.Time // per sandbox key: when its latest run ended (zero: one is live)
	psid     map[string]string    // per sandbox key: its provider sandbox id
	stopped  map[string]bool      // per sandbox key: stopped by stopIdle since its last run
	first    map[string]time.Time // per sandbox key: when its first run started
	runTime  time.Duration        // the runs' own time, summed
	stopCall int
}

func newIdleRig(t *testing.T, stop func(r *idleRig, now time.Time)) *idleRig {
	f := newFake(t, testKey)
	clock := newClock()
	f.SetClock(clock.Now)
	prov, _ := newProvider(t, f)
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []sandbox.Provider{prov}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return &idleRig{t: t, ctx: sandbox.WithTenant(ctxFor(t), "tenant-a"), f: f, clock: clock, prov: prov, k: k, stopIdle: stop,
		lastEnd: map[string]time.Time{}, psid: map[string]string{}, stopped: map[string]bool{}, first: map[string]time.Time{}}
}

// stopAfterGrace is the idle stop's rule as docs/design.md §2.5 states it, applied by the
// rig: a sandbox whose key has no live run and whose latest run ended at least the grace
// ago is stopped.
func stopAfterGrace(r *idleRig, now time.Time) {
	for key, end := range r.lastEnd {
		if end.IsZero() || r.stopped[key] || now.Sub(end) < idleGrace {
			continue
		}
		if err := r.prov.Stop(r.ctx, r.psid[key]); err != nil {
			r.t.Fatalf("stop %s: %v", key, err)
		}
		r.stopped[key] = true
		r.stopCall++
	}
}

// advance lets d pass minute by minute, the idle stop (if any) running each minute.
func (r *idleRig) advance(d time.Duration) {
	for step := time.Minute; d > 0; d -= step {
		r.clock.Add(min(step, d))
		if r.stopIdle != nil {
			r.stopIdle(r, r.clock.Now())
		}
	}
}

// start starts a run on thread (resuming its sandbox when it has one).
func (r *idleRig) start(thread string) (runID string, cur sandbox.Cursor, key string) {
	r.runs++
	runID = fmt.Sprintf("run-%d", r.runs)
	setup := keeper.Setup{ID: "setup-1", Provider: "daytona", Workspace: json.RawMessage(`{"repo":"x"}`)}
	res, err := r.k.Start(r.ctx, keeper.StartInput{RunID: runID, ThreadID: thread, Sandbox: setup})
	if err != nil {
		r.t.Fatalf("start %s: %v", runID, err)
	}
	key = res.Sandbox.Key
	if old := r.psid[key]; old != "" && old != res.Sandbox.ProviderSandboxID {
		r.t.Fatalf("thread %s: sandbox %s replaced by %s (%s), want it resumed", thread, old, res.Sandbox.ProviderSandboxID, res.Outcome)
	}
	r.psid[key], r.lastEnd[key], r.stopped[key] = res.Sandbox.ProviderSandboxID, time.Time{}, false
	if _, ok := r.first[key]; !ok {
		r.first[key] = r.clock.Now()
	}
	return runID, res.Driver.Cursor, key
}

func (r *idleRig) finish(runID string, cur sandbox.Cursor, key string) {
	if _, err := r.k.Finish(r.ctx, runID, cur, keeper.FinishInput{Status: sandbox.StatusCompleted}); err != nil {
		r.t.Fatalf("finish %s: %v", runID, err)
	}
	r.lastEnd[key] = r.clock.Now()
}

// run is one run of length d on thread.
func (r *idleRig) run(thread string, d time.Duration) {
	id, cur, key := r.start(thread)
	r.advance(d)
	r.finish(id, cur, key)
	r.runTime += d
}

// idleScenario is one of the benchmark's workloads.
type idleScenario struct {
	name string
	play func(r *idleRig)
}

var idleScenarios = []idleScenario{
	{"one 10-min run, then an hour idle", func(r *idleRig) {
		r.run("thread-1", 10*time.Minute)
		r.advance(time.Hour)
	}},
	{"ten 10-min runs 5 min apart on one thread, then an hour idle", func(r *idleRig) {
		for i := 0; i < 10; i++ {
			if i > 0 {
				r.advance(5 * time.Minute)
			}
			r.run("thread-1", 10*time.Minute)
		}
		r.advance(time.Hour)
	}},
	{"two 10-min runs an hour apart on one thread (the second resumes), then an hour idle", func(r *idleRig) {
		r.run("thread-1", 10*time.Minute)
		r.advance(time.Hour)
		r.run("thread-1", 10*time.Minute)
		r.advance(time.Hour)
	}},
	{"100 threads, one 10-min run each, then an hour idle", func(r *idleRig) {
		type live struct {
			id, key string
			cur     sandbox.Cursor
		}
		var all []live
		for i := 0; i < 100; i++ {
			id, cur, key := r.start(fmt.Sprintf("thread-%03d", i))
			all = append(all, live{id, key, cur})
		}
		r.advance(10 * time.Minute)
		for _, l := range all {
			r.finish(l.id, l.cur, l.key)
			r.runTime += 10 * time.Minute
		}
		r.advance(time.Hour)
	}},
}

// TestIdleStopBilling measures running sandbox-minutes per run-minute on the stand-in's
// clock, before (nothing stops an idle sandbox) and after (the idle stop after the grace),
// and checks the bound: with the idle stop, each sandbox runs at most from its
// first run's start to its last run's end plus one grace (gaps shorter than the grace keep
// it running; none here is longer).
func TestIdleStopBilling(t *testing.T) {
	for _, sc := range idleScenarios {
		t.Run(sc.name, func(t *testing.T) {
			before := newIdleRig(t, nil)
			sc.play(before)
			after := newIdleRig(t, stopAfterGrace)
			sc.play(after)
			b, a := before.f.TotalRunningTime(), after.f.TotalRunningTime()
			var bound time.Duration
			starts := 0
			for key, id := range after.psid {
				bound += after.lastEnd[key].Sub(after.first[key]) + idleGrace
				starts += after.f.Count("POST", "/sandbox/"+id+"/start")
			}
			if after.stopCall > len(after.psid) { // each stretch idle past the grace stops once
				bound = after.runTime + time.Duration(after.stopCall)*idleGrace
			}
			t.Logf("%s: run time %s; running sandbox time before %s (%.2f per run-minute), after %s (%.2f per run-minute); %d sandboxes, %d stops, %d starts",
				sc.name, after.runTime, b, b.Minutes()/before.runTime.Minutes(), a, a.Minutes()/after.runTime.Minutes(),
				len(after.psid), after.stopCall, starts)
			if a > bound {
				t.Fatalf("after: %s running, above first start to last end + one grace per sandbox (%s)", a, bound)
			}
			if b <= a {
				t.Fatalf("the idle stop saved nothing: before %s, after %s", b, a)
			}
			for key, id := range after.psid {
				if st := after.f.state(id); st != "stopped" {
					t.Fatalf("after: sandbox of %s is %s at the end, want stopped", key, st)
				}
			}
		})
	}
}
