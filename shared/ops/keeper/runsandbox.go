package keeper

import (
	"context"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// RunSandbox is a run's state with the sandbox it runs in, as two consistent reads (the
// state, then its instance row) found them.
type RunSandbox struct {
	State    contract.RunState
	Sandbox  Sandbox
	Provider contract.Provider // the configured provider the row names
}

// RunSandbox reads the run's state, then its instance row (two consistent reads), and
// resolves the provider. Refusals: ErrUnknownRun; ErrSandboxGone when the run has no
// sandbox key or its row is gone, tombstoned or names another sandbox; ErrUnsupported when
// the row names a provider this keeper lacks. A terminal run is returned as it is: callers
// decide.
func (k *Keeper) RunSandbox(ctx context.Context, runID string) (RunSandbox, error) {
	cur, err := k.st.Runs().State(ctx, runID)
	if err != nil {
		return RunSandbox{}, fmt.Errorf("keeper: read run %q: %w", runID, err)
	}
	if cur == nil {
		return RunSandbox{}, fmt.Errorf("keeper: run %q: %w", runID, contract.ErrUnknownRun)
	}
	return k.SandboxOf(ctx, *cur)
}

// SandboxOf is RunSandbox for a state the caller already read consistently (a refused
// claim's, contract.ClaimRefused): one consistent read, the instance row.
func (k *Keeper) SandboxOf(ctx context.Context, st contract.RunState) (RunSandbox, error) {
	runID := st.RunID
	if st.SandboxKey == nil || *st.SandboxKey == "" {
		return RunSandbox{State: st}, fmt.Errorf("keeper: run %q has no sandbox: %w", runID, contract.ErrSandboxGone)
	}
	key := *st.SandboxKey
	row, err := k.st.Instances().GetRow(ctx, key)
	if err != nil {
		return RunSandbox{State: st}, fmt.Errorf("keeper: read the sandbox of run %q: %w", runID, err)
	}
	if reason := sandboxGone(st, row); reason != "" {
		return RunSandbox{State: st}, fmt.Errorf("keeper: run %q: %s: %w", runID, reason, contract.ErrSandboxGone)
	}
	prov, ok := k.providers[row.Provider]
	if !ok {
		return RunSandbox{State: st}, fmt.Errorf("keeper: run %q: provider %q is not configured: %w", runID, row.Provider, ErrUnsupported)
	}
	return RunSandbox{
		State: st,
		Sandbox: Sandbox{Key: key, Provider: row.Provider, ProviderSandboxID: row.ProviderSandboxID,
			LatestSnapshotID: row.LatestSnapshotID},
		Provider: prov,
	}, nil
}

// Provider returns the configured provider of that name (nil when this keeper lacks it).
func (k *Keeper) Provider(name string) contract.Provider { return k.providers[name] }

// Fence makes epoch the owner of the run's log (again) and returns the owner's cursor: a
// writer that met another batch at its cursor (ErrConflict) learns where the log stands.
// Refusals: ErrSuperseded (a later epoch owns the log), ErrLogClosed.
func (k *Keeper) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	res, err := k.st.Log().Fence(ctx, runID, epoch)
	if err != nil {
		return contract.AppendResult{}, fmt.Errorf("keeper: fence log of %q at epoch %d: %w", runID, epoch, err)
	}
	return res, nil
}
