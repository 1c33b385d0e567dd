package daytona_test

import (
	"context"
	"testing"

	"github.com/sandkeep/sandkeep/shared/providers/daytona"
	"github.com/sandkeep/sandkeep/shared/testkit/idlerace"
)

// gatedStop is the Daytona provider whose Stop waits at the gate before it asks Daytona.
type gatedStop struct {
	*daytona.Provider
	gate *idlerace.Gate
}

func (p gatedStop) Stop(ctx context.Context, id string) error {
	p.gate.Hold(ctx, id)
	return p.Provider.Stop(ctx, id)
}

// TestReaperStopRacesStart: the reaper's idle-stop sweep, held between marking the row
// stopping and asking the Daytona stand-in to stop, meets a keeper start on the thread; the
// start waits for the stop (sandbox:<key>) and resumes the same sandbox, left started with
// its row running. A sweep whose stop skips the lock (the broken seam) is caught: the start
// is handed the sandbox the stop then stops — on both backends.
func TestReaperStopRacesStart(t *testing.T) {
	t.Parallel()
	for name, nb := range idlerace.Backends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			race := func(broken bool) idlerace.Result {
				prov, _ := newProvider(t, newFake(t, testKey))
				gate := idlerace.NewGate()
				return idlerace.Run(t, idlerace.Race{Backend: nb(t), Provider: gatedStop{prov, gate}, Gate: gate, Broken: broken})
			}
			if res := race(false); !res.Serialized() {
				t.Fatalf("the start was handed a sandbox stopped under it: %+v", res)
			}
			if res := race(true); res.Serialized() {
				t.Fatalf("the broken variant (a sweep's stop that skips the lock) was not caught: %+v", res)
			}
		})
	}
}
