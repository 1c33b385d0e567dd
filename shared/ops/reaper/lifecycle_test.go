package reaper_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// TestSweepCountsLifecycle: what a sweep does to sandboxes' running time is in its report
// and its metrics (docs/design.md §5) — on both backends. Four keys: a thread's sandbox
// whose run ended, a one-run sandbox (reuse "none") whose run's end did not destroy it,
// a thread's sandbox under a live run, and an idle one the provider lost (counted gone,
// neither failed nor running). A sweep one grace + a minute later counts one
// stop, one destroy, two sandboxes found running with no live run (IdleRunningSandboxes
// 2) and one in use; the live run's sandbox still runs, the stopped one is stopped, the
// one-run one is gone. A second sweep counts nothing more.
func TestSweepCountsLifecycle(t *testing.T) {
	onBothBackends(t, func(t *testing.T, w *world) {
		ended := w.startKept("run-ended", "th-ended", keeper.Setup{})
		oneRun := w.startKept("run-one", "th-one", keeper.Setup{Reuse: keeper.ReuseNone})
		live := w.startKept("run-live", "th-live", keeper.Setup{})
		vanished := w.startKept("run-vanished", "th-vanished", keeper.Setup{})
		for _, r := range []keeper.StartResult{ended, oneRun, vanished} {
			w.complete(r)
		}
		// The provider loses one idle sandbox: found gone, it was not running.
		if err := w.prov.Destroy(w.ctx, vanished.Sandbox.ProviderSandboxID); err != nil {
			t.Fatal(err)
		}
		// The live run's lease has lapsed on the sweeps' clock: detached, within the
		// TTL (an hour), it is live all the same.
		var metrics bytes.Buffer
		rp := w.reaper(keeper.DefaultIdleStop+time.Minute, nil, func(c *reapCfg) {
			c.Metrics, c.IdleStop = emf.New(&metrics), keeper.DefaultIdleStop
		})
		rep, err := rp.Sweep(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		lc := rep.Lifecycle
		t.Logf("lifecycle %+v", lc)
		if lc.Stopped != 1 || lc.Destroyed != 1 || lc.Gone != 1 || lc.IdleRunning != 2 || lc.InUse != 1 || lc.Failed != 0 {
			t.Fatalf("lifecycle %+v: want 1 stopped, 1 destroyed, 1 gone, 2 idle running, 1 in use", lc)
		}
		for _, want := range []string{`"IdleRunningSandboxes":2`, `"Action":"stopped","SandboxLifecycle":1`, `"Action":"destroyed","SandboxLifecycle":1`} {
			if !strings.Contains(metrics.String(), want) {
				t.Errorf("metrics lack %s:\n%s", want, metrics.String())
			}
		}
		for id, want := range map[string]contract.SandboxStatus{
			ended.Sandbox.ProviderSandboxID:  contract.SandboxStopped,
			oneRun.Sandbox.ProviderSandboxID: contract.SandboxGone,
			live.Sandbox.ProviderSandboxID:   contract.SandboxAlive,
		} {
			if got, err := w.prov.(contract.StatusReader).Status(w.ctx, id); err != nil || got != want {
				t.Errorf("sandbox %s is %s (%v), want %s", id, got, err, want)
			}
		}
		if st, err := w.k.Get(w.ctx, "run-live"); err != nil || st.Status.Terminal() {
			t.Fatalf("the live run after the sweep: %+v %v", st, err)
		}
		rep, err = rp.Sweep(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if lc := rep.Lifecycle; lc.Stopped != 0 || lc.Destroyed != 0 || lc.IdleRunning != 0 {
			t.Fatalf("the second sweep's lifecycle %+v: want nothing more stopped or destroyed", lc)
		}
	})
}

// TestSweepCountsResume: a run past its TTL whose sandbox was stopped under it (by the
// provider's own rules, say) is expired by a sweep that starts the sandbox once to read its
// journal, and the report counts that resume.
func TestSweepCountsResume(t *testing.T) {
	onBothBackends(t, func(t *testing.T, w *world) {
		psid := w.startKept("run-stale", "th-stale", keeper.Setup{}).Sandbox.ProviderSandboxID
		if err := w.prov.(contract.Stopper).Stop(w.ctx, psid); err != nil {
			t.Fatal(err)
		}
		rep, err := w.reaper(2*time.Hour, nil, nil).Sweep(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Lifecycle.Resumed != 1 || rep.Outcomes.Expired != 1 {
			t.Fatalf("report %+v, lifecycle %+v: want the stale run expired and 1 resume", rep, rep.Lifecycle)
		}
		if got, err := w.prov.(contract.StatusReader).Status(w.ctx, psid); err != nil || got != contract.SandboxAlive {
			t.Fatalf("sandbox after the sweep: %s (%v), want it started", got, err)
		}
		if st, err := w.k.Get(w.ctx, "run-stale"); err != nil || st.Status != contract.StatusAborted {
			t.Fatalf("the stale run after the sweep: %+v %v", st, err)
		}
	})
}

// TestSweepStopsAtSetupGrace: a setup's own idle grace (keeper.Setup.IdleStopMs) through
// the reaper's own sweeps, the deployment's grace 10 minutes, on both backends
// (docs/design.md §5). Three threads' runs end now: one with a 2-minute grace, one with
// the deployment's, one with 20 minutes. Sweeps at end + 2 min 10 s, + 10 min 10 s and
// + 20 min 10 s each stop exactly the sandbox whose grace has just passed, and none before.
func TestSweepStopsAtSetupGrace(t *testing.T) {
	t.Parallel()
	onBothBackends(t, func(t *testing.T, w *world) {
		graces := []time.Duration{2 * time.Minute, 0, 20 * time.Minute} // 0: the deployment's
		ids := make([]string, len(graces))
		for i, g := range graces {
			runID := w.id("grace")
			res := w.startKept(runID, runID, keeper.Setup{IdleStopMs: g.Milliseconds()})
			ids[i] = res.Sandbox.ProviderSandboxID
			if _, err := w.k.SettleEnded(w.ctx, w.complete(res)); err != nil {
				t.Fatal(err)
			}
		}
		status := func(i int) contract.SandboxStatus {
			st, err := w.prov.(contract.StatusReader).Status(w.ctx, ids[i])
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		for n, at := range []time.Duration{2*time.Minute + 10*time.Second, keeper.DefaultIdleStop + 10*time.Second, 20*time.Minute + 10*time.Second} {
			rep, err := w.reaper(at, nil, func(c *reapCfg) { c.IdleStop = keeper.DefaultIdleStop }).Sweep(w.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Lifecycle.Stopped != 1 {
				t.Errorf("sweep at end+%s stopped %d sandboxes, want 1 (lifecycle %+v)", at, rep.Lifecycle.Stopped, rep.Lifecycle)
			}
			for i, g := range graces {
				want := contract.SandboxAlive
				if i <= n {
					want = contract.SandboxStopped
				}
				if got := status(i); got != want {
					t.Errorf("after the sweep at end+%s, the sandbox with grace %s is %s, want %s", at, g, got, want)
				}
			}
		}
	})
}

// TestSweepIdleStopLimit: the idle stops of one sweep are bounded, so a sweep ends within
// its invocation (docs/design.md §5), on both backends. Three threads' sandboxes idle past
// the grace: a sweep whose invocation ends within the deadline margin starts no stop; one
// with IdleStopLimit 2 stops two; the next stops the third.
func TestSweepIdleStopLimit(t *testing.T) {
	t.Parallel()
	onBothBackends(t, func(t *testing.T, w *world) {
		for range 3 {
			runID := w.id("limit")
			w.complete(w.startKept(runID, runID, keeper.Setup{}))
		}
		rp := w.reaper(keeper.DefaultIdleStop+time.Minute, nil, func(c *reapCfg) {
			c.IdleStop, c.IdleStopLimit, c.InstanceRetention = keeper.DefaultIdleStop, 2, -1
		})
		late, cancel := context.WithTimeout(w.ctx, reaper.DefaultDeadlineMargin-time.Second)
		defer cancel()
		for _, c := range []struct {
			name string
			ctx  context.Context
			want int
		}{{"within the deadline margin", late, 0}, {"first", w.ctx, 2}, {"second", w.ctx, 1}} {
			rep, err := rp.Sweep(c.ctx)
			if err != nil {
				t.Fatalf("%s sweep: %v", c.name, err)
			}
			if rep.Lifecycle.Stopped != c.want {
				t.Fatalf("%s sweep stopped %d, want %d (lifecycle %+v)", c.name, rep.Lifecycle.Stopped, c.want, rep.Lifecycle)
			}
		}
	})
}

// onBothBackends runs body on a memory world and on a DynamoDB world, each a parallel
// subtest.
func onBothBackends(t *testing.T, body func(t *testing.T, w *world)) {
	t.Helper()
	worlds := map[string]func(t *testing.T) *world{
		"memory": func(t *testing.T) *world { return newWorld(t, memstore.New(), localprocess.New(t.TempDir())) },
		"dynamodb": func(t *testing.T) *world {
			w, _ := dynamoWorld(t, localprocess.New(t.TempDir()))
			return w
		},
	}
	for name, nw := range worlds {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			body(t, nw(t))
		})
	}
}

// startKept starts runID on thread with the sandbox setup s (its ID and provider the
// world's), and destroys the sandbox when the test ends.
func (w *world) startKept(runID, thread string, s keeper.Setup) keeper.StartResult {
	w.t.Helper()
	s.ID, s.Provider = "a", w.prov.Name()
	res, err := w.k.Start(w.ctx, keeper.StartInput{RunID: runID, ThreadID: thread, Sandbox: s})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = w.prov.Destroy(w.ctx, res.Sandbox.ProviderSandboxID) })
	return res
}

// complete finishes res's run as completed.
func (w *world) complete(res keeper.StartResult) contract.RunRecord {
	w.t.Helper()
	rec, err := w.k.Finish(w.ctx, res.Run.RunID, res.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted})
	if err != nil {
		w.t.Fatal(err)
	}
	return rec
}
