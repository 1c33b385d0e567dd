package keeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Snapshot snapshots the run's sandbox and records latestSnapshotId on the row while it
// still names that sandbox; ErrUnsupported when the provider cannot snapshot.
func (k *Keeper) Snapshot(ctx context.Context, runID string, at sandbox.Cursor, label string) (Sandbox, error) {
	cur, err := retry(ctx, func() (*sandbox.RunState, error) { return k.cfg.Backend.Runs().State(ctx, runID) })
	switch {
	case err != nil:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, err)
	case cur == nil:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, sandbox.ErrUnknownRun)
	case cur.Status.Terminal():
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, sandbox.ErrTerminalRun)
	case cur.Epoch() != at.Epoch:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q at epoch %d, run is at %d: %w",
			runID, at.Epoch, cur.Epoch(), sandbox.ErrSuperseded)
	case cur.SandboxKey == nil:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: no sandbox key: %w", runID, sandbox.ErrSandboxGone)
	}
	key := *cur.SandboxKey
	row, err := retry(ctx, func() (*sandbox.InstanceRow, error) { return k.cfg.Backend.Instances().GetRow(ctx, key) })
	if err != nil {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: read instance: %w", runID, err)
	}
	if reason := sandboxGone(*cur, row); reason != "" {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %s: %w", runID, reason, sandbox.ErrSandboxGone)
	}
	prov, ok := k.providers[row.Provider]
	if !ok {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: provider %q is not configured: %w", runID, row.Provider, ErrUnsupported)
	}
	snap, ok := prov.(sandbox.Snapshotter)
	if !ok {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: provider %q: %w", runID, prov.Name(), ErrUnsupported)
	}
	if label == "" {
		label = "run-" + runID
	}
	psid := row.ProviderSandboxID
	sctx, cancel := context.WithTimeout(ctx, k.cfg.CreateTimeout) // a hanging provider never holds the request
	id, err := snap.Snapshot(sctx, psid, label)
	cancel()
	err = k.providerErr(ctx, prov, err)
	if errors.Is(err, sandbox.ErrSandboxGone) {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, err)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: provider: %w: %w", runID, ErrUnavailable, err)
	}
	now := k.nowMs()
	err = retry0(ctx, func() error { return k.cfg.Backend.Instances().SetSnapshot(ctx, key, psid, id, now) })
	if errors.Is(err, sandbox.ErrConflict) {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: the row moved to another sandbox meanwhile: %w", runID, sandbox.ErrSandboxGone)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: record snapshot: %w", runID, err)
	}
	return Sandbox{Key: key, Provider: row.Provider, ProviderSandboxID: psid, LatestSnapshotID: id}, nil
}
