package daytona_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit"
)

// TestIdleStopBilling is the idle-stop benchmark of docs/bench.md on the Daytona
// stand-in: running sandbox-minutes per run-minute before (nothing stops an idle
// sandbox) and after (stopped once its key's latest run ended the grace ago); a thread's
// next run must resume the same sandbox.
func TestIdleStopBilling(t *testing.T) {
	testkit.RunIdleBilling(t, func(t *testing.T, after bool) testkit.IdleWorld {
		f := newFake(t, testKey)
		clock := testkit.NewManualClock()
		f.SetClock(clock.Now)
		prov, _ := newProvider(t, f)
		w := testkit.IdleWorld{Provider: prov, Clock: clock, Running: f.TotalRunningTime, Resumes: true}
		if after {
			w.Stop = testkit.StopAfterGrace
		}
		return w
	})
}
