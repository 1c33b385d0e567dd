package daytona_test

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

// TestIdleStopBilling is the idle-stop benchmark of docs/bench.md on the Daytona
// stand-in, the reaper sweeping every simulated minute: running sandbox-minutes per
// run-minute before (the reaper without its idle stop, nothing at a run's end) and after
// (stopped once its key's latest run ended the grace ago; a reuse-"none" sandbox destroyed
// at its run's end); a thread's next run must resume the same sandbox.
func TestIdleStopBilling(t *testing.T) {
	testkit.RunIdleBilling(t, func(t *testing.T, after bool) testkit.IdleWorld {
		f := newFake(t, testKey)
		clock := manualclock.New()
		f.SetClock(clock.Now)
		prov, _ := newProvider(t, f)
		w := testkit.IdleWorld{Provider: prov, Clock: clock, Running: f.TotalRunningTime, Resumes: true, Pace: reaper.DefaultIdleStopLimit,
			Stop: testkit.ReaperStop(func(c *reaper.Config) { c.IdleStop = -1 })}
		if after {
			w.Stop, w.SettleEnds = testkit.ReaperStop(func(c *reaper.Config) { c.IdleStop = testkit.IdleGrace }), true
		}
		return w
	})
}

// TestLiveRunNeverStopped: on the Daytona stand-in, a run heartbeated for 30 minutes and
// one detached past the idle grace within its TTL keep their sandbox running throughout:
// the idle stop never stops a live run's sandbox (docs/design.md §5).
func TestLiveRunNeverStopped(t *testing.T) {
	var f *fakeDaytona
	testkit.RunLiveNeverStopped(t, func(t *testing.T) testkit.IdleWorld {
		f = newFake(t, testKey)
		clock := manualclock.New()
		f.SetClock(clock.Now)
		prov, _ := newProvider(t, f)
		return testkit.IdleWorld{Provider: prov, Clock: clock, Running: f.TotalRunningTime}
	}, func(psid string) time.Duration { return f.RunningTime(psid) }, nil)
}

// TestLiveRunNeverStoppedControl: TestLiveRunNeverStopped fails, both cases, when the
// reaper's view hides live runs (testkit.HideLiveRuns).
func TestLiveRunNeverStoppedControl(t *testing.T) {
	testkit.LiveNeverStoppedControl(t, "TestLiveRunNeverStopped")
}
