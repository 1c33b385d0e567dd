package contract

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
	// DestroyOnEnd: the sandbox serves one run (reuse "none"); once that run has ended it
	// is destroyed rather than stopped (docs/design.md §5).
	DestroyOnEnd bool `json:"destroyOnEnd,omitempty"`
	// DestroyOnCancel: a run of the sandbox that ends aborted by a cancel destroys it
	// rather than leaving it to the thread (the setup's destroyOnCancel, docs/design.md §5).
	DestroyOnCancel bool `json:"destroyOnCancel,omitempty"`
	// IdleStopMs is the setup's own idle grace (0 = the deployment's, docs/design.md §5).
	IdleStopMs int64 `json:"idleStopMs,omitempty"`
}

// The lifecycle states of a row's sandbox as sandkeep last left it (InstanceRow.Lifecycle,
// docs/design.md §5): "" is running (created or resumed by a start).
const (
	LifecycleRunning  = ""
	LifecycleStopping = "stopping" // a stop is under way (InstanceRow.StopToken)
	LifecycleStopped  = "stopped"
	LifecycleArchived = "archived" // the idle stop found the provider had archived it (cold storage)
	LifecycleGone     = "gone"     // the provider reported it gone when asked to stop it
)

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
	// Lifecycle is what sandkeep last did to the sandbox: LifecycleRunning (a start's full
	// write or Touch), LifecycleStopping, LifecycleStopped, LifecycleArchived or
	// LifecycleGone (the idle stop).
	Lifecycle string `json:"lifecycle,omitempty"`
	// LifecycleSince is when the row entered Lifecycle, epoch ms (running: the latest start
	// that created or resumed the sandbox).
	LifecycleSince int64 `json:"lifecycleSince,omitempty"`
	// StopToken is the token of the idle stop that marked the row stopping (and that
	// settled it: stopped, gone or running again); a start's Touch or full write clears it.
	StopToken string `json:"stopToken,omitempty"`
	// IdleSince is when the sandbox was last known to serve a run, epoch ms: a start's write
	// sets it to its time, the reaper moves it on when it finds a live run or a later end.
	// While it is set (running or stopping, no pending reclaim) the row is listed by
	// ReaperSource.StopCandidates; 0 = not listed (stopped, gone).
	IdleSince int64 `json:"idleSince,omitempty"`
}

// FullRow is the row a full write (CreateRow, ReplaceRow) stores: rec stamped with
// incarnation, running since rec.UpdatedAt and listed for the idle stop from then.
func FullRow(rec InstanceRecord, incarnation string) InstanceRow {
	return InstanceRow{InstanceRecord: rec, Incarnation: incarnation, LifecycleSince: rec.UpdatedAt, IdleSince: rec.UpdatedAt}
}

// CheckSettleStop is SettleStop's argument check, every backend's: a token, and a
// lifecycle a stop ends in.
func CheckSettleStop(token, lifecycle string) error {
	switch {
	case token == "":
		return Invalid("token", "empty")
	case lifecycle != LifecycleRunning && lifecycle != LifecycleStopped &&
		lifecycle != LifecycleArchived && lifecycle != LifecycleGone:
		return Invalid("lifecycle", "%q is not a state a stop ends in", lifecycle)
	}
	return nil
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
	// Full writes (CreateRow, ReplaceRow) make the row running since rec.UpdatedAt
	// (lifecycleSince = idleSince = rec.UpdatedAt).
	CreateRow(ctx context.Context, rec InstanceRecord, incarnation string) error
	// ReplaceRow fully replaces the row only while it still has incarnation prev (and no
	// pending reclaim), stamping incarnation next; else ErrConflict.
	ReplaceRow(ctx context.Context, rec InstanceRecord, prev, next string) error
	// Touch sets latestRunId and updatedAt only while providerSandboxId is still psid, no
	// reclaim is pending and no stop is under way (lifecycle stopping); else ErrConflict (a
	// missing row too). The row is running from now (lifecycleSince = idleSince = now, no
	// stop token).
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

	// Idle stop (docs/design.md §5): mark, settle, defer. Touch refuses a stopping row and
	// makes a stopped one running again; full writes make a row running.

	// MarkStopping marks the row stopping with token (lifecycleSince = now) only while
	// providerSandboxId and updatedAt are as read, no reclaim is pending and the row is
	// running or stopping (a stop its stopper left unfinished); a row already stopping with
	// token is this call's own landed write; else ErrConflict.
	MarkStopping(ctx context.Context, key, psid string, updatedAt int64, token string, now int64) error
	// SettleStop ends the stop carrying token: lifecycle LifecycleStopped, LifecycleArchived
	// or LifecycleGone (idleSince cleared: no longer listed), or LifecycleRunning (the stop failed or was
	// given up: idleSince = now), lifecycleSince = now; the row keeps token; only while the row
	// is stopping with token; a row already in lifecycle with token is this call's own
	// landed write; else ErrConflict.
	SettleStop(ctx context.Context, key, token, lifecycle string, now int64) error
	// DeferStop sets idleSince (the sandbox served a run until then) only while
	// providerSandboxId is psid, no reclaim is pending and the row is running; else
	// ErrConflict. Repeating it is harmless.
	DeferStop(ctx context.Context, key, psid string, idleSince int64) error
}
