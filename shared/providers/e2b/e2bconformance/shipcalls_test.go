package e2bconformance

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

// TestShippedRunProviderCalls: a run shipped from its sandbox costs E2B its launch's
// requests (control plane and envd) and a bound that does not grow with its length: a
// 1-minute and a 5-minute run (on the stand-in's clock, the reaper sweeping every
// simulated minute) make the same number of requests after their launch
// (docs/design.md §8.2).
func TestShippedRunProviderCalls(t *testing.T) {
	world := func(t *testing.T) clitest.ShipWorld {
		clock := manualclock.New()
		p, f := fakeProvider(t, clock, nil)
		return clitest.ShipWorld{Provider: p, Advance: clock.Add, Now: clock.Now, Calls: f.Total}
	}
	one := clitest.ShippedRunCalls(t, world(t), time.Minute)
	five := clitest.ShippedRunCalls(t, world(t), 5*time.Minute)
	t.Logf("E2B requests: 1-minute run %d at launch + %d after; 5-minute run %d + %d", one.Launch, one.During, five.Launch, five.During)
	if five.During != one.During || five.During > 2 {
		t.Fatalf("requests after the launch: %d in 1 minute, %d in 5: want equal, at most 2", one.During, five.During)
	}
}
