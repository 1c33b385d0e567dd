package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// instanceRows is the Store's contract.InstanceRows view. Rows hold strings, integers and
// the stale snapshot list, which is never changed in place (every change stores a new
// slice) and copied on the way out.
type instanceRows struct{ view }

var _ contract.InstanceRows = instanceRows{}

// GetRow returns the row of key with its incarnation; missing: (nil, nil). The stale
// snapshot list is copied: a caller never aliases the stored row.
func (v instanceRows) GetRow(ctx context.Context, key string) (*contract.InstanceRow, error) {
	row, err := load(v.s, v.s.instances, v.key(key))
	if row != nil {
		row.StaleSnapshots = slices.Clone(row.StaleSnapshots)
	}
	return row, err
}

// CreateRow writes rec stamped with incarnation only if no row exists; a row already
// carrying incarnation is this call's own retried write (success); else ErrConflict.
func (v instanceRows) CreateRow(ctx context.Context, rec contract.InstanceRecord, incarnation string) error {
	return v.locked(ctx, rec.Key, func(k tkey, row *contract.InstanceRow) error {
		if row != nil {
			if row.Incarnation == incarnation {
				return nil
			}
			return fmt.Errorf("memstore: create instance %q: row exists: %w", rec.Key, contract.ErrConflict)
		}
		v.s.putRow(k, contract.FullRow(rec, incarnation))
		return nil
	})
}

// ReplaceRow fully replaces the row while it has incarnation prev and no pending reclaim,
// stamping next; a row already at next is this call's own retried write; else ErrConflict.
func (v instanceRows) ReplaceRow(ctx context.Context, rec contract.InstanceRecord, prev, next string) error {
	return v.locked(ctx, rec.Key, func(k tkey, row *contract.InstanceRow) error {
		switch {
		case row != nil && row.Incarnation == next:
			return nil
		case row == nil:
			return fmt.Errorf("memstore: replace instance %q: no row: %w", rec.Key, contract.ErrConflict)
		case row.Incarnation != prev:
			return fmt.Errorf("memstore: replace instance %q: incarnation changed: %w", rec.Key, contract.ErrConflict)
		case row.Reclaiming != "":
			return fmt.Errorf("memstore: replace instance %q: reclaim pending: %w", rec.Key, contract.ErrConflict)
		}
		v.s.putRow(k, contract.FullRow(rec, next))
		return nil
	})
}

// Touch sets latestRunId and updatedAt while providerSandboxId is psid and no reclaim is
// pending; else ErrConflict (a missing row too). Repeating it is harmless.
func (v instanceRows) Touch(ctx context.Context, key, psid, latestRunID string, now int64) error {
	return v.modify(ctx, key, "touch", func(row *contract.InstanceRow) error {
		if row.ProviderSandboxID != psid || row.Reclaiming != "" || row.Lifecycle == contract.LifecycleStopping {
			return contract.ErrConflict
		}
		row.LatestRunID = latestRunID
		row.UpdatedAt = now
		row.ReclaimDue = 0 // a run resumed the sandbox: a deferred reclaim is off
		row.Lifecycle, row.LifecycleSince, row.StopToken, row.IdleSince = contract.LifecycleRunning, now, "", now
		return nil
	})
}

// SetSnapshot replaces latestSnapshotId prev by snapshotID while providerSandboxId is psid
// and latestSnapshotId is prev, moving prev to staleSnapshots; a row already at snapshotID
// is this call's own retried write; else ErrConflict.
func (v instanceRows) SetSnapshot(ctx context.Context, key, psid, prev, snapshotID string, now int64) error {
	return v.modify(ctx, key, "set snapshot", func(row *contract.InstanceRow) error {
		switch {
		case row.ProviderSandboxID != psid:
			return contract.ErrConflict
		case row.LatestSnapshotID == snapshotID:
			return errUnchanged
		case row.LatestSnapshotID != prev:
			return contract.ErrConflict
		}
		if prev != "" && !slices.Contains(row.StaleSnapshots, prev) {
			row.StaleSnapshots = append(slices.Clone(row.StaleSnapshots), prev)
			slices.Sort(row.StaleSnapshots)
		}
		row.LatestSnapshotID = snapshotID
		row.UpdatedAt = now
		return nil
	})
}

// DropStaleSnapshot removes snapshotID from staleSnapshots; absent, or a missing row, is
// success.
func (v instanceRows) DropStaleSnapshot(ctx context.Context, key, snapshotID string) error {
	err := v.modify(ctx, key, "drop stale snapshot", func(row *contract.InstanceRow) error {
		if !slices.Contains(row.StaleSnapshots, snapshotID) {
			return errUnchanged
		}
		row.StaleSnapshots = slices.DeleteFunc(slices.Clone(row.StaleSnapshots), func(s string) bool { return s == snapshotID })
		if len(row.StaleSnapshots) == 0 {
			row.StaleSnapshots = nil
		}
		return nil
	})
	if errors.Is(err, errNoRow) {
		return nil
	}
	return err
}

// MarkReclaiming tombstones the row with token while providerSandboxId and updatedAt are
// as read, updatedAt <= idleBefore and no other reclaim is pending; a row already carrying
// token is this call's own retried write; else ErrConflict.
func (v instanceRows) MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error {
	return v.modify(ctx, key, "mark reclaiming", func(row *contract.InstanceRow) error {
		switch {
		case row.Reclaiming == token:
			return errUnchanged
		case row.Reclaiming != "", row.ProviderSandboxID != psid, row.UpdatedAt != updatedAt,
			row.UpdatedAt > idleBefore:
			return contract.ErrConflict
		}
		row.Reclaiming, row.ReclaimDue = token, 0
		return nil
	})
}

// DeleteReclaimed deletes the row while it carries reclaim token; a missing row is
// success (a retried delete); another token or none is ErrConflict.
func (v instanceRows) DeleteReclaimed(ctx context.Context, key, token string) error {
	return v.locked(ctx, key, func(k tkey, row *contract.InstanceRow) error {
		switch {
		case row == nil:
			return nil
		case row.Reclaiming != token:
			return fmt.Errorf("memstore: delete reclaimed instance %q: not tombstoned by this token: %w", key, contract.ErrConflict)
		}
		v.s.dropRow(k)
		return nil
	})
}

// DeferReclaim sets reclaimDue (0 clears it) while providerSandboxId is psid and no reclaim
// is pending; else ErrConflict.
func (v instanceRows) DeferReclaim(ctx context.Context, key, psid string, due int64) error {
	return v.modify(ctx, key, "defer reclaim", func(row *contract.InstanceRow) error {
		if row.ProviderSandboxID != psid || row.Reclaiming != "" {
			return contract.ErrConflict
		}
		row.ReclaimDue = due
		return nil
	})
}

// MarkStopping marks the row stopping with token while providerSandboxId and updatedAt are
// as read, no reclaim is pending and the row is running or stopping; a row stopping with
// token is this call's own retried write; else ErrConflict.
func (v instanceRows) MarkStopping(ctx context.Context, key, psid string, updatedAt int64, token string, now int64) error {
	return v.modify(ctx, key, "mark stopping", func(row *contract.InstanceRow) error {
		switch {
		case row.Lifecycle == contract.LifecycleStopping && row.StopToken == token:
			return errUnchanged
		case row.ProviderSandboxID != psid, row.UpdatedAt != updatedAt, row.Reclaiming != "",
			row.Lifecycle != contract.LifecycleRunning && row.Lifecycle != contract.LifecycleStopping:
			return contract.ErrConflict
		}
		row.Lifecycle, row.LifecycleSince, row.StopToken = contract.LifecycleStopping, now, token
		return nil
	})
}

// SettleStop ends the stop carrying token (see contract.InstanceRows).
func (v instanceRows) SettleStop(ctx context.Context, key, token, lifecycle string, now int64) error {
	return v.modify(ctx, key, "settle stop", func(row *contract.InstanceRow) error {
		switch {
		case row.Lifecycle == lifecycle && row.StopToken == token:
			return errUnchanged
		case row.Lifecycle != contract.LifecycleStopping || row.StopToken != token:
			return contract.ErrConflict
		}
		row.Lifecycle, row.LifecycleSince = lifecycle, now
		if lifecycle == contract.LifecycleRunning {
			row.IdleSince = now
		} else {
			row.IdleSince = 0
		}
		return nil
	})
}

// DeferStop sets idleSince while providerSandboxId is psid, no reclaim is pending and the
// row is running; else ErrConflict.
func (v instanceRows) DeferStop(ctx context.Context, key, psid string, idleSince int64) error {
	return v.modify(ctx, key, "defer stop", func(row *contract.InstanceRow) error {
		if row.ProviderSandboxID != psid || row.Reclaiming != "" || row.Lifecycle != contract.LifecycleRunning {
			return contract.ErrConflict
		}
		row.IdleSince = idleSince
		return nil
	})
}

// errUnchanged tells modify that the condition failed on the caller's own landed write.
var errUnchanged = errors.New("unchanged")

// errNoRow marks modify's refusal of a missing row (besides ErrConflict).
var errNoRow = errors.New("no row")

// modify applies fn to a copy of the row and stores it when fn returns nil; a missing row
// or a failed condition is ErrConflict.
func (v instanceRows) modify(ctx context.Context, key, op string, fn func(*contract.InstanceRow) error) error {
	return v.locked(ctx, key, func(k tkey, row *contract.InstanceRow) error {
		if row == nil {
			return fmt.Errorf("memstore: %s instance %q: no row: %w: %w", op, key, contract.ErrConflict, errNoRow)
		}
		next := *row
		switch err := fn(&next); {
		case err == errUnchanged:
			return nil
		case err != nil:
			return fmt.Errorf("memstore: %s instance %q: condition failed: %w", op, key, err)
		}
		v.s.putRow(k, next)
		return nil
	})
}

// locked runs fn on the stored row of key in ctx's tenant (nil: none) with s.mu held: fn
// may store or drop it (putRow, dropRow), never keep the pointer.
func (v instanceRows) locked(ctx context.Context, key string, fn func(k tkey, row *contract.InstanceRow) error) error {
	k := v.key(key)
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	return fn(k, v.s.instances[k])
}

// putRow stores row and its index entries. Call with s.mu held.
func (s *Store) putRow(k tkey, row contract.InstanceRow) {
	s.instances[k] = &row
	s.reindexInstance(k, &row)
	s.written()
}

// dropRow deletes the row and its index entries. Call with s.mu held.
func (s *Store) dropRow(k tkey) {
	delete(s.instances, k)
	s.reindexInstance(k, nil)
	s.written()
}
