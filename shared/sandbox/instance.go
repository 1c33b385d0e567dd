package sandbox

import "context"

// InstanceRecord maps a sandbox key to the provider sandbox a thread resumes.
type InstanceRecord struct {
	Key               string `json:"key"`
	Provider          string `json:"provider"`
	ProviderSandboxID string `json:"providerSandboxId"`
	LatestSnapshotID  string `json:"latestSnapshotId,omitempty"` // "" = absent
	ThreadID          string `json:"threadId"`
	LatestRunID       string `json:"latestRunId,omitempty"` // "" = absent
	UpdatedAt         int64  `json:"updatedAt"`
}

// InstanceStore is the reference instance map, scoped by the context's tenant. It is not
// part of the backend contract (no operation calls it): refstore.Instances builds it on
// InstanceRows.
type InstanceStore interface {
	// Get returns the record of key; a missing key returns (nil, nil), never an error.
	Get(ctx context.Context, key string) (*InstanceRecord, error)
	// Upsert fully replaces the record at rec.Key: omitted optionals are cleared.
	Upsert(ctx context.Context, rec InstanceRecord) error
	// Delete removes key; deleting a missing key is a no-op returning nil.
	Delete(ctx context.Context, key string) error
}

// InstanceRow is an instance record with the version metadata the conditional
// primitives are guarded by.
type InstanceRow struct {
	InstanceRecord
	// Incarnation is stamped fresh (random) by every full write of the row.
	Incarnation string `json:"incarnation"`
	// Reclaiming is the reclaimer's token while a reclaim is pending ("" = none). A row
	// with a pending reclaim is a tombstone: it is never resumed.
	Reclaiming string `json:"reclaiming,omitempty"`
	// ReclaimDue is when a reclaim the reaper deferred (the row was touched too recently
	// to tombstone) is retried, epoch ms (0 = none). The row stays usable; a Touch or a full
	// write cancels it, since a run resumed the sandbox.
	ReclaimDue int64 `json:"reclaimDue,omitempty"`
	// StaleSnapshots are snapshots a newer one superseded whose provider delete has not
	// been confirmed yet (listed by PendingReclaims, so the reaper retries them), sorted.
	StaleSnapshots []string `json:"staleSnapshots,omitempty"`
}

// InstanceRows is the conditional instance map the operations use (docs/design.md §2.1). Every write
// carries a per-call token; a write whose condition fails re-reads the row, and when the
// row carries the caller's token, its earlier attempt landed: that is success.
type InstanceRows interface {
	// Read.

	// GetRow returns the row of key with its incarnation; missing: (nil, nil).
	GetRow(ctx context.Context, key string) (*InstanceRow, error)

	// The operations' writes: create, replace, touch on resume, snapshot.

	// CreateRow writes rec stamped with incarnation only if no row exists; else ErrConflict.
	CreateRow(ctx context.Context, rec InstanceRecord, incarnation string) error
	// ReplaceRow fully replaces the row only while it still has incarnation prev (and no
	// pending reclaim), stamping incarnation next; else ErrConflict.
	ReplaceRow(ctx context.Context, rec InstanceRecord, prev, next string) error
	// Touch sets latestRunId and updatedAt only while providerSandboxId is still psid and no
	// reclaim is pending; else ErrConflict (a missing row too).
	Touch(ctx context.Context, key, psid, latestRunID string, now int64) error
	// SetSnapshot replaces latestSnapshotId prev ("" = none) by snapshotID and sets
	// updatedAt, only while providerSandboxId is still psid and latestSnapshotId is prev;
	// a superseded prev joins staleSnapshots (listed by PendingReclaims); a row already at
	// snapshotID is this call's own landed write; else ErrConflict.
	SetSnapshot(ctx context.Context, key, psid, prev, snapshotID string, now int64) error

	// Reclaim: tombstone, delete, defer, and confirmed snapshot deletes.

	// MarkReclaiming tombstones the row with token only while providerSandboxId and
	// updatedAt are as read and updatedAt <= idleBefore; else ErrConflict.
	MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error
	// DeleteReclaimed deletes the row only while it carries reclaim token; a missing row is
	// success (a retried delete); another token or none is ErrConflict.
	DeleteReclaimed(ctx context.Context, key, token string) error
	// DeferReclaim sets reclaimDue to due (listed by PendingReclaims; 0 clears it and the
	// listing) only while providerSandboxId is still psid and no reclaim is pending; else
	// ErrConflict. Repeating it is harmless.
	DeferReclaim(ctx context.Context, key, psid string, due int64) error
	// DropStaleSnapshot removes snapshotID from staleSnapshots (its delete is confirmed);
	// absent, or a missing row, is success.
	DropStaleSnapshot(ctx context.Context, key, snapshotID string) error
}
