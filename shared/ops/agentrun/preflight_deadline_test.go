package agentrun_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

// deadlineExec answers every Exec "no journal" (exit 1) and records how long its context
// had left (-1: no deadline).
type deadlineExec struct {
	mu     sync.Mutex
	left   []time.Duration
	onExec func() // called after each Exec was recorded
}

func (x *deadlineExec) Exec(ctx context.Context, _, _ string) (contract.ExecResult, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		x.left = append(x.left, time.Until(dl))
	} else {
		x.left = append(x.left, -1)
	}
	if x.onExec != nil {
		x.onExec()
	}
	return contract.ExecResult{ExitCode: 1}, nil
}

func (x *deadlineExec) Start(context.Context, string, string) (int, error) { return 0, nil }
func (x *deadlineExec) Kill(context.Context, string, int) error            { return nil }

// TestAwaitJournalBoundsItsProbes: the preflight's journal probes never outlive its wait,
// even when the caller's context has no deadline (a hanging Exec would hold the attach).
func TestAwaitJournalBoundsItsProbes(t *testing.T) {
	ctx, cancel := context.WithCancel(contract.WithTenant(context.Background(), "")) // no deadline
	defer cancel()
	// The first probe misses and the run is live, so AwaitJournal would poll for the whole
	// wait: the first probe cancels the caller, which ends it.
	ex := &deadlineExec{onExec: cancel}
	const wait = time.Hour
	live := func(context.Context) (*contract.RunRecord, error) {
		return &contract.RunRecord{RunID: "r", Status: contract.StatusRunning}, nil
	}
	err := agentrun.AwaitJournal(ctx, ex, "psid", "dir", "r", live, wait, time.Millisecond)
	if err == nil {
		t.Fatal("AwaitJournal found a journal no probe reported")
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if len(ex.left) == 0 {
		t.Fatal("no journal probe ran")
	}
	for _, l := range ex.left {
		if l <= 0 || l > wait {
			t.Fatalf("probe deadlines %v; want each within the wait %v", ex.left, wait)
		}
	}
}
