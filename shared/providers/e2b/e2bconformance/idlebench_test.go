package e2bconformance

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/e2b"
	"github.com/sandkeep/sandkeep/shared/providers/e2b/internal/e2bfake"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

// TestIdleStopBilling is the idle-stop benchmark of docs/bench.md on the E2B stand-in,
// whose sandboxes end when their time to live runs out, the reaper sweeping every
// simulated minute. Before: the previous defaults, no idle stop and a time to live that
// kills (the thread's next run gets a new sandbox). After: paused by the reaper once the
// key's latest run ended the grace ago (autoPause on), a reuse-"none" sandbox destroyed at
// its run's end, and a thread's next run resumes the same sandbox.
func TestIdleStopBilling(t *testing.T) {
	testkit.RunIdleBilling(t, func(t *testing.T, after bool) testkit.IdleWorld {
		clock := manualclock.New()
		p, f := fakeProvider(t, clock, func(c *e2b.Config) { c.KillOnTimeout = !after })
		w := testkit.IdleWorld{Provider: p, Clock: clock, Running: f.TotalRunningTime, Pace: reaper.DefaultIdleStopLimit,
			Stop: testkit.ReaperStop(func(c *reaper.Config) { c.IdleStop = -1 })}
		if after {
			w.Stop, w.Resumes, w.SettleEnds = testkit.ReaperStop(func(c *reaper.Config) { c.IdleStop = testkit.IdleGrace }), true, true
		}
		return w
	})
}

// TestLiveRunNeverPaused: on the E2B stand-in (time to live 22 minutes: detached TTL 15 +
// sweep 5 + 2), a run whose host or shipper heartbeats for 30 minutes, and one detached
// past the idle grace within its TTL, keep their sandbox running the whole time: the
// keeper extends its lifetime on heartbeats (a few calls per 11-minute window), the
// reaper's probe while detached, and the idle stop leaves a live run's sandbox alone.
func TestLiveRunNeverPaused(t *testing.T) {
	var f *e2bfake.Server
	testkit.RunLiveNeverStopped(t, func(t *testing.T) testkit.IdleWorld {
		clock := manualclock.New()
		var p *e2b.Provider
		p, f = fakeProvider(t, clock, nil)
		return testkit.IdleWorld{Provider: p, Clock: clock, Running: f.TotalRunningTime}
	}, func(psid string) time.Duration { return f.RunningTime(psid) }, func() int { return f.Count("setSandboxTimeout") })
}

// TestLiveRunNeverPausedControl: TestLiveRunNeverPaused fails, both cases, when the
// reaper's view hides live runs (testkit.HideLiveRuns): it would catch an idle stop that
// took a working sandbox for an idle one.
func TestLiveRunNeverPausedControl(t *testing.T) {
	testkit.LiveNeverStoppedControl(t, "TestLiveRunNeverPaused")
}
