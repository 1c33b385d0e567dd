package keeper

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/wakeset"
)

// RunKey names a run across tenants: a wake for one tenant's run never wakes another's.
type RunKey struct{ Tenant, RunID string }

// LogWake wakes this process's long polls of a run when this keeper lands a write to the
// run's log (an append, a cancel marker, a close, a terminal write) — on every backend, so
// a reader sharing the process with the writer (the pump, POST events) is answered at once
// even where the backend itself is only polled. Config.Wake; default a wakeset.Set.
type LogWake interface {
	// Wait returns a channel closed at the next Wake(key) after the call; stop must be called.
	Wait(key RunKey) (woken <-chan struct{}, stop func())
	// Wake closes the channel of every waiter on key.
	Wake(key RunKey)
}

var _ LogWake = (*wakeset.Set[RunKey])(nil)

// LogPush is told of every write this keeper lands (or may have landed) to a run's log
// that stores events or ends it (not a cancel marker), on the writer's context, right
// after its wakes: the deployed push posts what was stored to the run's subscribers
// (shared/api/push, docs/design.md §8.1). Whatever stores events — appends, pumps,
// finishes and closes, the reaper's finalization — passes this one seam. Landed runs on
// the request path (a function's process may be frozen once it has answered) and bounds
// its own time; its failures are its own to log. Config.Push.
type LogPush interface {
	Landed(ctx context.Context, key RunKey, l Landing)
}

// Landing is what one write stored, as far as its writer knows it.
type Landing struct {
	// After: no event lies between it and what the write stored (the writer's cursor
	// before the write, less one; 0 when the writer holds none).
	After int64
	// Last is the log's last offset the writer knows (its append's), 0 when it knows none.
	Last int64
	// Events are the events stored, with their offsets, when the writer knows them all
	// (an append that stepped over no marker); nil: read the log after After.
	Events []contract.Event
}

// landed wakes this process's readers of runID in ctx's tenant after a write to its log
// (landed or maybe: a lost response may have stored it; a spurious wake costs one read),
// then tells Config.Push what it knows of the write.
func (k *Keeper) landed(ctx context.Context, runID string, l Landing) {
	if key, ok := k.woke(ctx, runID); ok && k.cfg.Push != nil {
		k.cfg.Push.Landed(ctx, key, l)
	}
}

// appended is the Landing of an append of events at `at` that ended in res: the events
// with their offsets when they fill (at.Next−1, res.Last] exactly (no marker stepped over).
func appended(at contract.Cursor, events []contract.Event, res contract.AppendResult, err error) Landing {
	l := Landing{After: max(at.Next-1, 0), Last: res.Last}
	if err != nil || res.Last-at.Next+1 != int64(len(events)) {
		return l
	}
	l.Events = make([]contract.Event, len(events))
	for i, e := range events {
		l.Events[i] = contract.Event{Offset: at.Next + int64(i), Src: e.Src, Data: e.Data}
	}
	return l
}

// woke wakes this process's readers of runID only (a write that stores no event).
func (k *Keeper) woke(ctx context.Context, runID string) (RunKey, bool) {
	tenant, err := contract.Tenant(ctx)
	if err != nil { // without one the write was refused
		return RunKey{}, false
	}
	key := RunKey{Tenant: tenant, RunID: runID}
	k.cfg.Wake.Wake(key)
	return key, true
}
