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
// after its wakes: the deployed push posts what was stored
// to the run's subscribers (shared/api/push, docs/design.md §8.1). Whatever stores events —
// appends, pumps, finishes and closes, the reaper's finalization — passes this one seam.
// last is the log's last offset the writer knows (its append's), 0 when it knows none.
// Landed runs on the request path (a function's process may be frozen once it has
// answered) and bounds its own time; its failures are its own to log. Config.Push.
type LogPush interface {
	Landed(ctx context.Context, key RunKey, last int64)
}

// landed wakes this process's readers of runID in ctx's tenant after a write to its log
// (landed or maybe: a lost response may have stored it; a spurious wake costs one read),
// then tells Config.Push.
func (k *Keeper) landed(ctx context.Context, runID string) { k.landedAt(ctx, runID, 0) }

// landedAt is landed by a writer that knows the log's last offset.
func (k *Keeper) landedAt(ctx context.Context, runID string, last int64) {
	if key, ok := k.woke(ctx, runID); ok && k.cfg.Push != nil {
		k.cfg.Push.Landed(ctx, key, last)
	}
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
