package e2b

import (
	"context"
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit/idlerace"
)

// gatedPause is the E2B provider whose Stop (a pause) waits at the gate before it asks E2B.
type gatedPause struct {
	*Provider
	gate *idlerace.Gate
}

func (p gatedPause) Stop(ctx context.Context, id string) error {
	p.gate.Hold(ctx, id)
	return p.Provider.Stop(ctx, id)
}

// TestReaperStopRacesStart: the reaper's idle-stop sweep, held between marking the row
// stopping and asking the E2B stand-in to pause, meets a keeper start on the thread; the
// start waits for the pause (sandbox:<key>) and resumes the same sandbox, left running with
// its row running. A sweep whose stop skips the lock (the broken seam) is caught: the start
// is handed the sandbox the pause then stops — on both backends.
func TestReaperStopRacesStart(t *testing.T) {
	t.Parallel()
	idlerace.Test(t, func(t *testing.T, gate *idlerace.Gate) idlerace.Provider {
		return gatedPause{newFake(t).provider(), gate}
	})
}
