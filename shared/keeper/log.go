package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Read sizing and long-poll pacing.
const (
	DefaultReadLimit = 100
	readPollFirst    = 25 * time.Millisecond
	readPollMax      = time.Second
)

// Append appends events at the driver's cursor (fenced by its epoch).
func (k *Keeper) Append(ctx context.Context, runID string, at sandbox.Cursor, events []sandbox.Event) (sandbox.AppendResult, error) {
	if err := sandbox.CheckEvents(events); err != nil {
		return sandbox.AppendResult{}, err
	}
	// A repeated Append of the same batch at the same cursor stores it once (docs/design.md §2.4).
	res, err := retry(ctx, func() (sandbox.AppendResult, error) {
		return k.cfg.Backend.Log().Append(ctx, runID, at, events)
	})
	if err != nil {
		return sandbox.AppendResult{}, fmt.Errorf("keeper: append to %q at epoch %d: %w", runID, at.Epoch, err)
	}
	return res, nil
}

// Read returns events after `after`, waiting up to wait while none exist and the log is open.
func (k *Keeper) Read(ctx context.Context, runID string, after int64, limit int, wait time.Duration) (ReadResult, error) {
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	// The wait runs on the monotonic clock: cfg.Now may be a test's frozen wall clock.
	deadline := time.Now().Add(wait)
	pause := readPollFirst
	for {
		type page struct {
			events []sandbox.Event
			next   int64
			closed bool
		}
		p, err := retry(ctx, func() (page, error) {
			evs, next, closed, err := k.cfg.Backend.Log().Read(ctx, runID, after, limit)
			return page{evs, next, closed}, err
		})
		if err != nil {
			return ReadResult{}, fmt.Errorf("keeper: read log of %q after %d: %w", runID, after, err)
		}
		res := ReadResult{Events: p.events, Next: p.next, Closed: p.closed}
		left := time.Until(deadline)
		if len(p.events) > 0 || p.closed || left <= 0 {
			return res, nil
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return res, fmt.Errorf("keeper: read log of %q: %w", runID, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, readPollMax)
	}
}

// Finish writes the terminal status fenced by the cursor's epoch, then closes the log;
// interrupted writes no finishedAt and leaves the log open. A retried finish is idempotent.
func (k *Keeper) Finish(ctx context.Context, runID string, at sandbox.Cursor, in FinishInput) (sandbox.RunRecord, error) {
	p, err := k.finishPatch(in)
	if err != nil {
		return sandbox.RunRecord{}, err
	}
	st, err := retry(ctx, func() (sandbox.RunState, error) {
		return k.cfg.Backend.Runs().UpdateFenced(ctx, runID, at.Epoch, p)
	})
	if errors.Is(err, sandbox.ErrTerminalRun) {
		// A retried finish whose first attempt landed (possibly with another status, or
		// whose close was lost): the run is terminal at this very epoch, so it was ours.
		cur, rerr := retry(ctx, func() (*sandbox.RunState, error) { return k.cfg.Backend.Runs().State(ctx, runID) })
		if rerr == nil && cur != nil && cur.Status.Terminal() && cur.Epoch() == at.Epoch {
			st, err = *cur, nil
		}
	}
	if err != nil {
		// Never close on a refusal: the log may belong to a successor.
		return sandbox.RunRecord{}, fmt.Errorf("keeper: finish %q at epoch %d: %w", runID, at.Epoch, err)
	}
	if !st.Status.Terminal() {
		return st.RunRecord, nil // interrupted: a pause, the log stays open
	}
	err = retry0(ctx, func() error { return k.cfg.Backend.Log().Close(ctx, runID, at) })
	if err != nil && !errors.Is(err, sandbox.ErrLogClosed) {
		return sandbox.RunRecord{}, fmt.Errorf("keeper: close log of %q at epoch %d: %w", runID, at.Epoch, err)
	}
	return st.RunRecord, nil
}

// finishPatch builds Finish's fenced write: the status, finishedAt unless interrupted,
// and the error and usage when given.
func (k *Keeper) finishPatch(in FinishInput) (sandbox.RunPatch, error) {
	if in.Status != sandbox.StatusInterrupted && !in.Status.Terminal() {
		return sandbox.RunPatch{}, sandbox.Invalid("status", "must be completed, failed, aborted or interrupted, not %q", in.Status)
	}
	p := sandbox.RunPatch{Status: sandbox.Set(in.Status)}
	if in.Status.Terminal() {
		p.FinishedAt = sandbox.Set(k.nowMs())
	}
	if in.Error != nil {
		p.Error = sandbox.Set(*in.Error)
	}
	if in.CancelRequested {
		p.CancelRequested = sandbox.Set(true)
	}
	if len(in.Usage) > 0 {
		if !json.Valid(in.Usage) {
			return sandbox.RunPatch{}, sandbox.Invalid("usage", "not a JSON document")
		}
		p.Usage = sandbox.Set(in.Usage)
	}
	return p, nil
}
