package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

// The idle-stop benchmark of docs/bench.md, for any provider stand-in that bills compute
// on a clock of its own: runs are started and finished through the keeper (memstore),
// which shares that clock, and a simulated hour passes in a moment.

// IdleGrace is the idle grace the benchmark's "after" worlds use (the idle stop's default,
// docs/design.md §2.5).
const IdleGrace = 10 * time.Minute

// IdleWorld is one benchmark world: a provider aimed at a fresh stand-in whose billing
// clock is Clock.
type IdleWorld struct {
	Provider contract.Provider
	Clock    *manualclock.Clock
	// Running is the compute time the stand-in billed so far, over every sandbox.
	Running func() time.Duration
	// Stop is the idle stop, called once per simulated minute; nil models the code before
	// it (nothing stops an idle sandbox).
	Stop func(r *IdleRig, now time.Time)
	// Resumes: a thread's next run must get the same sandbox (fail otherwise).
	Resumes bool
	// Pace is how many sandboxes one idle-stop call stops at most (0: all that are due);
	// the rest wait a simulated minute per call, which Bound allows for.
	Pace int
	// SettleEnds: a run's end settles its sandbox (keeper.SettleEnded, as the finish route
	// does: a one-run sandbox is destroyed then); false models the code before it.
	SettleEnds bool
	// SweepBackend, when set, is what ReaperStop's sweeps see of the rig's backend: a
	// test's seam for a deliberately broken view (e.g. one that hides live runs).
	SweepBackend func(contract.Backend) contract.Backend
}

// IdleRig is one scenario's run of a world.
type IdleRig struct {
	T     *testing.T
	Ctx   context.Context
	World IdleWorld
	K     *keeper.Keeper

	// Reuse is the setup's reuse of the runs Start starts ("" = the thread's sandbox;
	// keeper.ReuseNone: a sandbox per run).
	Reuse keeper.Reuse

	backend contract.Backend // the keeper's
	runs    int
	live    map[string]int64     // live runs: their driver epoch, heartbeated every simulated minute
	LastEnd map[string]time.Time // per sandbox key: when its latest run ended (zero: one is live)
	PSID    map[string]string    // per sandbox key: its provider sandbox id
	first   map[string]time.Time // per sandbox key: when its first run started
	RunTime time.Duration        // the runs' own time, summed
	Stops   int                  // stops the idle stop made (the sweeps' reports)
	// Destroys: sandboxes destroyed, at a run's end (SettleEnded) or by a sweep.
	Destroys int
	Creates  int // starts that created (or restored) instead of resuming

	reaper *reaper.Reaper // ReaperStop's, built on K at its first sweep
}

// ReaperStop is the idle stop as sandkeep runs it: a reaper sweep (docs/design.md §5) each
// simulated minute, the reaper built on the rig's keeper (so on the stand-in's clock), with
// the detached TTL 15 minutes and cfg applied (e.g. IdleStop negative: the code before the
// idle stop). Its stops are counted from the sweeps' reports; a sweep stops at most
// reaper.DefaultIdleStopLimit sandboxes (the world's Pace).
func ReaperStop(cfg func(*reaper.Config)) func(r *IdleRig, now time.Time) {
	return func(r *IdleRig, _ time.Time) {
		if r.reaper == nil {
			k := r.K
			if wrap := r.World.SweepBackend; wrap != nil {
				k = newIdleKeeper(r.T, wrap(r.backend), r.World)
			}
			c := reaper.Config{Keeper: k, DetachedRunTTL: 15 * time.Minute, QuietReport: true}
			if cfg != nil {
				cfg(&c)
			}
			rp, err := reaper.New(c)
			if err != nil {
				r.T.Fatal(err)
			}
			r.reaper = rp
		}
		rep, err := r.reaper.Sweep(r.Ctx)
		if err != nil {
			r.T.Fatalf("sweep: %v", err)
		}
		r.Stops += rep.Lifecycle.Stopped
		r.Destroys += rep.Lifecycle.Destroyed
	}
}

// Advance lets d pass minute by minute, the idle stop (if any) running each minute.
func (r *IdleRig) Advance(d time.Duration) {
	for step := time.Minute; d > 0; d -= step {
		r.World.Clock.Add(min(step, d))
		for id, epoch := range r.live { // the runs' hosts, attached
			if _, err := r.K.Heartbeat(r.Ctx, id, epoch); err != nil {
				r.T.Fatalf("heartbeat %s: %v", id, err)
			}
		}
		if r.World.Stop != nil {
			r.World.Stop(r, r.World.Clock.Now())
		}
	}
}

// Start starts a run on thread.
func (r *IdleRig) Start(thread string) (runID string, cur contract.Cursor, key string) {
	r.runs++
	runID = fmt.Sprintf("run-%d", r.runs)
	setup := keeper.Setup{ID: "setup-1", Provider: r.World.Provider.Name(), Workspace: json.RawMessage(`{"repo":"x"}`), Reuse: r.Reuse}
	res, err := r.K.Start(r.Ctx, keeper.StartInput{RunID: runID, ThreadID: thread, Sandbox: setup})
	if err != nil {
		r.T.Fatalf("start %s: %v", runID, err)
	}
	key = res.Sandbox.Key
	if old := r.PSID[key]; old != "" && old != res.Sandbox.ProviderSandboxID {
		r.Creates++
		if r.World.Resumes {
			r.T.Fatalf("thread %s: sandbox %s replaced by %s (%s), want it resumed", thread, old, res.Sandbox.ProviderSandboxID, res.Outcome)
		}
	}
	r.PSID[key], r.LastEnd[key] = res.Sandbox.ProviderSandboxID, time.Time{}
	r.live[runID] = res.Driver.Cursor.Epoch
	if _, ok := r.first[key]; !ok {
		r.first[key] = r.World.Clock.Now()
	}
	return runID, res.Driver.Cursor, key
}

// Finish completes a run Start started.
func (r *IdleRig) Finish(runID string, cur contract.Cursor, key string) {
	rec, err := r.K.Finish(r.Ctx, runID, cur, keeper.FinishInput{Status: contract.StatusCompleted})
	if err != nil {
		r.T.Fatalf("finish %s: %v", runID, err)
	}
	if r.World.SettleEnds {
		res, err := r.K.SettleEnded(r.Ctx, rec)
		if err != nil {
			r.T.Fatalf("settle %s: %v", runID, err)
		}
		if res.Outcome == keeper.EndDestroyed {
			r.Destroys++
		}
	}
	r.LastEnd[key] = r.World.Clock.Now()
	delete(r.live, runID)
}

// Run is one run of length d on thread.
func (r *IdleRig) Run(thread string, d time.Duration) {
	id, cur, key := r.Start(thread)
	r.Advance(d)
	r.Finish(id, cur, key)
	r.RunTime += d
}

// IdleScenario is one of the benchmark's workloads.
type IdleScenario struct {
	Name string
	Play func(r *IdleRig)
}

// IdleScenarios are docs/bench.md's idle-stop workloads, each followed by an hour idle.
var IdleScenarios = []IdleScenario{
	{"one 10-min run, then an hour idle", func(r *IdleRig) {
		r.Run("thread-1", 10*time.Minute)
		r.Advance(time.Hour)
	}},
	{"ten 10-min runs 5 min apart on one thread, then an hour idle", func(r *IdleRig) {
		for i := 0; i < 10; i++ {
			if i > 0 {
				r.Advance(5 * time.Minute)
			}
			r.Run("thread-1", 10*time.Minute)
		}
		r.Advance(time.Hour)
	}},
	{"two 10-min runs an hour apart on one thread, then an hour idle", func(r *IdleRig) {
		r.Run("thread-1", 10*time.Minute)
		r.Advance(time.Hour)
		r.Run("thread-1", 10*time.Minute)
		r.Advance(time.Hour)
	}},
	{"ten 10-min runs 5 min apart on one thread, reuse \"none\", then an hour idle", func(r *IdleRig) {
		r.Reuse = keeper.ReuseNone // a sandbox per run
		for i := 0; i < 10; i++ {
			if i > 0 {
				r.Advance(5 * time.Minute)
			}
			r.Run("thread-1", 10*time.Minute)
		}
		r.Advance(time.Hour)
	}},
	{"100 threads, one 10-min run each, then an hour idle", func(r *IdleRig) {
		type live struct {
			id, key string
			cur     contract.Cursor
		}
		var all []live
		for i := 0; i < 100; i++ {
			id, cur, key := r.Start(fmt.Sprintf("thread-%03d", i))
			all = append(all, live{id, key, cur})
		}
		r.Advance(10 * time.Minute)
		for _, l := range all {
			r.Finish(l.id, l.cur, l.key)
			r.RunTime += 10 * time.Minute
		}
		r.Advance(time.Hour)
	}},
}

// Play runs scenario sc in a world.
func Play(t *testing.T, ctx context.Context, w IdleWorld, sc IdleScenario) *IdleRig {
	t.Helper()
	r := NewIdleRig(t, ctx, w)
	sc.Play(r)
	return r
}

// NewIdleRig is a rig on world w: its keeper on memstore and w's clock.
func NewIdleRig(t *testing.T, ctx context.Context, w IdleWorld) *IdleRig {
	t.Helper()
	b := memstore.New(memstore.WithDriverLease(idleLease))
	return &IdleRig{T: t, Ctx: contract.WithTenant(ctx, "tenant-a"), World: w, K: newIdleKeeper(t, b, w), backend: b,
		live: map[string]int64{}, LastEnd: map[string]time.Time{}, PSID: map[string]string{}, first: map[string]time.Time{}}
}

// idleLease is the rig's driver lease: several simulated minutes, heartbeated every
// minute (attached hosts).
const idleLease = 5 * time.Minute

// newIdleKeeper is a keeper on b and w's provider and clock.
func newIdleKeeper(t *testing.T, b contract.Backend, w IdleWorld) *keeper.Keeper {
	t.Helper()
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{w.Provider}, Now: w.Clock.Now, DriverLease: idleLease})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Detach detaches live run runID (its host leaves; nothing heartbeats it any more).
func (r *IdleRig) Detach(runID string) {
	if _, err := r.K.Detach(r.Ctx, runID, r.live[runID]); err != nil {
		r.T.Fatalf("detach %s: %v", runID, err)
	}
	delete(r.live, runID)
}

// RunLiveNeverStopped proves on a stand-in that a live run's sandbox is never stopped
// (docs/design.md §5), the reaper sweeping every simulated minute with its idle stop on
// (grace IdleGrace, detached TTL 15 minutes): a 30-minute run whose host heartbeats, and
// a run attached 10 minutes then detached 14 (past the grace, within the TTL), both well
// past a 22-minute time to live. running is the stand-in's billed running time of one
// sandbox: it must equal the run's whole time. extends, when not nil, counts the
// provider's lifetime extensions, logged and bounded at one per run-minute.
func RunLiveNeverStopped(t *testing.T, world func(t *testing.T) IdleWorld, running func(psid string) time.Duration, extends func() int) {
	for _, sc := range []struct {
		name             string
		attached, detach time.Duration
	}{
		{"a 30-minute heartbeating run", 30 * time.Minute, 0},
		{"attached 10 minutes, then detached 14 past the grace within the TTL", 10 * time.Minute, 14 * time.Minute},
	} {
		t.Run(sc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			w := world(t)
			w.Stop = ReaperStop(func(c *reaper.Config) { c.IdleStop = IdleGrace })
			if os.Getenv(hideLiveRunsEnv) != "" { // inside LiveNeverStoppedControl's subprocess
				w.SweepBackend = HideLiveRuns
			}
			r := NewIdleRig(t, ctx, w)
			id, _, key := r.Start("thread-1")
			psid := r.PSID[key]
			r.Advance(sc.attached)
			if sc.detach > 0 {
				r.Detach(id)
				r.Advance(sc.detach)
			}
			whole := sc.attached + sc.detach
			rec, err := r.K.Get(r.Ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			got := running(psid)
			n := 0
			if extends != nil {
				n = extends()
			}
			t.Logf("%s: sandbox running %s of %s, run %s, %d stops, %d lifetime extensions", sc.name, got, whole, rec.Status, r.Stops, n)
			switch {
			case rec.Status != contract.StatusRunning:
				t.Fatalf("the run is %s, want still running", rec.Status)
			case r.Stops != 0 || got < whole:
				t.Fatalf("the live run's sandbox ran %s of %s (%d stops): it was stopped under the run", got, whole, r.Stops)
			case float64(n) > whole.Minutes():
				t.Fatalf("%d lifetime extensions in %s: more than one per run-minute", n, whole)
			}
		})
	}
}

// hideLiveRunsEnv, set, makes RunLiveNeverStopped's sweeps see HideLiveRuns.
const hideLiveRunsEnv = "TESTKIT_HIDE_LIVE_RUNS"

// LiveNeverStoppedControl is RunLiveNeverStopped's negative control: it re-runs the test
// named test (which calls RunLiveNeverStopped) in a subprocess whose reaper sees live runs
// hidden (HideLiveRuns), and fails unless each case fails there because the live run's
// sandbox was stopped under it. The failures' own lines are logged for the record.
func LiveNeverStoppedControl(t *testing.T, test string) {
	if os.Getenv(hideLiveRunsEnv) != "" {
		t.Skip("already inside the negative control's subprocess")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), hideLiveRunsEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("%s passed with live runs hidden from the idle stop (err %v); output:\n%s", test, err, out)
	}
	for _, c := range []string{"a_30-minute_heartbeating_run", "attached_10_minutes,_then_detached_14_past_the_grace_within_the_TTL"} {
		if !regexp.MustCompile(`--- FAIL: ` + regexp.QuoteMeta(test+"/"+c) + ` `).Match(out) {
			t.Errorf("case %s did not fail with live runs hidden; output tail:\n%s", c, out[max(0, len(out)-3000):])
		}
	}
	if n := bytes.Count(out, []byte("it was stopped under the run")); n != 2 {
		t.Errorf("%d cases failed for the stop under the run, want 2; output tail:\n%s", n, out[max(0, len(out)-3000):])
	}
	for _, line := range bytes.Split(out, []byte("\n")) {
		if bytes.Contains(line, []byte("idlebilling.go:")) {
			t.Logf("hidden live runs: %s", bytes.TrimSpace(line))
		}
	}
}

// Bound is the most running time the idle stop allows the rig's sandboxes: per sandbox,
// from its first run's start to its last run's end plus one grace, and a grace more per
// further stop (each idle stretch past the grace costs one grace). With a Pace, the
// sandboxes past the first Pace of them wait a simulated minute per further sweep; with
// reaper.DefaultIdleStopLimit as the Pace, the 100-thread workload waits none.
func (r *IdleRig) Bound() time.Duration {
	var b time.Duration
	for key := range r.PSID {
		b += r.LastEnd[key].Sub(r.first[key]) + IdleGrace
	}
	if r.Stops > len(r.PSID) {
		b = r.RunTime + time.Duration(r.Stops)*IdleGrace
	}
	if p := r.World.Pace; p > 0 {
		for i := range len(r.PSID) {
			b += time.Duration(i/p) * time.Minute
		}
	}
	return b
}

// RunIdleBilling plays every scenario in a "before" and an "after" world (world(t, after))
// and logs running sandbox-minutes per run-minute; the after world must stay within
// Bound and below the before world.
func RunIdleBilling(t *testing.T, world func(t *testing.T, after bool) IdleWorld) {
	for _, sc := range IdleScenarios {
		t.Run(sc.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			bw, aw := world(t, false), world(t, true)
			before, after := Play(t, ctx, bw, sc), Play(t, ctx, aw, sc)
			b, a := bw.Running(), aw.Running()
			t.Logf("%s: run time %s; running sandbox time before %s (%.2f per run-minute, %d sandboxes replaced), after %s (%.2f per run-minute, %d stops, %d destroys, %d replaced)",
				sc.Name, after.RunTime, b, b.Minutes()/before.RunTime.Minutes(), before.Creates,
				a, a.Minutes()/after.RunTime.Minutes(), after.Stops, after.Destroys, after.Creates)
			if bound := after.Bound(); a > bound {
				t.Fatalf("after: %s running, above the bound %s", a, bound)
			}
			if a >= b {
				t.Fatalf("after: %s running, not below the before world's %s", a, b)
			}
			if after.Reuse == keeper.ReuseNone {
				// A one-run sandbox goes with its run's end: it runs no longer than its run.
				if a > after.RunTime || after.Destroys != len(after.PSID) {
					t.Fatalf("after: %s running for %s of runs, %d of %d one-run sandboxes destroyed", a, after.RunTime, after.Destroys, len(after.PSID))
				}
				return
			}
			if after.Stops == 0 {
				t.Fatal("after: the idle stop stopped nothing")
			}
		})
	}
}
