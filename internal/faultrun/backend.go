package faultrun

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// ErrLostResponse is a Faults answer for a write it applied and then "lost": an
// infrastructure error (never a sentinel), so the caller must retry with its token.
var ErrLostResponse = errors.New("faultrun: response lost (the write was applied)")

// ErrInjected is a Faults answer for a call it failed without applying it.
var ErrInjected = errors.New("faultrun: injected failure (nothing was applied)")

// Faults injects failures into a backend that has no network to break (memstore): each
// write loses its response (applied, then ErrLostResponse) with probability Lose, and
// each call fails unapplied (ErrInjected) with probability Fail, from a seeded rand.
// Safe for concurrent use.
type Faults struct {
	Lose, Fail float64

	mu   sync.Mutex
	rng  *rand.Rand
	lost atomic.Int64
	fail atomic.Int64
}

// NewFaults returns Faults rolling a rand seeded with seed.
func NewFaults(seed uint64, lose, fail float64) *Faults {
	return &Faults{Lose: lose, Fail: fail, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Lost returns how many responses were lost (writes applied, then failed).
func (f *Faults) Lost() int64 { return f.lost.Load() }

// Failed returns how many calls were failed unapplied.
func (f *Faults) Failed() int64 { return f.fail.Load() }

func (f *Faults) roll(p float64) bool {
	if f == nil || p <= 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < p
}

// do runs fn under the faults: maybe fail before it, maybe lose its response after it.
func do[T any](f *Faults, write bool, fn func() (T, error)) (T, error) {
	var zero T
	if f.roll(f.failP()) {
		f.fail.Add(1)
		return zero, ErrInjected
	}
	v, err := fn()
	if write && err == nil && f.roll(f.loseP()) {
		f.lost.Add(1)
		return zero, ErrLostResponse
	}
	return v, err
}

func (f *Faults) failP() float64 {
	if f == nil {
		return 0
	}
	return f.Fail
}

func (f *Faults) loseP() float64 {
	if f == nil {
		return 0
	}
	return f.Lose
}

// Backend wraps a replica's backend: it records every fenced-run, event-log and lock call
// into the Recorder as its caller (the keeper) saw it, and, when Faults is set, fails
// calls and loses write responses beneath the recording. Instances and intents are
// passed through (faulted, not recorded).
type Backend struct {
	inner  sandbox.Backend
	rec    *Recorder
	client int
	faults *Faults
	// lockSection, when set, is called inside every lock section (the workload's overlap
	// counter); it returns a func to call on leaving.
	lockSection func(key string) func()
}

var (
	_ sandbox.Backend         = (*Backend)(nil)
	_ sandbox.StateRowReader  = (*Backend)(nil)
	_ sandbox.RowIntentReader = (*Backend)(nil)
)

// NewBackend wraps inner as replica client, recording into rec; faults may be nil.
func NewBackend(inner sandbox.Backend, rec *Recorder, client int, faults *Faults) *Backend {
	return &Backend{inner: inner, rec: rec, client: client, faults: faults}
}

// Instances returns the instance map (faulted, unrecorded).
func (b *Backend) Instances() sandbox.InstanceRows { return instances{b.inner.Instances(), b.faults} }

// Runs returns the recorded fenced-run store.
func (b *Backend) Runs() sandbox.FencedRuns { return runs{b, b.inner.Runs()} }

// Locks returns the recorded lock store.
func (b *Backend) Locks() sandbox.LockStore { return locks{b, b.inner.Locks()} }

// Log returns the recorded event log.
func (b *Backend) Log() sandbox.EventLog { return eventLog{b, b.inner.Log()} }

// Intents returns the intent store (faulted, unrecorded).
func (b *Backend) Intents() sandbox.IntentStore { return intents{b.inner.Intents(), b.faults} }

// Reaper returns the reaper source (faulted, unrecorded).
func (b *Backend) Reaper() sandbox.ReaperSource { return reaperSource{b.inner.Reaper(), b.faults} }

// GetStateAndRow reads the run (recorded as a state read) and the row, in one call when
// the inner backend can.
func (b *Backend) GetStateAndRow(ctx context.Context, runID, key string) (*sandbox.RunState, *sandbox.InstanceRow, error) {
	var row *sandbox.InstanceRow
	st, err := recordRun(b, ctx, runID, RunInput{Op: runState}, func(ctx context.Context) (*sandbox.RunState, error) {
		if rd, ok := b.inner.(sandbox.StateRowReader); ok {
			st, r, err := rd.GetStateAndRow(ctx, runID, key)
			row = r
			return st, err
		}
		st, err := b.inner.Runs().State(ctx, runID)
		if err != nil {
			return nil, err
		}
		row, err = b.inner.Instances().GetRow(ctx, key)
		return st, err
	}, func(st *sandbox.RunState) RunOutput { return RunOutput{View: viewOf(st)} })
	return st, row, err
}

// GetRowAndIntent reads a key's row and open intent (faulted, unrecorded).
func (b *Backend) GetRowAndIntent(ctx context.Context, key string) (*sandbox.InstanceRow, *sandbox.Intent, error) {
	type both struct {
		row *sandbox.InstanceRow
		in  *sandbox.Intent
	}
	v, err := do(b.faults, false, func() (both, error) {
		if rd, ok := b.inner.(sandbox.RowIntentReader); ok {
			row, in, err := rd.GetRowAndIntent(ctx, key)
			return both{row, in}, err
		}
		row, err := b.inner.Instances().GetRow(ctx, key)
		if err != nil {
			return both{}, err
		}
		in, err := b.inner.Intents().Get(ctx, key)
		return both{row, in}, err
	})
	return v.row, v.in, err
}

// recordRun runs fn as a recorded fenced-run call of runID.
func recordRun[T any](b *Backend, ctx context.Context, runID string, in RunInput, fn func(context.Context) (T, error), out func(T) RunOutput) (T, error) {
	write := in.Op != runState && in.Op != runGet
	att := new(attempts)
	actx := context.WithValue(ctx, attemptsKey{}, att)
	call := b.rec.now()
	v, err := do(b.faults, write, func() (T, error) { return fn(actx) })
	ret := b.rec.now()
	o := RunOutput{Err: classify(err)}
	if err == nil {
		o = out(v)
	}
	if o.Err != errInvalid {
		op := Op{Kind: KindRun, Key: tenantKey(ctx, runID), Client: b.client, Call: call, Ret: ret,
			Input: in, Output: o, Ambiguous: o.Err == errOther}
		b.rec.add(op)
		b.reapplied(op, att, RunOutput{Err: errOther})
	}
	return v, err
}

// reapplied records, for a call whose SDK retried a write, that many extra applications
// within the call's interval: an attempt that landed before its response was lost is
// applied again by the retry, and the answer reflects only the last one.
func (b *Backend) reapplied(op Op, att *attempts, ambiguous any) {
	if op.Ambiguous {
		return // already may-have-applied, at any time after its call
	}
	for range min(att.retries(), MaxBurn) {
		x := op
		x.Output, x.Extra = ambiguous, true
		b.rec.add(x)
	}
}

// recordLog runs fn as a recorded event-log call of runID.
func recordLog[T any](b *Backend, ctx context.Context, runID string, in LogInput, fn func(context.Context) (T, error), out func(T) LogOutput) (T, error) {
	att := new(attempts)
	actx := context.WithValue(ctx, attemptsKey{}, att)
	call := b.rec.now()
	v, err := do(b.faults, in.Op != logRead, func() (T, error) { return fn(actx) })
	ret := b.rec.now()
	o := LogOutput{Err: classify(err)}
	if err == nil {
		o = out(v)
	}
	if o.Err != errInvalid {
		op := Op{Kind: KindLog, Key: tenantKey(ctx, runID), Client: b.client, Call: call, Ret: ret,
			Input: in, Output: o, Ambiguous: o.Err == errOther}
		b.rec.add(op)
		b.reapplied(op, att, LogOutput{Err: errOther})
	}
	return v, err
}

type runs struct {
	b     *Backend
	inner sandbox.FencedRuns
}

func stateOut(st sandbox.RunState) RunOutput { return RunOutput{View: viewOf(&st)} }

// writer is the inner store's reference writes (sandbox.RunWriter), when it has them.
func (r runs) writer() (sandbox.RunWriter, error) {
	w, ok := r.inner.(sandbox.RunWriter)
	if !ok {
		return nil, fmt.Errorf("faultrun: the inner runs lack sandbox.RunWriter: %w", errors.ErrUnsupported)
	}
	return w, nil
}

func (r runs) CreateOrResume(ctx context.Context, in sandbox.NewRun) (sandbox.RunRecord, error) {
	w, err := r.writer()
	if err != nil {
		return sandbox.RunRecord{}, err
	}
	return do(r.b.faults, true, func() (sandbox.RunRecord, error) { return w.CreateOrResume(ctx, in) })
}

func (r runs) Update(ctx context.Context, runID string, p sandbox.RunPatch) error {
	w, err := r.writer()
	if err != nil {
		return err
	}
	_, err = recordRun(r.b, ctx, runID, RunInput{Op: runPlain, Patch: modelPatch(p)}, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, w.Update(ctx, runID, p)
	}, func(struct{}) RunOutput { return RunOutput{} })
	return err
}

func (r runs) FindActiveRun(ctx context.Context, threadID string) (*sandbox.RunRecord, error) {
	return do(r.b.faults, false, func() (*sandbox.RunRecord, error) { return r.inner.FindActiveRun(ctx, threadID) })
}

func (r runs) State(ctx context.Context, runID string) (*sandbox.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runState}, func(ctx context.Context) (*sandbox.RunState, error) {
		return r.inner.State(ctx, runID)
	}, func(st *sandbox.RunState) RunOutput { return RunOutput{View: viewOf(st)} })
}

func (r runs) CreateClaimed(ctx context.Context, in sandbox.CreateClaimedRun) (sandbox.RunState, bool, error) {
	type res struct {
		st      sandbox.RunState
		created bool
	}
	v, err := recordRun(r.b, ctx, in.RunID, RunInput{Op: runCreate, Token: in.Token, Lease: in.LeaseUntil, Key: in.SandboxKey, Psid: in.ProviderSandboxID},
		func(ctx context.Context) (res, error) {
			st, created, err := r.inner.CreateClaimed(ctx, in)
			return res{st, created}, err
		}, func(v res) RunOutput { return RunOutput{Created: v.created, View: viewOf(&v.st)} })
	return v.st, v.created, err
}

func (r runs) Claim(ctx context.Context, runID string, c sandbox.Claim) (sandbox.RunState, error) {
	in := RunInput{Op: runClaim, Token: c.Token, Lease: c.LeaseUntil, ClearDetached: c.ClearDetached, CondCancelled: c.If.Cancelled}
	if c.If.DetachedSince != nil {
		in.CondDetached, in.Detached = true, *c.If.DetachedSince
	}
	if c.If.Cutoff != nil {
		in.CondCutoff, in.Cutoff = true, *c.If.Cutoff
	}
	return recordRun(r.b, ctx, runID, in, func(ctx context.Context) (sandbox.RunState, error) { return r.inner.Claim(ctx, runID, c) }, stateOut)
}

func (r runs) UpdateFenced(ctx context.Context, runID string, epoch int64, p sandbox.RunPatch) (sandbox.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runUpdate, Epoch: epoch, Patch: modelPatch(p)},
		func(ctx context.Context) (sandbox.RunState, error) { return r.inner.UpdateFenced(ctx, runID, epoch, p) }, stateOut)
}

func (r runs) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (sandbox.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runRecord, Epoch: epoch, Psid: psid},
		func(ctx context.Context) (sandbox.RunState, error) {
			return r.inner.RecordSandbox(ctx, runID, epoch, psid)
		}, stateOut)
}

func (r runs) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (sandbox.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runHeartbeat, Epoch: epoch, Lease: leaseUntil},
		func(ctx context.Context) (sandbox.RunState, error) {
			return r.inner.Heartbeat(ctx, runID, epoch, leaseUntil)
		}, stateOut)
}

func (r runs) Detach(ctx context.Context, runID string, epoch int64, key string, now int64) (sandbox.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runDetach, Epoch: epoch, Key: key, Now: now},
		func(ctx context.Context) (sandbox.RunState, error) {
			return r.inner.Detach(ctx, runID, epoch, key, now)
		}, stateOut)
}

func (r runs) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	_, err := recordRun(r.b, ctx, runID, RunInput{Op: runLapse, Epoch: epoch, Lease: leaseUntil},
		func(ctx context.Context) (struct{}, error) {
			return struct{}{}, r.inner.Lapse(ctx, runID, epoch, leaseUntil)
		},
		func(struct{}) RunOutput { return RunOutput{} })
	return err
}

func (r runs) RequestCancel(ctx context.Context, runID string) (sandbox.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runCancel},
		func(ctx context.Context) (sandbox.RunState, error) { return r.inner.RequestCancel(ctx, runID) }, stateOut)
}

func (r runs) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	return do(r.b.faults, false, func() ([]string, error) { return r.inner.RunsUsingKey(ctx, key) })
}

type eventLog struct {
	b     *Backend
	inner sandbox.EventLog
}

func appendOut(res sandbox.AppendResult) LogOutput {
	return LogOutput{CursorEpoch: res.Cursor.Epoch, Src: res.Src, Cancel: res.CancelRequested}
}

func (l eventLog) Append(ctx context.Context, runID string, at sandbox.Cursor, events []sandbox.Event) (sandbox.AppendResult, error) {
	return recordLog(l.b, ctx, runID, LogInput{Op: logAppend, Epoch: at.Epoch, Batch: encodeEvents(events), Src: sandbox.MaxSrc(0, events)},
		func(ctx context.Context) (sandbox.AppendResult, error) { return l.inner.Append(ctx, runID, at, events) }, appendOut)
}

func (l eventLog) Fence(ctx context.Context, runID string, epoch int64) (sandbox.AppendResult, error) {
	return recordLog(l.b, ctx, runID, LogInput{Op: logFence, Epoch: epoch},
		func(ctx context.Context) (sandbox.AppendResult, error) { return l.inner.Fence(ctx, runID, epoch) }, appendOut)
}

type page struct {
	events []sandbox.Event
	next   int64
	closed bool
}

func (l eventLog) Read(ctx context.Context, runID string, after int64, limit int) ([]sandbox.Event, int64, bool, error) {
	read := func(ctx context.Context) (page, error) {
		evs, next, closed, err := l.inner.Read(ctx, runID, after, limit)
		return page{evs, next, closed}, err
	}
	var p page
	var err error
	if after == 0 {
		p, err = recordLog(l.b, ctx, runID, LogInput{Op: logRead}, read,
			func(p page) LogOutput { return LogOutput{Events: encodeEvents(p.events), Closed: p.closed} })
	} else {
		p, err = do(l.b.faults, false, func() (page, error) { return read(ctx) })
	}
	return p.events, p.next, p.closed, err
}

func (l eventLog) Close(ctx context.Context, runID string, at sandbox.Cursor) error {
	_, err := recordLog(l.b, ctx, runID, LogInput{Op: logClose, Epoch: at.Epoch},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, l.inner.Close(ctx, runID, at) },
		func(struct{}) LogOutput { return LogOutput{} })
	return err
}

func (l eventLog) MarkCancel(ctx context.Context, runID string) error {
	_, err := recordLog(l.b, ctx, runID, LogInput{Op: logCancel},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, l.inner.MarkCancel(ctx, runID) },
		func(struct{}) LogOutput { return LogOutput{} })
	return err
}

type locks struct {
	b     *Backend
	inner sandbox.LockStore
}

// WithLock records the acquire (from the call to fn's entry, with the fence fn sees) and
// the release (from fn's exit to the return; from the acquire's end when the lease was
// lost, since it ended at some unknown moment while fn ran).
func (l locks) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	holder := l.b.rec.seq()
	pk := tenantKey(ctx, key)
	call := l.b.rec.now()
	var acquired, left int64
	var lost bool
	err := l.inner.WithLock(ctx, key, func(lctx context.Context) error {
		acquired = l.b.rec.now()
		l.b.rec.add(Op{Kind: KindLock, Key: pk, Client: l.b.client, Call: call, Ret: acquired,
			Input: LockInput{Op: lockAcquire, Holder: holder}, Output: LockOutput{Fence: sandbox.LeaseFence(lctx)}})
		var leave func()
		if l.b.lockSection != nil {
			leave = l.b.lockSection(pk)
		}
		ferr := fn(lctx)
		if leave != nil {
			leave()
		}
		lost = errors.Is(context.Cause(lctx), sandbox.ErrLeaseLost)
		left = l.b.rec.now()
		return ferr
	})
	if acquired != 0 {
		from := left
		if lost {
			from = acquired
		}
		l.b.rec.add(Op{Kind: KindLock, Key: pk, Client: l.b.client, Call: from, Ret: l.b.rec.now(),
			Input: LockInput{Op: lockRelease, Holder: holder}, Output: LockOutput{}})
	}
	return err
}

type instances struct {
	inner  sandbox.InstanceRows
	faults *Faults
}

func (i instances) GetRow(ctx context.Context, key string) (*sandbox.InstanceRow, error) {
	return do(i.faults, false, func() (*sandbox.InstanceRow, error) { return i.inner.GetRow(ctx, key) })
}

func (i instances) CreateRow(ctx context.Context, rec sandbox.InstanceRecord, inc string) error {
	return do0(i.faults, true, func() error { return i.inner.CreateRow(ctx, rec, inc) })
}

func (i instances) ReplaceRow(ctx context.Context, rec sandbox.InstanceRecord, prev, next string) error {
	return do0(i.faults, true, func() error { return i.inner.ReplaceRow(ctx, rec, prev, next) })
}

func (i instances) Touch(ctx context.Context, key, psid, latestRunID string, now int64) error {
	return do0(i.faults, true, func() error { return i.inner.Touch(ctx, key, psid, latestRunID, now) })
}

func (i instances) SetSnapshot(ctx context.Context, key, psid, prev, snapshotID string, now int64) error {
	return do0(i.faults, true, func() error { return i.inner.SetSnapshot(ctx, key, psid, prev, snapshotID, now) })
}

func (i instances) DropStaleSnapshot(ctx context.Context, key, snapshotID string) error {
	return do0(i.faults, true, func() error { return i.inner.DropStaleSnapshot(ctx, key, snapshotID) })
}

func (i instances) MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error {
	return do0(i.faults, true, func() error {
		return i.inner.MarkReclaiming(ctx, key, psid, updatedAt, idleBefore, token)
	})
}

func (i instances) DeleteReclaimed(ctx context.Context, key, token string) error {
	return do0(i.faults, true, func() error { return i.inner.DeleteReclaimed(ctx, key, token) })
}

func (i instances) DeferReclaim(ctx context.Context, key, psid string, due int64) error {
	return do0(i.faults, true, func() error { return i.inner.DeferReclaim(ctx, key, psid, due) })
}

func do0(f *Faults, write bool, fn func() error) error {
	_, err := do(f, write, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

type intents struct {
	inner  sandbox.IntentStore
	faults *Faults
}

func (i intents) Put(ctx context.Context, key string, token, now int64) error {
	return do0(i.faults, true, func() error { return i.inner.Put(ctx, key, token, now) })
}

func (i intents) Record(ctx context.Context, key string, token int64, psid string) error {
	return do0(i.faults, true, func() error { return i.inner.Record(ctx, key, token, psid) })
}

func (i intents) Get(ctx context.Context, key string) (*sandbox.Intent, error) {
	return do(i.faults, false, func() (*sandbox.Intent, error) { return i.inner.Get(ctx, key) })
}

func (i intents) Drop(ctx context.Context, key string, token int64) error {
	return do0(i.faults, true, func() error { return i.inner.Drop(ctx, key, token) })
}

type reaperSource struct {
	inner  sandbox.ReaperSource
	faults *Faults
}

func (r reaperSource) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]sandbox.Candidate, error) {
	return do(r.faults, false, func() ([]sandbox.Candidate, error) { return r.inner.ReclaimCandidates(ctx, now, limit) })
}

func (r reaperSource) PendingReclaims(ctx context.Context, limit int) ([]sandbox.InstanceRef, error) {
	return do(r.faults, false, func() ([]sandbox.InstanceRef, error) { return r.inner.PendingReclaims(ctx, limit) })
}

func (r reaperSource) IdleInstances(ctx context.Context, before int64, limit int) ([]sandbox.InstanceRef, error) {
	return do(r.faults, false, func() ([]sandbox.InstanceRef, error) { return r.inner.IdleInstances(ctx, before, limit) })
}

func (r reaperSource) StaleIntents(ctx context.Context, before int64, limit int) ([]sandbox.IntentRef, error) {
	return do(r.faults, false, func() ([]sandbox.IntentRef, error) { return r.inner.StaleIntents(ctx, before, limit) })
}
