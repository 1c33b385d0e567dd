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
	idlerace.Test(t, func(t *testing.T, gate *idlerace.Gate) idlerace.Provider {
		prov, _ := newProvider(t, newFake(t, testKey))
		return gatedStop{prov, gate}
	})
}
