// Package storetest holds the one fault-injecting backend of sandkeep's tests: a wrapper
// of any contract.Backend that counts, hooks, fails and loses the responses of its calls —
// programmed call by call (keepertest's suites, the keeper, reaper and HTTP tests) or by
// chance through a Policy (shared/testkit/faultrun's randomized runs). Production never imports it.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// ErrLostResponse is what a FaultBackend answers for a write it applied but whose response
// it "lost" (an infrastructure error, never a sentinel: the caller must retry).
var ErrLostResponse = errors.New("sandboxtest: response lost (the write was applied)")

// ErrInjected is what a FaultBackend answers for a call it failed without applying it.
var ErrInjected = errors.New("sandboxtest: injected failure (nothing was applied)")

// FaultBackend wraps a backend: it counts every call by name ("Instances.CreateRow",
// "Runs.Claim", "Intents.Put", "Log.Append", "Reaper.PendingReclaims", ...), runs per-call
// hooks, fails calls without applying them, and — with LoseResponses — applies each
// conditional write and then answers ErrLostResponse, once per method, so a caller's retry
// must recognise its own landed write by its token. A Policy adds faults by chance.
type FaultBackend struct {
	inner contract.Backend

	mu       sync.Mutex
	locks    contract.LockStore
	losing   bool
	lostDone map[string]bool
	lost     map[string]int
	calls    map[string]int
	fail     map[string]int
	hooks    map[string]func(ctx context.Context, call int)
	stale    []string
	policy   Policy
}

// Policy decides faults by chance, call by call, beside the programmed ones.
type Policy interface {
	// Fail reports whether this call of method fails unapplied (ErrInjected).
	Fail(method string) bool
	// Lose reports whether this applied write of method loses its response (ErrLostResponse).
	Lose(method string) bool
}

var _ contract.Backend = (*FaultBackend)(nil)

// NewFaultBackend wraps b; with no faults programmed it behaves exactly like b.
func NewFaultBackend(b contract.Backend) *FaultBackend {
	return &FaultBackend{inner: b, lostDone: map[string]bool{}, lost: map[string]int{},
		calls: map[string]int{}, fail: map[string]int{}, hooks: map[string]func(context.Context, int){}}
}

// Inner returns the wrapped backend (writes through it bypass every fault).
func (f *FaultBackend) Inner() contract.Backend { return f.inner }

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

// TotalCalls returns how many calls were made, of every method.
func (f *FaultBackend) TotalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
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

// SetPolicy adds p's faults to the programmed ones (nil: none by chance).
func (f *FaultBackend) SetPolicy(p Policy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policy = p
}

// SetLocks replaces the lock store the backend hands out (nil: the wrapped one).
func (f *FaultBackend) SetLocks(ls contract.LockStore) {
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
	policy := f.policy
	f.mu.Unlock()
	fail = fail || policy != nil && policy.Fail(method)
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
	once := f.losing && !f.lostDone[method]
	if once {
		f.lostDone[method] = true
	}
	policy := f.policy
	f.mu.Unlock()
	lose := once || policy != nil && policy.Lose(method)
	if lose {
		f.mu.Lock()
		f.lost[method]++
		f.mu.Unlock()
	}
	return lose
}

// Read makes call, a read named method, under f's faults: counted, hooked, failable.
// Wrappers of optional capabilities use it (and Write) to fault their calls.
func Read[T any](f *FaultBackend, ctx context.Context, method string, call func() (T, error)) (T, error) {
	var zero T
	if err := f.enter(ctx, method); err != nil {
		return zero, err
	}
	return call()
}

// Write makes call, a conditional write named method, under f's faults: like Read, plus
// the loss of its response after it was applied.
func Write[T any](f *FaultBackend, ctx context.Context, method string, call func() (T, error)) (T, error) {
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
	_, err := Write(f, ctx, method, func() (struct{}, error) { return struct{}{}, call() })
	return err
}

// Instances returns the wrapped instance rows.
func (f *FaultBackend) Instances() contract.InstanceRows { return faultRows{f.inner.Instances(), f} }

// Runs returns the wrapped run store.
func (f *FaultBackend) Runs() contract.FencedRuns { return faultRuns{f.inner.Runs(), f} }

// Locks returns the lock store set by SetLocks, else the wrapped one (counted per call).
func (f *FaultBackend) Locks() contract.LockStore {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.locks != nil {
		return faultLocks{f.locks, f}
	}
	return faultLocks{f.inner.Locks(), f}
}

// Log returns the wrapped event log.
func (f *FaultBackend) Log() contract.EventLog { return faultLog{f.inner.Log(), f} }

// Intents returns the wrapped intent store.
func (f *FaultBackend) Intents() contract.IntentStore { return faultIntents{f.inner.Intents(), f} }

// Reaper returns the wrapped reaper source (its listings counted, hooked, failable).
func (f *FaultBackend) Reaper() contract.ReaperSource { return faultReaper{f.inner.Reaper(), f} }

type faultLocks struct {
	contract.LockStore
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
	contract.InstanceRows
	f *FaultBackend
}

// GetRow is counted and hooked.
func (r faultRows) GetRow(ctx context.Context, key string) (*contract.InstanceRow, error) {
	return Read(r.f, ctx, "Instances.GetRow", func() (*contract.InstanceRow, error) { return r.InstanceRows.GetRow(ctx, key) })
}

// CreateRow is a conditional write.
func (r faultRows) CreateRow(ctx context.Context, rec contract.InstanceRecord, inc string) error {
	return write0(r.f, ctx, "Instances.CreateRow", func() error { return r.InstanceRows.CreateRow(ctx, rec, inc) })
}

// ReplaceRow is a conditional write.
func (r faultRows) ReplaceRow(ctx context.Context, rec contract.InstanceRecord, prev, next string) error {
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

// MarkStopping is a conditional write.
func (r faultRows) MarkStopping(ctx context.Context, key, psid string, updatedAt int64, token string, now int64) error {
	return write0(r.f, ctx, "Instances.MarkStopping", func() error {
		return r.InstanceRows.MarkStopping(ctx, key, psid, updatedAt, token, now)
	})
}

// SettleStop is a conditional write.
func (r faultRows) SettleStop(ctx context.Context, key, token, lifecycle string, now int64) error {
	return write0(r.f, ctx, "Instances.SettleStop", func() error { return r.InstanceRows.SettleStop(ctx, key, token, lifecycle, now) })
}

// DeferStop is a conditional write.
func (r faultRows) DeferStop(ctx context.Context, key, psid string, idleSince int64) error {
	return write0(r.f, ctx, "Instances.DeferStop", func() error { return r.InstanceRows.DeferStop(ctx, key, psid, idleSince) })
}

type faultRuns struct {
	contract.FencedRuns
	f *FaultBackend
}

// State is counted and hooked.
func (r faultRuns) State(ctx context.Context, runID string) (*contract.RunState, error) {
	return Read(r.f, ctx, "Runs.State", func() (*contract.RunState, error) { return r.FencedRuns.State(ctx, runID) })
}

// RunsUsingKey is counted and hooked, and lists the StaleUsingKey ids too.
func (r faultRuns) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	ids, err := Read(r.f, ctx, "Runs.RunsUsingKey", func() ([]string, error) { return r.FencedRuns.RunsUsingKey(ctx, key) })
	if err != nil {
		return nil, err
	}
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return append(ids, r.f.stale...), nil
}

// CreateClaimed is a conditional write.
func (r faultRuns) CreateClaimed(ctx context.Context, in contract.CreateClaimedRun) (contract.RunState, bool, error) {
	type res struct {
		st      contract.RunState
		created bool
	}
	v, err := Write(r.f, ctx, "Runs.CreateClaimed", func() (res, error) {
		st, created, err := r.FencedRuns.CreateClaimed(ctx, in)
		return res{st, created}, err
	})
	return v.st, v.created, err
}

// Claim is a conditional write.
func (r faultRuns) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	return Write(r.f, ctx, "Runs.Claim", func() (contract.RunState, error) { return r.FencedRuns.Claim(ctx, runID, c) })
}

// UpdateFenced is a conditional write.
func (r faultRuns) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	return Write(r.f, ctx, "Runs.UpdateFenced", func() (contract.RunState, error) {
		return r.FencedRuns.UpdateFenced(ctx, runID, epoch, p)
	})
}

// ClearLaunch is a conditional write.
func (r faultRuns) ClearLaunch(ctx context.Context, runID string) (contract.RunState, error) {
	return Write(r.f, ctx, "Runs.ClearLaunch", func() (contract.RunState, error) { return r.FencedRuns.ClearLaunch(ctx, runID) })
}

// RecordSandbox is a conditional write.
func (r faultRuns) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (contract.RunState, error) {
	return Write(r.f, ctx, "Runs.RecordSandbox", func() (contract.RunState, error) {
		return r.FencedRuns.RecordSandbox(ctx, runID, epoch, psid)
	})
}

// Heartbeat is a conditional write.
func (r faultRuns) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (contract.RunState, error) {
	return Write(r.f, ctx, "Runs.Heartbeat", func() (contract.RunState, error) {
		return r.FencedRuns.Heartbeat(ctx, runID, epoch, leaseUntil)
	})
}

// Detach is a conditional write.
func (r faultRuns) Detach(ctx context.Context, runID string, epoch int64, key string, now int64) (contract.RunState, error) {
	return Write(r.f, ctx, "Runs.Detach", func() (contract.RunState, error) {
		return r.FencedRuns.Detach(ctx, runID, epoch, key, now)
	})
}

// Lapse is a conditional write.
func (r faultRuns) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	return write0(r.f, ctx, "Runs.Lapse", func() error { return r.FencedRuns.Lapse(ctx, runID, epoch, leaseUntil) })
}

// RequestCancel is a conditional write.
func (r faultRuns) RequestCancel(ctx context.Context, runID string) (contract.RunState, error) {
	return Write(r.f, ctx, "Runs.RequestCancel", func() (contract.RunState, error) { return r.FencedRuns.RequestCancel(ctx, runID) })
}

type faultIntents struct {
	contract.IntentStore
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
func (i faultIntents) Get(ctx context.Context, key string) (*contract.Intent, error) {
	return Read(i.f, ctx, "Intents.Get", func() (*contract.Intent, error) { return i.IntentStore.Get(ctx, key) })
}

// Drop is a conditional write.
func (i faultIntents) Drop(ctx context.Context, key string, token int64) error {
	return write0(i.f, ctx, "Intents.Drop", func() error { return i.IntentStore.Drop(ctx, key, token) })
}

type faultLog struct {
	contract.EventLog
	f *FaultBackend
}

// Append is a conditional write.
func (l faultLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	return Write(l.f, ctx, "Log.Append", func() (contract.AppendResult, error) { return l.EventLog.Append(ctx, runID, at, events) })
}

// Fence is a conditional write.
func (l faultLog) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	return Write(l.f, ctx, "Log.Fence", func() (contract.AppendResult, error) { return l.EventLog.Fence(ctx, runID, epoch) })
}

// Read is counted and hooked.
func (l faultLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	if err := l.f.enter(ctx, "Log.Read"); err != nil {
		return nil, 0, false, err
	}
	return l.EventLog.Read(ctx, runID, after, limit)
}

// Close is a conditional write.
func (l faultLog) Close(ctx context.Context, runID string, at contract.Cursor) error {
	return write0(l.f, ctx, "Log.Close", func() error { return l.EventLog.Close(ctx, runID, at) })
}

// MarkCancel is a conditional write.
func (l faultLog) MarkCancel(ctx context.Context, runID string) error {
	return write0(l.f, ctx, "Log.MarkCancel", func() error { return l.EventLog.MarkCancel(ctx, runID) })
}

// MarkWatch is a conditional write.
func (l faultLog) MarkWatch(ctx context.Context, runID string) error {
	return write0(l.f, ctx, "Log.MarkWatch", func() error { return l.EventLog.MarkWatch(ctx, runID) })
}

// FindActiveRun is counted and hooked.
func (r faultRuns) FindActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	return Read(r.f, ctx, "Runs.FindActiveRun", func() (*contract.RunRecord, error) { return r.FencedRuns.FindActiveRun(ctx, threadID) })
}

// writer is the wrapped store's contract.RunWriter, when it has one.
func (r faultRuns) writer() (contract.RunWriter, error) {
	w, ok := r.FencedRuns.(contract.RunWriter)
	if !ok {
		return nil, fmt.Errorf("sandboxtest: the wrapped runs lack sandbox.RunWriter: %w", errors.ErrUnsupported)
	}
	return w, nil
}

// CreateOrResume is a conditional write (the wrapped contract.RunWriter's).
func (r faultRuns) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	w, err := r.writer()
	if err != nil {
		return contract.RunRecord{}, err
	}
	return Write(r.f, ctx, "Runs.CreateOrResume", func() (contract.RunRecord, error) { return w.CreateOrResume(ctx, in) })
}

// Update is a write (the wrapped contract.RunWriter's).
func (r faultRuns) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	w, err := r.writer()
	if err != nil {
		return err
	}
	return write0(r.f, ctx, "Runs.Update", func() error { return w.Update(ctx, runID, p) })
}

type faultReaper struct {
	contract.ReaperSource
	f *FaultBackend
}

// ReclaimCandidates is counted and hooked.
func (r faultReaper) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]contract.Candidate, error) {
	return Read(r.f, ctx, "Reaper.ReclaimCandidates", func() ([]contract.Candidate, error) { return r.ReaperSource.ReclaimCandidates(ctx, now, limit) })
}

// StopCandidates is counted and hooked.
func (r faultReaper) StopCandidates(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return Read(r.f, ctx, "Reaper.StopCandidates", func() ([]contract.InstanceRef, error) { return r.ReaperSource.StopCandidates(ctx, before, limit) })
}

// PendingReclaims is counted and hooked.
func (r faultReaper) PendingReclaims(ctx context.Context, limit int) ([]contract.InstanceRef, error) {
	return Read(r.f, ctx, "Reaper.PendingReclaims", func() ([]contract.InstanceRef, error) { return r.ReaperSource.PendingReclaims(ctx, limit) })
}

// IdleInstances is counted and hooked.
func (r faultReaper) IdleInstances(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return Read(r.f, ctx, "Reaper.IdleInstances", func() ([]contract.InstanceRef, error) { return r.ReaperSource.IdleInstances(ctx, before, limit) })
}

// StaleIntents is counted and hooked.
func (r faultReaper) StaleIntents(ctx context.Context, before int64, limit int) ([]contract.IntentRef, error) {
	return Read(r.f, ctx, "Reaper.StaleIntents", func() ([]contract.IntentRef, error) { return r.ReaperSource.StaleIntents(ctx, before, limit) })
}
