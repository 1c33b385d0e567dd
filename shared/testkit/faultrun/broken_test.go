package faultrun_test

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// broken is a deliberately broken backend for the negative controls: it drops the fence.
// An append refused as superseded is put at the owner's tail anyway (under the owner's
// cursor, answered as if the stale epoch owned it), and a heartbeat or fenced update
// refused as superseded is repeated under the run's current epoch.
type broken struct {
	contract.Backend
	logHits, runHits *atomic.Int64
}

func newBroken(b contract.Backend) broken {
	return broken{Backend: b, logHits: new(atomic.Int64), runHits: new(atomic.Int64)}
}

func (b broken) Log() contract.EventLog    { return brokenLog{b.Backend.Log(), b} }
func (b broken) Runs() contract.FencedRuns { return brokenRuns{b.Backend.Runs(), b} }

type brokenLog struct {
	contract.EventLog
	b broken
}

// Append ignores the cursor's epoch once the store refused it.
func (l brokenLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	res, err := l.EventLog.Append(ctx, runID, at, events)
	if !errors.Is(err, contract.ErrSuperseded) {
		return res, err
	}
	st, serr := l.b.Backend.Runs().State(ctx, runID)
	if serr != nil || st == nil {
		return res, err
	}
	fence, ferr := l.EventLog.Fence(ctx, runID, st.Epoch())
	if ferr != nil {
		return res, err
	}
	res, err = l.EventLog.Append(ctx, runID, fence.Cursor, events)
	if err != nil {
		return res, err
	}
	l.b.logHits.Add(1)
	res.Cursor.Epoch = at.Epoch
	return res, nil
}

type brokenRuns struct {
	contract.FencedRuns
	b broken
}

func (r brokenRuns) current(ctx context.Context, runID string) (int64, bool) {
	st, err := r.FencedRuns.State(ctx, runID)
	if err != nil || st == nil {
		return 0, false
	}
	r.b.runHits.Add(1)
	return st.Epoch(), true
}

// Heartbeat repeats a superseded heartbeat under the current epoch.
func (r brokenRuns) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (contract.RunState, error) {
	st, err := r.FencedRuns.Heartbeat(ctx, runID, epoch, leaseUntil)
	if errors.Is(err, contract.ErrSuperseded) {
		if cur, ok := r.current(ctx, runID); ok {
			return r.FencedRuns.Heartbeat(ctx, runID, cur, leaseUntil)
		}
	}
	return st, err
}

// UpdateFenced repeats a superseded update under the current epoch.
func (r brokenRuns) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	st, err := r.FencedRuns.UpdateFenced(ctx, runID, epoch, p)
	if errors.Is(err, contract.ErrSuperseded) {
		if cur, ok := r.current(ctx, runID); ok {
			return r.FencedRuns.UpdateFenced(ctx, runID, cur, p)
		}
	}
	return st, err
}
