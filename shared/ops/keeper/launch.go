package keeper

import (
	"context"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// DefaultLaunchDeadline is the launch deadline of the dev server and the functions (their
// flag and parameter default); a Keeper's own zero means none.
const DefaultLaunchDeadline = 2 * time.Minute

// CodeAgentNotLaunched is the error code of a run ended because no agent launched within
// its launch deadline.
const CodeAgentNotLaunched = "agent-not-launched"

// LaunchDeadline returns the launch deadline in effect (0: none).
func (k *Keeper) LaunchDeadline() time.Duration { return k.cfg.LaunchDeadline }

// LaunchOverdue reports whether st is a live run with no agent known whose launch deadline
// has passed on this keeper's clock. Overdue is not yet missed: the journal or the log
// may show an agent the marker does not know of (agentrun.LaunchMissed decides).
func (k *Keeper) LaunchOverdue(st contract.RunState) bool {
	return st.LaunchBy > 0 && st.LaunchBy <= k.nowMs() && !st.Status.Terminal()
}

// ClearLaunch records that the run's agent launched (or its driver appended an event):
// its launch deadline no longer applies.
func (k *Keeper) ClearLaunch(ctx context.Context, runID string) error {
	_, err := k.st.Runs().ClearLaunch(ctx, runID)
	if err != nil {
		return fmt.Errorf("keeper: clear the launch deadline of %q: %w", runID, err)
	}
	return nil
}

// State returns the run's state, read consistently; unknown is ErrUnknownRun.
func (k *Keeper) State(ctx context.Context, runID string) (contract.RunState, error) {
	st, err := k.st.Runs().State(ctx, runID)
	if err != nil {
		return contract.RunState{}, fmt.Errorf("keeper: read run %q: %w", runID, err)
	}
	if st == nil {
		return contract.RunState{}, fmt.Errorf("keeper: run %q: %w", runID, contract.ErrUnknownRun)
	}
	return *st, nil
}

// HasEvents reports whether the run's log holds an event (its markers aside), reading
// from the start without waiting; pages of markers alone (fences, cancels) are stepped
// over, a few at most.
func (k *Keeper) HasEvents(ctx context.Context, runID string) (bool, error) {
	after := int64(0)
	for range 8 {
		page, err := k.Read(ctx, runID, after, DefaultReadLimit, 0)
		switch {
		case err != nil:
			return false, err
		case len(page.Events) > 0:
			return true, nil
		case page.Closed || page.Next <= after:
			return false, nil
		}
		after = page.Next
	}
	return false, fmt.Errorf("keeper: log of %q: no event in 8 pages of markers: %w", runID, ErrUnavailable)
}

// NotLaunchedInput is the terminal write of a run whose agent never launched by its
// launch deadline launchBy (ms).
func NotLaunchedInput(launchBy int64) FinishInput {
	by := time.UnixMilli(launchBy).UTC().Format(time.RFC3339)
	return FinishInput{Status: contract.StatusFailed, Error: &contract.RunError{Code: CodeAgentNotLaunched,
		Message: CodeAgentNotLaunched + ": no agent was launched by the run's launch deadline (" + by + ")"}}
}
