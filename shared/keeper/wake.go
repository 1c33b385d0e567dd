package keeper

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/wakeset"
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

// landed wakes this process's readers of runID in ctx's tenant after a write to its log
// (landed or maybe: a lost response may have stored it; a spurious wake costs one read).
func (k *Keeper) landed(ctx context.Context, runID string) {
	if tenant, err := sandbox.Tenant(ctx); err == nil { // without one the write was refused
		k.cfg.Wake.Wake(RunKey{Tenant: tenant, RunID: runID})
	}
}
