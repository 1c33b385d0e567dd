package store

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The scoped faces: the contract's checks, written once for every backend. A backend
// implements each store for one tenant at a time (its view of tenant t answers for t
// alone and reads nothing of the context's tenant) and hands out the face, which checks
// the context's tenant and every id (contract.Scope), a log writer's cursor and batch, and
// each call's other arguments, then calls the view of that tenant. A view may so trust
// its arguments: it writes only the store's single-call primitives and the rules' fast
// paths (docs/design.md §2).

// Stores are a backend's tenant-scoped stores, the scoped faces over its views, built once
// with the backend (NewStores). A backend embeds them: its Instances(), Runs(), … are
// theirs.
type Stores struct {
	instances contract.InstanceRows
	runs      contract.FencedRuns
	locks     contract.LockStore
	log       contract.EventLog
	intents   contract.IntentStore
}

// NewStores holds a backend's five faces; runs may carry the capabilities of the backend's
// run views (composed with ScopedRunWriter, ScopedRunLister, …).
func NewStores(instances contract.InstanceRows, runs contract.FencedRuns, locks contract.LockStore,
	log contract.EventLog, intents contract.IntentStore) Stores {
	return Stores{instances, runs, locks, log, intents}
}

// Instances is the conditional instance map (docs/design.md §2.1).
func (x Stores) Instances() contract.InstanceRows { return x.instances }

// Runs is the fenced run store (docs/design.md §2.2), with the capabilities its views carry.
func (x Stores) Runs() contract.FencedRuns { return x.runs }

// Locks is the lease lock store (docs/design.md §2.3), a contract.LeaseLocks too.
func (x Stores) Locks() contract.LockStore { return x.locks }

// Log is the runs' event logs (docs/design.md §2.4).
func (x Stores) Log() contract.EventLog { return x.log }

// Intents is the resolve-intent store (docs/design.md §2.7).
func (x Stores) Intents() contract.IntentStore { return x.intents }

// views is a backend's view of each tenant.
type views[V any] func(tenant string) V

// at is the view of the context's tenant once it and id (the store id named field) pass
// contract.Scope.
func (f views[V]) at(ctx context.Context, field, id string) (V, error) {
	t, err := contract.Scope(ctx, field, id)
	if err != nil {
		var zero V
		return zero, err
	}
	return f(t), nil
}

// tenant is the view of the context's tenant, for a call that names no id.
func (f views[V]) tenant(ctx context.Context) (V, error) {
	t, err := contract.Tenant(ctx)
	if err != nil {
		var zero V
		return zero, err
	}
	return f(t), nil
}

// check is at, then the call's other arguments: the first of errs that is not nil.
func (f views[V]) check(ctx context.Context, field, id string, errs ...error) (V, error) {
	v, err := f.at(ctx, field, id)
	for _, e := range errs {
		if err == nil {
			err = e
		}
	}
	if err != nil {
		var zero V
		return zero, err
	}
	return v, nil
}

func nonEmpty(field, v string) error {
	if v == "" {
		return contract.Invalid(field, "empty")
	}
	return nil
}

// ScopedInstances is the checked face of a backend's instance rows, one view a tenant.
func ScopedInstances[V contract.InstanceRows](of func(tenant string) V) contract.InstanceRows {
	return instancesFace{func(t string) contract.InstanceRows { return of(t) }}
}

type instancesFace struct{ of views[contract.InstanceRows] }

func (x instancesFace) GetRow(ctx context.Context, key string) (*contract.InstanceRow, error) {
	v, err := x.of.at(ctx, "key", key)
	if err != nil {
		return nil, err
	}
	return v.GetRow(ctx, key)
}

func (x instancesFace) CreateRow(ctx context.Context, rec contract.InstanceRecord, incarnation string) error {
	v, err := x.of.check(ctx, "key", rec.Key, nonEmpty("incarnation", incarnation))
	if err != nil {
		return err
	}
	return v.CreateRow(ctx, rec, incarnation)
}

func (x instancesFace) ReplaceRow(ctx context.Context, rec contract.InstanceRecord, prev, next string) error {
	v, err := x.of.check(ctx, "key", rec.Key, nonEmpty("incarnation", prev), nonEmpty("incarnation", next))
	if err != nil {
		return err
	}
	return v.ReplaceRow(ctx, rec, prev, next)
}

func (x instancesFace) Touch(ctx context.Context, key, psid, latestRunID string, now int64) error {
	v, err := x.of.at(ctx, "key", key)
	if err != nil {
		return err
	}
	return v.Touch(ctx, key, psid, latestRunID, now)
}

func (x instancesFace) SetSnapshot(ctx context.Context, key, psid, prev, snapshotID string, now int64) error {
	v, err := x.of.check(ctx, "key", key, nonEmpty("snapshotId", snapshotID))
	if err != nil {
		return err
	}
	return v.SetSnapshot(ctx, key, psid, prev, snapshotID, now)
}

func (x instancesFace) MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error {
	v, err := x.of.check(ctx, "key", key, nonEmpty("token", token))
	if err != nil {
		return err
	}
	return v.MarkReclaiming(ctx, key, psid, updatedAt, idleBefore, token)
}

func (x instancesFace) DeleteReclaimed(ctx context.Context, key, token string) error {
	v, err := x.of.check(ctx, "key", key, nonEmpty("token", token))
	if err != nil {
		return err
	}
	return v.DeleteReclaimed(ctx, key, token)
}

func (x instancesFace) DeferReclaim(ctx context.Context, key, psid string, due int64) error {
	var bad error
	if due < 0 {
		bad = contract.Invalid("due", "negative")
	}
	v, err := x.of.check(ctx, "key", key, bad)
	if err != nil {
		return err
	}
	return v.DeferReclaim(ctx, key, psid, due)
}

func (x instancesFace) DropStaleSnapshot(ctx context.Context, key, snapshotID string) error {
	v, err := x.of.check(ctx, "key", key, nonEmpty("snapshotId", snapshotID))
	if err != nil {
		return err
	}
	return v.DropStaleSnapshot(ctx, key, snapshotID)
}

func (x instancesFace) MarkStopping(ctx context.Context, key, psid string, updatedAt int64, token string, now int64) error {
	v, err := x.of.check(ctx, "key", key, nonEmpty("token", token))
	if err != nil {
		return err
	}
	return v.MarkStopping(ctx, key, psid, updatedAt, token, now)
}

func (x instancesFace) SettleStop(ctx context.Context, key, token, lifecycle string, now int64) error {
	v, err := x.of.check(ctx, "key", key, contract.CheckSettleStop(token, lifecycle))
	if err != nil {
		return err
	}
	return v.SettleStop(ctx, key, token, lifecycle, now)
}

func (x instancesFace) DeferStop(ctx context.Context, key, psid string, idleSince int64) error {
	var bad error
	if idleSince <= 0 {
		bad = contract.Invalid("idleSince", "not positive")
	}
	v, err := x.of.check(ctx, "key", key, bad)
	if err != nil {
		return err
	}
	return v.DeferStop(ctx, key, psid, idleSince)
}

// ScopedRuns is the checked face of a backend's fenced run store, one view a tenant.
func ScopedRuns[V contract.FencedRuns](of func(tenant string) V) contract.FencedRuns {
	return runsFace{func(t string) contract.FencedRuns { return of(t) }}
}

type runsFace struct{ of views[contract.FencedRuns] }

func (x runsFace) State(ctx context.Context, runID string) (*contract.RunState, error) {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return nil, err
	}
	return v.State(ctx, runID)
}

func (x runsFace) FindActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	v, err := x.of.at(ctx, "threadId", threadID)
	if err != nil {
		return nil, err
	}
	return v.FindActiveRun(ctx, threadID)
}

func (x runsFace) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	v, err := x.of.at(ctx, "sandboxKey", key)
	if err != nil {
		return nil, err
	}
	return v.RunsUsingKey(ctx, key)
}

// CreateClaimed checks the run id here; in.State (the rule the view stores by) checks the rest.
func (x runsFace) CreateClaimed(ctx context.Context, in contract.CreateClaimedRun) (contract.RunState, bool, error) {
	v, err := x.of.at(ctx, "runId", in.RunID)
	if err != nil {
		return contract.RunState{}, false, err
	}
	return v.CreateClaimed(ctx, in)
}

func (x runsFace) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return contract.RunState{}, err
	}
	return v.Claim(ctx, runID, c)
}

func (x runsFace) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	v, err := x.of.check(ctx, "runId", runID, p.Check())
	if err != nil {
		return contract.RunState{}, err
	}
	return v.UpdateFenced(ctx, runID, epoch, p)
}

func (x runsFace) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (contract.RunState, error) {
	v, err := x.of.check(ctx, "runId", runID, nonEmpty("providerSandboxId", psid))
	if err != nil {
		return contract.RunState{}, err
	}
	return v.RecordSandbox(ctx, runID, epoch, psid)
}

func (x runsFace) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (contract.RunState, error) {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return contract.RunState{}, err
	}
	return v.Heartbeat(ctx, runID, epoch, leaseUntil)
}

func (x runsFace) Detach(ctx context.Context, runID string, epoch int64, sandboxKey string, now int64) (contract.RunState, error) {
	v, err := x.of.check(ctx, "runId", runID, contract.CheckDetach(sandboxKey))
	if err != nil {
		return contract.RunState{}, err
	}
	return v.Detach(ctx, runID, epoch, sandboxKey, now)
}

func (x runsFace) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return err
	}
	return v.Lapse(ctx, runID, epoch, leaseUntil)
}

func (x runsFace) RequestCancel(ctx context.Context, runID string) (contract.RunState, error) {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return contract.RunState{}, err
	}
	return v.RequestCancel(ctx, runID)
}

func (x runsFace) ClearLaunch(ctx context.Context, runID string) (contract.RunState, error) {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return contract.RunState{}, err
	}
	return v.ClearLaunch(ctx, runID)
}

// ScopedLog is the checked face of a backend's event logs, one view a tenant.
func ScopedLog[V contract.EventLog](of func(tenant string) V) contract.EventLog {
	return logFace{func(t string) contract.EventLog { return of(t) }}
}

type logFace struct{ of views[contract.EventLog] }

func (x logFace) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	v, err := x.of.check(ctx, "runId", runID, contract.CheckCursor(at), contract.CheckEvents(events))
	if err != nil {
		return contract.AppendResult{}, err
	}
	return v.Append(ctx, runID, at, events)
}

func (x logFace) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	var bad error
	if epoch < 1 {
		bad = contract.Invalid("epoch", "%d is not positive", epoch)
	}
	v, err := x.of.check(ctx, "runId", runID, bad)
	if err != nil {
		return contract.AppendResult{}, err
	}
	return v.Fence(ctx, runID, epoch)
}

func (x logFace) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	var bad error
	if after < 0 {
		bad = contract.Invalid("after", "%d is negative", after)
	}
	v, err := x.of.check(ctx, "runId", runID, bad)
	if err != nil {
		return nil, 0, false, err
	}
	return v.Read(ctx, runID, after, limit)
}

func (x logFace) Close(ctx context.Context, runID string, at contract.Cursor) error {
	v, err := x.of.check(ctx, "runId", runID, contract.CheckCursor(at))
	if err != nil {
		return err
	}
	return v.Close(ctx, runID, at)
}

func (x logFace) MarkCancel(ctx context.Context, runID string) error {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return err
	}
	return v.MarkCancel(ctx, runID)
}

func (x logFace) MarkWatch(ctx context.Context, runID string) error {
	v, err := x.of.at(ctx, "runId", runID)
	if err != nil {
		return err
	}
	return v.MarkWatch(ctx, runID)
}

// ScopedIntents is the checked face of a backend's intent store, one view a tenant.
func ScopedIntents[V contract.IntentStore](of func(tenant string) V) contract.IntentStore {
	return intentsFace{func(t string) contract.IntentStore { return of(t) }}
}

type intentsFace struct{ of views[contract.IntentStore] }

func (x intentsFace) Put(ctx context.Context, key string, token, now int64) error {
	v, err := x.of.at(ctx, "key", key)
	if err != nil {
		return err
	}
	return v.Put(ctx, key, token, now)
}

func (x intentsFace) Record(ctx context.Context, key string, token int64, psid string) error {
	v, err := x.of.check(ctx, "key", key, nonEmpty("providerSandboxId", psid))
	if err != nil {
		return err
	}
	return v.Record(ctx, key, token, psid)
}

func (x intentsFace) Get(ctx context.Context, key string) (*contract.Intent, error) {
	v, err := x.of.at(ctx, "key", key)
	if err != nil {
		return nil, err
	}
	return v.Get(ctx, key)
}

func (x intentsFace) Drop(ctx context.Context, key string, token int64) error {
	v, err := x.of.at(ctx, "key", key)
	if err != nil {
		return err
	}
	return v.Drop(ctx, key, token)
}

// LockView is a backend's lock store for one tenant: the lease primitives, from which
// shared/store/lease builds WithLock.
type LockView interface {
	contract.LeaseLocks
	// WithLock runs fn holding key's lease (shared/store/lease.Hold over the primitives).
	WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error
}

// ScopedLocks is the checked face of a backend's lease locks, one view a tenant: a
// contract.LockStore that is also a contract.LeaseLocks.
func ScopedLocks[V LockView](of func(tenant string) V) contract.LockStore {
	return locksFace{func(t string) LockView { return of(t) }}
}

type locksFace struct{ of views[LockView] }

func (x locksFace) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	var bad error
	if fn == nil {
		bad = contract.Invalid("fn", "nil")
	}
	v, err := x.of.check(ctx, "key", key, bad)
	if err != nil {
		return err
	}
	return v.WithLock(ctx, key, fn)
}

func (x locksFace) TryAcquire(ctx context.Context, key, owner string) (int64, bool, error) {
	v, err := x.of.check(ctx, "key", key, contract.CheckOwner(owner))
	if err != nil {
		return 0, false, err
	}
	return v.TryAcquire(ctx, key, owner)
}

func (x locksFace) Renew(ctx context.Context, key, owner string) (bool, error) {
	v, err := x.of.check(ctx, "key", key, contract.CheckOwner(owner))
	if err != nil {
		return false, err
	}
	return v.Renew(ctx, key, owner)
}

func (x locksFace) Release(ctx context.Context, key, owner string) error {
	v, err := x.of.check(ctx, "key", key, contract.CheckOwner(owner))
	if err != nil {
		return err
	}
	return v.Release(ctx, key, owner)
}

// Timing is the same for every tenant.
func (x locksFace) Timing() contract.LockTiming { return x.of("").Timing() }

// ScopedRunWriter is the checked face of a backend's unfenced run writes (the reference
// run store's), one view a tenant; in.Record (the rule the view stores by) checks the rest.
func ScopedRunWriter[V contract.RunWriter](of func(tenant string) V) contract.RunWriter {
	return runWriterFace{func(t string) contract.RunWriter { return of(t) }}
}

type runWriterFace struct{ of views[contract.RunWriter] }

func (x runWriterFace) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	v, err := x.of.at(ctx, "runId", in.RunID)
	if err != nil {
		return contract.RunRecord{}, err
	}
	return v.CreateOrResume(ctx, in)
}

// Update checks the patch; an empty one does nothing, so no view is asked.
func (x runWriterFace) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	v, err := x.of.check(ctx, "runId", runID, p.Check())
	if err != nil || p.Empty() {
		return err
	}
	return v.Update(ctx, runID, p)
}

// ScopedRunLister is the checked face of a backend's run listing, one view a tenant.
func ScopedRunLister[V contract.RunLister](of func(tenant string) V) contract.RunLister {
	return runListerFace{func(t string) contract.RunLister { return of(t) }}
}

type runListerFace struct{ of views[contract.RunLister] }

func (x runListerFace) ListRuns(ctx context.Context, f contract.RunFilter, after *contract.RunPos, limit int) (contract.RunPage, error) {
	v, err := x.of.tenant(ctx)
	if err == nil {
		err = contract.CheckListing(f, after, limit)
	}
	if err != nil {
		return contract.RunPage{}, err
	}
	return v.ListRuns(ctx, f, after, limit)
}

// ScopedThreadLister is the checked face of a backend's thread listing, one view a tenant.
func ScopedThreadLister[V contract.ThreadLister](of func(tenant string) V) contract.ThreadLister {
	return threadListerFace{func(t string) contract.ThreadLister { return of(t) }}
}

type threadListerFace struct{ of views[contract.ThreadLister] }

func (x threadListerFace) ListByThread(ctx context.Context, threadID string) ([]contract.RunRecord, error) {
	v, err := x.of.at(ctx, "threadId", threadID)
	if err != nil {
		return nil, err
	}
	return v.ListByThread(ctx, threadID)
}

// ScopedReclaimableLister is the checked face of a backend's reclaimable listing, one
// view a tenant.
func ScopedReclaimableLister[V contract.ReclaimableLister](of func(tenant string) V) contract.ReclaimableLister {
	return reclaimableFace{func(t string) contract.ReclaimableLister { return of(t) }}
}

type reclaimableFace struct {
	of views[contract.ReclaimableLister]
}

func (x reclaimableFace) ListReclaimable(ctx context.Context, now, ttlMs int64) ([]contract.RunRecord, error) {
	v, err := x.of.tenant(ctx)
	if err != nil {
		return nil, err
	}
	return v.ListReclaimable(ctx, now, ttlMs)
}
