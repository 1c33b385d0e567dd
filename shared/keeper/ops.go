package keeper

import (
	"context"
	"errors"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

var errNotImplemented = errors.New("keeper: not implemented yet")

// New returns a Keeper over cfg; a missing backend or provider is an error.
func New(cfg Config) (*Keeper, error) {
	if cfg.Backend == nil || len(cfg.Providers) == 0 {
		return nil, errors.New("keeper: a backend and at least one provider are required")
	}
	k := &Keeper{cfg: cfg, providers: map[string]sandbox.Provider{}}
	for _, p := range cfg.Providers {
		k.providers[p.Name()] = p
	}
	return k, nil
}

// Start resolves the run's sandbox (resume, restore or create) and makes the caller the
// run's driver at epoch 1; a retried start of an existing run takes it over (§4.1).
func (k *Keeper) Start(ctx context.Context, in StartInput) (StartResult, error) {
	return StartResult{}, errNotImplemented
}

// Attach claims the run for a returning viewer: a new epoch, detachedSince cleared, the
// log fenced (§4.2). Refusals: ErrUnknownRun, ErrTerminalRun, ErrSandboxGone.
func (k *Keeper) Attach(ctx context.Context, runID string) (AttachResult, error) {
	return AttachResult{}, errNotImplemented
}

// Get returns the run; unknown is ErrUnknownRun.
func (k *Keeper) Get(ctx context.Context, runID string) (sandbox.RunRecord, error) {
	return sandbox.RunRecord{}, errNotImplemented
}

// ActiveRun returns the thread's active run, nil when idle.
func (k *Keeper) ActiveRun(ctx context.Context, threadID string) (*sandbox.RunRecord, error) {
	return nil, errNotImplemented
}

// Heartbeat extends the driver lease of epoch; refused: ErrSuperseded/ErrTerminalRun.
func (k *Keeper) Heartbeat(ctx context.Context, runID string, epoch int64) (HeartbeatResult, error) {
	return HeartbeatResult{}, errNotImplemented
}

// Detach records that the viewer left while the agent continues; first detach wins.
func (k *Keeper) Detach(ctx context.Context, runID string, epoch int64) (sandbox.RunRecord, error) {
	return sandbox.RunRecord{}, errNotImplemented
}

// Cancel sets cancelRequested then puts the in-band marker; terminal is a no-op.
func (k *Keeper) Cancel(ctx context.Context, runID string) (sandbox.RunRecord, error) {
	return sandbox.RunRecord{}, errNotImplemented
}

// CancelThread cancels the thread's active run; idle thread is ErrUnknownRun.
func (k *Keeper) CancelThread(ctx context.Context, threadID string) (sandbox.RunRecord, error) {
	return sandbox.RunRecord{}, errNotImplemented
}

// Append appends events at the driver's cursor (fenced by its epoch).
func (k *Keeper) Append(ctx context.Context, runID string, at sandbox.Cursor, events []sandbox.Event) (sandbox.AppendResult, error) {
	return sandbox.AppendResult{}, errNotImplemented
}

// Read returns events after `after`, waiting up to wait while none exist and the log is open.
func (k *Keeper) Read(ctx context.Context, runID string, after int64, limit int, wait time.Duration) (ReadResult, error) {
	return ReadResult{}, errNotImplemented
}

// Finish writes the terminal status fenced by the cursor's epoch, then closes the log;
// interrupted writes no finishedAt and leaves the log open. A retried finish is idempotent.
func (k *Keeper) Finish(ctx context.Context, runID string, at sandbox.Cursor, in FinishInput) (sandbox.RunRecord, error) {
	return sandbox.RunRecord{}, errNotImplemented
}

// Snapshot snapshots the run's sandbox and records latestSnapshotId on the row while it
// still names that sandbox; ErrUnsupported when the provider cannot snapshot.
func (k *Keeper) Snapshot(ctx context.Context, runID string, at sandbox.Cursor, label string) (Sandbox, error) {
	return Sandbox{}, errNotImplemented
}
