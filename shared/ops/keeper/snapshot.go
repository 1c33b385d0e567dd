package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Snapshot snapshots the run's sandbox and records latestSnapshotId on the row while it
// still names that sandbox; ErrUnsupported when the provider cannot snapshot.
func (k *Keeper) Snapshot(ctx context.Context, runID string, at contract.Cursor, label string) (Sandbox, error) {
	cur, err := k.st.Runs().State(ctx, runID)
	switch {
	case err != nil:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, err)
	case cur == nil:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, contract.ErrUnknownRun)
	case cur.Status.Terminal():
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, contract.ErrTerminalRun)
	case cur.Epoch() != at.Epoch:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q at epoch %d, run is at %d: %w",
			runID, at.Epoch, cur.Epoch(), contract.ErrSuperseded)
	case cur.SandboxKey == nil:
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: no sandbox key: %w", runID, contract.ErrSandboxGone)
	}
	key := *cur.SandboxKey
	row, err := k.st.Instances().GetRow(ctx, key)
	if err != nil {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: read instance: %w", runID, err)
	}
	if reason := sandboxGone(*cur, row); reason != "" {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %s: %w", runID, reason, contract.ErrSandboxGone)
	}
	prov, ok := k.providers[row.Provider]
	if !ok {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: provider %q is not configured: %w", runID, row.Provider, ErrUnsupported)
	}
	snap, ok := prov.(contract.Snapshotter)
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
	if errors.Is(err, contract.ErrSandboxGone) {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: %w", runID, err)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: provider: %w: %w", runID, ErrUnavailable, err)
	}
	now := k.nowMs()
	prev, err := k.recordSnapshot(ctx, key, psid, row.LatestSnapshotID, id, now)
	if errors.Is(err, contract.ErrConflict) {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: the row moved to another sandbox meanwhile: %w", runID, contract.ErrSandboxGone)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("keeper: snapshot %q: record snapshot: %w", runID, err)
	}
	if prev != "" {
		k.deleteStaleSnapshot(ctx, prov, key, prev)
	}
	return Sandbox{Key: key, Provider: row.Provider, ProviderSandboxID: psid, LatestSnapshotID: id}, nil
}

// recordSnapshot makes id the row's latest snapshot in place of prev (as read), re-reading
// when a concurrent snapshot got there first; it returns the snapshot id superseded ("" =
// none). ErrConflict: the row no longer names psid.
func (k *Keeper) recordSnapshot(ctx context.Context, key, psid, prev, id string, now int64) (string, error) {
	for attempt := 1; ; attempt++ {
		err := k.st.Instances().SetSnapshot(ctx, key, psid, prev, id, now)
		if !errors.Is(err, contract.ErrConflict) || attempt >= maxSnapshotRecords {
			return prev, err
		}
		cur, rerr := k.st.Instances().GetRow(ctx, key)
		if rerr != nil {
			return "", rerr
		}
		if cur == nil || cur.ProviderSandboxID != psid {
			return "", err
		}
		prev = cur.LatestSnapshotID // another snapshot landed meanwhile: supersede that one
	}
}

// maxSnapshotRecords bounds recordSnapshot's attempts against concurrent snapshots.
const maxSnapshotRecords = 5

// staleSnapshotTimeout bounds the request's own attempt to delete a superseded snapshot; a
// slow or failed delete is left to the reaper (the row lists it), never failing the request.
const staleSnapshotTimeout = 5 * time.Second

// deleteStaleSnapshot deletes a superseded snapshot through the provider and drops it from
// the row; on any failure it stays listed on the row, and the reaper retries it.
func (k *Keeper) deleteStaleSnapshot(ctx context.Context, prov contract.Provider, key, snap string) {
	del, ok := prov.(contract.SnapshotDeleter)
	if !ok {
		return // the reaper drops what its provider cannot delete
	}
	dctx, cancel := context.WithTimeout(ctx, min(staleSnapshotTimeout, k.cfg.DestroyTimeout))
	defer cancel()
	err := k.providerErr(ctx, prov, del.DeleteSnapshot(dctx, snap))
	if err == nil {
		err = k.st.Instances().DropStaleSnapshot(ctx, key, snap)
	}
	if err != nil {
		k.cfg.Logger.WarnContext(ctx, "keeper: deleting a superseded snapshot failed; the reaper retries it",
			"key", key, "snapshotId", snap, "err", err)
	}
}

// DeleteRowSnapshots deletes through prov the snapshots of the row at key tombstoned with
// tok (its latest and the superseded ones still listed): nothing can restore from them
// once the row is deleted. Each delete has its own timeout; a provider that cannot delete
// snapshots has none to delete here; a row gone or no longer this reclaim's is left alone.
// rows is the store layer's (shared/store), which repeats a failed call.
func DeleteRowSnapshots(ctx context.Context, rows contract.InstanceRows, prov contract.Provider, key, tok string, timeout time.Duration) error {
	del, ok := prov.(contract.SnapshotDeleter)
	if !ok {
		return nil
	}
	row, err := rows.GetRow(ctx, key)
	if err != nil {
		return fmt.Errorf("read row: %w", err)
	}
	if row == nil || row.Reclaiming != tok {
		return nil
	}
	snaps := row.StaleSnapshots
	if row.LatestSnapshotID != "" {
		snaps = append(snaps, row.LatestSnapshotID)
	}
	for _, snap := range snaps {
		dctx, cancel := detached(ctx, timeout)
		err := del.DeleteSnapshot(dctx, snap)
		cancel()
		if err != nil {
			return fmt.Errorf("delete snapshot %s: %w", snap, err)
		}
	}
	return nil
}
