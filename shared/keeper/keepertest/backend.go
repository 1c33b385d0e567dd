package keepertest

import (
	"context"
	"errors"
	"sync"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// ErrLostResponse is what a FaultBackend answers for a write it applied but whose response
// it "lost" (an infrastructure error, never a sentinel: the caller must retry).
var ErrLostResponse = errors.New("keepertest: response lost (the write was applied)")

// ErrInjected is what a FaultBackend answers for a call it failed without applying it.
var ErrInjected = errors.New("keepertest: injected failure (nothing was applied)")

// FaultBackend wraps a backend: it counts every call by name ("Instances.CreateRow",
// "Runs.Claim", "Intents.Put", "Log.Append", ...), runs per-call hooks, fails calls
// without applying them, and — with LoseResponses — applies each conditional write and
// then answers ErrLostResponse, once per method, so a caller's retry must recognise its
// own landed write by its token.
type FaultBackend struct {
	inner sandbox.Backend

	mu       sync.Mutex
	locks    sandbox.LockStore
	losing   bool
	lostDone map[string]bool
	lost     map[string]int
	calls    map[string]int
	fail     map[string]int
	hooks    map[string]func(ctx context.Context, call int)
	stale    []string
}

var _ sandbox.Backend = (*FaultBackend)(nil)

// NewFaultBackend wraps b; with no faults programmed it behaves exactly like b.
func NewFaultBackend(b sandbox.Backend) *FaultBackend {
	return &FaultBackend{inner: b, lostDone: map[string]bool{}, lost: map[string]int{},
		calls: map[string]int{}, fail: map[string]int{}, hooks: map[string]func(context.Context, int){}}
}

// Inner returns the wrapped backend (writes through it bypass every fault).
func (f *FaultBackend) Inner() sandbox.Backend { return f.inner }

// LoseResponses turns response loss on or off; turning it on re-arms every method.
func (f *FaultBackend) LoseResponses(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.losing = on
	if on {
		f.lostDone = map[string]bool{}
	}
}

// Lost returns how many responses of method were lost.
func (f *FaultBackend) Lost(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost[method]
}

// Calls returns how many times method was called.
func (f *FaultBackend) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Fail makes the next n calls of method fail with ErrInjected, unapplied.
func (f *FaultBackend) Fail(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[method] = n
}

// Hook installs fn, run before every call of method with its 1-based call number; it
// may block. nil removes it.
func (f *FaultBackend) Hook(method string, fn func(ctx context.Context, call int)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fn == nil {
		delete(f.hooks, method)
		return
	}
	f.hooks[method] = fn
}

// StaleUsingKey makes every RunsUsingKey answer also list ids, as a lagging index does
// (entries of runs that ended, or never existed): callers must re-read each hit.
func (f *FaultBackend) StaleUsingKey(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stale = append([]string(nil), ids...)
}

// SetLocks replaces the lock store the backend hands out (nil: the wrapped one).
func (f *FaultBackend) SetLocks(ls sandbox.LockStore) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.locks = ls
}

// enter counts a call, runs its hook and reports whether it must fail unapplied.
func (f *FaultBackend) enter(ctx context.Context, method string) error {
	f.mu.Lock()
	f.calls[method]++
	n, hook := f.calls[method], f.hooks[method]
	fail := f.fail[method] > 0
	if fail {
		f.fail[method]--
	}
	f.mu.Unlock()
	if hook != nil {
		hook(ctx, n)
	}
	if fail {
		return ErrInjected
	}
	return nil
}

// loseNow reports whether the response of a successful write of method is to be lost.
func (f *FaultBackend) loseNow(method string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.losing || f.lostDone[method] {
		return false
	}
	f.lostDone[method] = true
	f.lost[method]++
	return true
}

// read wraps a read: counted, hooked, failable.
func read[T any](f *FaultBackend, ctx context.Context, method string, call func() (T, error)) (T, error) {
	var zero T
	if err := f.enter(ctx, method); err != nil {
		return zero, err
	}
	return call()
}

// write wraps a conditional write: like read, plus response loss after it was applied.
func write[T any](f *FaultBackend, ctx context.Context, method string, call func() (T, error)) (T, error) {
	var zero T
	if err := f.enter(ctx, method); err != nil {
		return zero, err
	}
	v, err := call()
	if err == nil && f.loseNow(method) {
		return zero, ErrLostResponse
	}
	return v, err
}

func write0(f *FaultBackend, ctx context.Context, method string, call func() error) error {
	_, err := write(f, ctx, method, func() (struct{}, error) { return struct{}{}, call() })
	return err
}

// Instances returns the wrapped instance rows.
func (f *FaultBackend) Instances() sandbox.InstanceRows { return faultRows{f.inner.Instances(), f} }

// Runs returns the wrapped run store.
func (f *FaultBackend) Runs() sandbox.FencedRuns { return faultRuns{f.inner.Runs(), f} }

// Locks returns the lock store set by SetLocks, else the wrapped one (counted per call).
func (f *FaultBackend) Locks() sandbox.LockStore {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.locks != nil {
		return faultLocks{f.locks, f}
	}
	return faultLocks{f.inner.Locks(), f}
}

// Log returns the wrapped event log.
func (f *FaultBackend) Log() sandbox.EventLog { return faultLog{f.inner.Log(), f} }

// Intents returns the wrapped intent store.
func (f *FaultBackend) Intents() sandbox.IntentStore { return faultIntents{f.inner.Intents(), f} }

// Reaper returns the wrapped backend's reaper source, unwrapped.
func (f *FaultBackend) Reaper() sandbox.ReaperSource { return f.inner.Reaper() }

type faultLocks struct {
	sandbox.LockStore
	f *FaultBackend
}

// WithLock counts the call, then delegates.
func (l faultLocks) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if err := l.f.enter(ctx, "Locks.WithLock"); err != nil {
		return err
	}
	return l.LockStore.WithLock(ctx, key, fn)
}

type faultRows struct {
	sandbox.InstanceRows
	f *FaultBackend
}

// GetRow is counted and hooked.
func (r faultRows) GetRow(ctx context.Context, key string) (*sandbox.InstanceRow, error) {
	return read(r.f, ctx, "Instances.GetRow", func() (*sandbox.InstanceRow, error) { return r.InstanceRows.GetRow(ctx, key) })
}

// CreateRow is a conditional write.
func (r faultRows) CreateRow(ctx context.Context, rec sandbox.InstanceRecord, inc string) error {
	return write0(r.f, ctx, "Instances.CreateRow", func() error { return r.InstanceRows.CreateRow(ctx, rec, inc) })
}

// ReplaceRow is a conditional write.
func (r faultRows) ReplaceRow(ctx context.Context, rec sandbox.InstanceRecord, prev, next string) error {
	return write0(r.f, ctx, "Instances.ReplaceRow", func() error { return r.InstanceRows.ReplaceRow(ctx, rec, prev, next) })
}

// Touch is a conditional write.
func (r faultRows) Touch(ctx context.Context, key, psid, runID string, now int64) error {
	return write0(r.f, ctx, "Instances.Touch", func() error { return r.InstanceRows.Touch(ctx, key, psid, runID, now) })
}

// SetSnapshot is a conditional write.
func (r faultRows) SetSnapshot(ctx context.Context, key, psid, prev, snap string, now int64) error {
	return write0(r.f, ctx, "Instances.SetSnapshot", func() error { return r.InstanceRows.SetSnapshot(ctx, key, psid, prev, snap, now) })
}

// DropStaleSnapshot is a conditional write.
func (r faultRows) DropStaleSnapshot(ctx context.Context, key, snap string) error {
	return write0(r.f, ctx, "Instances.DropStaleSnapshot", func() error { return r.InstanceRows.DropStaleSnapshot(ctx, key, snap) })
}

// MarkReclaiming is a conditional write.
func (r faultRows) MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error {
	return write0(r.f, ctx, "Instances.MarkReclaiming", func() error {
		return r.InstanceRows.MarkReclaiming(ctx, key, psid, updatedAt, idleBefore, token)
	})
}

// DeferReclaim is a conditional write.
func (r faultRows) DeferReclaim(ctx context.Context, key, psid string, due int64) error {
	return write0(r.f, ctx, "Instances.DeferReclaim", func() error { return r.InstanceRows.DeferReclaim(ctx, key, psid, due) })
}

// DeleteReclaimed is a conditional write.
func (r faultRows) DeleteReclaimed(ctx context.Context, key, token string) error {
	return write0(r.f, ctx, "Instances.DeleteReclaimed", func() error { return r.InstanceRows.DeleteReclaimed(ctx, key, token) })
}

type faultRuns struct {
	sandbox.FencedRuns
	f *FaultBackend
}

// State is counted and hooked.
func (r faultRuns) State(ctx context.Context, runID string) (*sandbox.RunState, error) {
	return read(r.f, ctx, "Runs.State", func() (*sandbox.RunState, error) { return r.FencedRuns.State(ctx, runID) })
}

// RunsUsingKey is counted and hooked, and lists the StaleUsingKey ids too.
func (r faultRuns) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	ids, err := read(r.f, ctx, "Runs.RunsUsingKey", func() ([]string, error) { return r.FencedRuns.RunsUsingKey(ctx, key) })
	if err != nil {
		return nil, err
	}
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return append(ids, r.f.stale...), nil
}

// CreateClaimed is a conditional write.
func (r faultRuns) CreateClaimed(ctx context.Context, in sandbox.CreateClaimedRun) (sandbox.RunState, bool, error) {
	type res struct {
		st      sandbox.RunState
		created bool
	}
	v, err := write(r.f, ctx, "Runs.CreateClaimed", func() (res, error) {
		st, created, err := r.FencedRuns.CreateClaimed(ctx, in)
		return res{st, created}, err
	})
	return v.st, v.created, err
}

// Claim is a conditional write.
func (r faultRuns) Claim(ctx context.Context, runID string, c sandbox.Claim) (sandbox.RunState, error) {
	return write(r.f, ctx, "Runs.Claim", func() (sandbox.RunState, error) { return r.FencedRuns.Claim(ctx, runID, c) })
}

// UpdateFenced is a conditional write.
func (r faultRuns) UpdateFenced(ctx context.Context, runID string, epoch int64, p sandbox.RunPatch) (sandbox.RunState, error) {
	return write(r.f, ctx, "Runs.UpdateFenced", func() (sandbox.RunState, error) {
		return r.FencedRuns.UpdateFenced(ctx, runID, epoch, p)
	})
}

// RecordSandbox is a conditional write.
func (r faultRuns) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (sandbox.RunState, error) {
	return write(r.f, ctx, "Runs.RecordSandbox", func() (sandbox.RunState, error) {
		return r.FencedRuns.RecordSandbox(ctx, runID, epoch, psid)
	})
}

// Heartbeat is a conditional write.
func (r faultRuns) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (sandbox.RunState, error) {
	return write(r.f, ctx, "Runs.Heartbeat", func() (sandbox.RunState, error) {
		return r.FencedRuns.Heartbeat(ctx, runID, epoch, leaseUntil)
	})
}

// Detach is a conditional write.
func (r faultRuns) Detach(ctx context.Context, runID string, epoch int64, key string, now int64) (sandbox.RunState, error) {
	return write(r.f, ctx, "Runs.Detach", func() (sandbox.RunState, error) {
		return r.FencedRuns.Detach(ctx, runID, epoch, key, now)
	})
}

// Lapse is a conditional write.
func (r faultRuns) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	return write0(r.f, ctx, "Runs.Lapse", func() error { return r.FencedRuns.Lapse(ctx, runID, epoch, leaseUntil) })
}

// RequestCancel is a conditional write.
func (r faultRuns) RequestCancel(ctx context.Context, runID string) (sandbox.RunState, error) {
	return write(r.f, ctx, "Runs.RequestCancel", func() (sandbox.RunState, error) { return r.FencedRuns.RequestCancel(ctx, runID) })
}

type faultIntents struct {
	sandbox.IntentStore
	f *FaultBackend
}

// Put is a conditional write.
func (i faultIntents) Put(ctx context.Context, key string, token, now int64) error {
	return write0(i.f, ctx, "Intents.Put", func() error { return i.IntentStore.Put(ctx, key, token, now) })
}

// Record is a conditional write.
func (i faultIntents) Record(ctx context.Context, key string, token int64, psid string) error {
	return write0(i.f, ctx, "Intents.Record", func() error { return i.IntentStore.Record(ctx, key, token, psid) })
}

// Get is counted and hooked.
func (i faultIntents) Get(ctx context.Context, key string) (*sandbox.Intent, error) {
	return read(i.f, ctx, "Intents.Get", func() (*sandbox.Intent, error) { return i.IntentStore.Get(ctx, key) })
}

// Drop is a conditional write.
func (i faultIntents) Drop(ctx context.Context, key string, token int64) error {
	return write0(i.f, ctx, "Intents.Drop", func() error { return i.IntentStore.Drop(ctx, key, token) })
}

type faultLog struct {
	sandbox.EventLog
	f *FaultBackend
}

// Append is a conditional write.
func (l faultLog) Append(ctx context.Context, runID string, at sandbox.Cursor, events []sandbox.Event) (sandbox.AppendResult, error) {
	return write(l.f, ctx, "Log.Append", func() (sandbox.AppendResult, error) { return l.EventLog.Append(ctx, runID, at, events) })
}

// Fence is a conditional write.
func (l faultLog) Fence(ctx context.Context, runID string, epoch int64) (sandbox.AppendResult, error) {
	return write(l.f, ctx, "Log.Fence", func() (sandbox.AppendResult, error) { return l.EventLog.Fence(ctx, runID, epoch) })
}

// Read is counted and hooked.
func (l faultLog) Read(ctx context.Context, runID string, after int64, limit int) ([]sandbox.Event, int64, bool, error) {
	if err := l.f.enter(ctx, "Log.Read"); err != nil {
		return nil, 0, false, err
	}
	return l.EventLog.Read(ctx, runID, after, limit)
}

// Close is a conditional write.
func (l faultLog) Close(ctx context.Context, runID string, at sandbox.Cursor) error {
	return write0(l.f, ctx, "Log.Close", func() error { return l.EventLog.Close(ctx, runID, at) })
}

// MarkCancel is a conditional write.
func (l faultLog) MarkCancel(ctx context.Context, runID string) error {
	return write0(l.f, ctx, "Log.MarkCancel", func() error { return l.EventLog.MarkCancel(ctx, runID) })
}
