package faultrun

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// Faults is the Policy of a fault run over a backend that has no network to break
// (memstore): each write loses its response (applied, then storetest.ErrLostResponse)
// with probability Lose, and each call but a lock section fails unapplied
// (storetest.ErrInjected) with probability Fail, from a seeded rand. Safe for concurrent use.
type Faults struct {
	LoseP, FailP float64

	mu   sync.Mutex
	rng  *rand.Rand
	lost atomic.Int64
	fail atomic.Int64
}

var _ storetest.Policy = (*Faults)(nil)

// NewFaults returns Faults rolling a rand seeded with seed.
func NewFaults(seed uint64, lose, fail float64) *Faults {
	return &Faults{LoseP: lose, FailP: fail, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Lost returns how many responses were lost (writes applied, then failed).
func (f *Faults) Lost() int64 { return f.lost.Load() }

// Failed returns how many calls were failed unapplied.
func (f *Faults) Failed() int64 { return f.fail.Load() }

// Fail rolls for a call of method; lock sections never fail (the lock model records them).
func (f *Faults) Fail(method string) bool {
	if method == "Locks.WithLock" || !f.roll(f.FailP) {
		return false
	}
	f.fail.Add(1)
	return true
}

// Lose rolls for an applied write.
func (f *Faults) Lose(string) bool {
	if !f.roll(f.LoseP) {
		return false
	}
	f.lost.Add(1)
	return true
}

func (f *Faults) roll(p float64) bool {
	if p <= 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < p
}

// Backend wraps a replica's backend: it records every fenced-run, event-log and lock call
// into the Recorder as its caller (the keeper) saw it, over a storetest.FaultBackend
// that, when Faults is set, fails calls and loses write responses beneath the recording.
// Instances, intents and the reaper source are the fault backend's (faulted, not recorded).
type Backend struct {
	inner  *storetest.FaultBackend
	rec    *Recorder
	client int
	// lockSection, when set, is called inside every lock section (the workload's overlap
	// counter); it returns a func to call on leaving.
	lockSection func(key string) func()
}

var (
	_ contract.Backend         = (*Backend)(nil)
	_ contract.StateRowReader  = (*Backend)(nil)
	_ contract.RowIntentReader = (*Backend)(nil)
)

// NewBackend wraps inner as replica client, recording into rec; faults may be nil.
func NewBackend(inner contract.Backend, rec *Recorder, client int, faults *Faults) *Backend {
	fb := storetest.NewFaultBackend(inner)
	if faults != nil {
		fb.SetPolicy(faults)
	}
	return &Backend{inner: fb, rec: rec, client: client}
}

// Instances returns the instance map (faulted, unrecorded).
func (b *Backend) Instances() contract.InstanceRows { return b.inner.Instances() }

// Runs returns the recorded fenced-run store.
func (b *Backend) Runs() contract.FencedRuns { return runs{b, b.inner.Runs()} }

// Locks returns the recorded lock store.
func (b *Backend) Locks() contract.LockStore { return locks{b, b.inner.Locks()} }

// Log returns the recorded event log.
func (b *Backend) Log() contract.EventLog { return eventLog{b, b.inner.Log()} }

// Intents returns the intent store (faulted, unrecorded).
func (b *Backend) Intents() contract.IntentStore { return b.inner.Intents() }

// Reaper returns the reaper source (faulted, unrecorded).
func (b *Backend) Reaper() contract.ReaperSource { return b.inner.Reaper() }

// GetStateAndRow reads the run (recorded as a state read) and the row, in one call when
// the inner backend can.
func (b *Backend) GetStateAndRow(ctx context.Context, runID, key string) (*contract.RunState, *contract.InstanceRow, error) {
	var row *contract.InstanceRow
	st, err := recordRun(b, ctx, runID, RunInput{Op: runState}, func(ctx context.Context) (*contract.RunState, error) {
		if rd, ok := b.inner.Inner().(contract.StateRowReader); ok {
			return storetest.Read(b.inner, ctx, "GetStateAndRow", func() (*contract.RunState, error) {
				st, r, err := rd.GetStateAndRow(ctx, runID, key)
				row = r
				return st, err
			})
		}
		st, err := b.inner.Runs().State(ctx, runID)
		if err != nil {
			return nil, err
		}
		row, err = b.inner.Instances().GetRow(ctx, key)
		return st, err
	}, func(st *contract.RunState) RunOutput { return RunOutput{View: viewOf(st)} })
	return st, row, err
}

// GetRowAndIntent reads a key's row and open intent (faulted, unrecorded).
func (b *Backend) GetRowAndIntent(ctx context.Context, key string) (*contract.InstanceRow, *contract.Intent, error) {
	type both struct {
		row *contract.InstanceRow
		in  *contract.Intent
	}
	if rd, ok := b.inner.Inner().(contract.RowIntentReader); ok {
		v, err := storetest.Read(b.inner, ctx, "GetRowAndIntent", func() (both, error) {
			row, in, err := rd.GetRowAndIntent(ctx, key)
			return both{row, in}, err
		})
		return v.row, v.in, err
	}
	row, err := b.inner.Instances().GetRow(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	in, err := b.inner.Intents().Get(ctx, key)
	return row, in, err
}

// recordRun runs fn as a recorded fenced-run call of runID.
func recordRun[T any](b *Backend, ctx context.Context, runID string, in RunInput, fn func(context.Context) (T, error), out func(T) RunOutput) (T, error) {
	att := new(attempts)
	actx := context.WithValue(ctx, attemptsKey{}, att)
	call := b.rec.now()
	v, err := fn(actx)
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
	v, err := fn(actx)
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
	inner contract.FencedRuns
}

func stateOut(st contract.RunState) RunOutput { return RunOutput{View: viewOf(&st)} }

// writer is the inner store's reference writes (contract.RunWriter), when it has them.
func (r runs) writer() (contract.RunWriter, error) {
	w, ok := r.inner.(contract.RunWriter)
	if !ok {
		return nil, fmt.Errorf("faultrun: the inner runs lack sandbox.RunWriter: %w", errors.ErrUnsupported)
	}
	return w, nil
}

func (r runs) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	w, err := r.writer()
	if err != nil {
		return contract.RunRecord{}, err
	}
	return w.CreateOrResume(ctx, in)
}

func (r runs) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	w, err := r.writer()
	if err != nil {
		return err
	}
	_, err = recordRun(r.b, ctx, runID, RunInput{Op: runPlain, Patch: modelPatch(p)}, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, w.Update(ctx, runID, p)
	}, func(struct{}) RunOutput { return RunOutput{} })
	return err
}

func (r runs) FindActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	return r.inner.FindActiveRun(ctx, threadID)
}

func (r runs) State(ctx context.Context, runID string) (*contract.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runState}, func(ctx context.Context) (*contract.RunState, error) {
		return r.inner.State(ctx, runID)
	}, func(st *contract.RunState) RunOutput { return RunOutput{View: viewOf(st)} })
}

func (r runs) CreateClaimed(ctx context.Context, in contract.CreateClaimedRun) (contract.RunState, bool, error) {
	type res struct {
		st      contract.RunState
		created bool
	}
	v, err := recordRun(r.b, ctx, in.RunID, RunInput{Op: runCreate, Token: in.Token, Lease: in.LeaseUntil, Key: in.SandboxKey, Psid: in.ProviderSandboxID},
		func(ctx context.Context) (res, error) {
			st, created, err := r.inner.CreateClaimed(ctx, in)
			return res{st, created}, err
		}, func(v res) RunOutput { return RunOutput{Created: v.created, View: viewOf(&v.st)} })
	return v.st, v.created, err
}

func (r runs) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	in := RunInput{Op: runClaim, Token: c.Token, Lease: c.LeaseUntil, ClearDetached: c.ClearDetached, CondCancelled: c.If.Cancelled}
	if c.If.DetachedSince != nil {
		in.CondDetached, in.Detached = true, *c.If.DetachedSince
	}
	if c.If.Cutoff != nil {
		in.CondCutoff, in.Cutoff = true, *c.If.Cutoff
	}
	if c.If.Unheld != nil {
		in.CondUnheld, in.Unheld = true, *c.If.Unheld
	}
	return recordRun(r.b, ctx, runID, in, func(ctx context.Context) (contract.RunState, error) { return r.inner.Claim(ctx, runID, c) }, stateOut)
}

func (r runs) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runUpdate, Epoch: epoch, Patch: modelPatch(p)},
		func(ctx context.Context) (contract.RunState, error) {
			return r.inner.UpdateFenced(ctx, runID, epoch, p)
		}, stateOut)
}

func (r runs) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (contract.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runRecord, Epoch: epoch, Psid: psid},
		func(ctx context.Context) (contract.RunState, error) {
			return r.inner.RecordSandbox(ctx, runID, epoch, psid)
		}, stateOut)
}

func (r runs) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (contract.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runHeartbeat, Epoch: epoch, Lease: leaseUntil},
		func(ctx context.Context) (contract.RunState, error) {
			return r.inner.Heartbeat(ctx, runID, epoch, leaseUntil)
		}, stateOut)
}

func (r runs) Detach(ctx context.Context, runID string, epoch int64, key string, now int64) (contract.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runDetach, Epoch: epoch, Key: key, Now: now},
		func(ctx context.Context) (contract.RunState, error) {
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

func (r runs) RequestCancel(ctx context.Context, runID string) (contract.RunState, error) {
	return recordRun(r.b, ctx, runID, RunInput{Op: runCancel},
		func(ctx context.Context) (contract.RunState, error) { return r.inner.RequestCancel(ctx, runID) }, stateOut)
}

// ClearLaunch passes through unrecorded: the histories never give a run a launch
// deadline, so the run model has no launchBy to clear.
func (r runs) ClearLaunch(ctx context.Context, runID string) (contract.RunState, error) {
	return r.inner.ClearLaunch(ctx, runID)
}

func (r runs) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	return r.inner.RunsUsingKey(ctx, key)
}

type eventLog struct {
	b     *Backend
	inner contract.EventLog
}

func appendOut(res contract.AppendResult) LogOutput {
	return LogOutput{CursorEpoch: res.Cursor.Epoch, Src: res.Src, Cancel: res.CancelRequested}
}

func (l eventLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	return recordLog(l.b, ctx, runID, LogInput{Op: logAppend, Epoch: at.Epoch, Batch: encodeEvents(events), Src: contract.MaxSrc(0, events)},
		func(ctx context.Context) (contract.AppendResult, error) {
			return l.inner.Append(ctx, runID, at, events)
		}, appendOut)
}

func (l eventLog) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	return recordLog(l.b, ctx, runID, LogInput{Op: logFence, Epoch: epoch},
		func(ctx context.Context) (contract.AppendResult, error) { return l.inner.Fence(ctx, runID, epoch) }, appendOut)
}

type page struct {
	events []contract.Event
	next   int64
	closed bool
}

func (l eventLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
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
		p, err = read(ctx)
	}
	return p.events, p.next, p.closed, err
}

func (l eventLog) Close(ctx context.Context, runID string, at contract.Cursor) error {
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

func (l eventLog) MarkWatch(ctx context.Context, runID string) error {
	_, err := recordLog(l.b, ctx, runID, LogInput{Op: logWatch},
		func(ctx context.Context) (struct{}, error) { return struct{}{}, l.inner.MarkWatch(ctx, runID) },
		func(struct{}) LogOutput { return LogOutput{} })
	return err
}

type locks struct {
	b     *Backend
	inner contract.LockStore
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
			Input: LockInput{Op: lockAcquire, Holder: holder}, Output: LockOutput{Fence: contract.LeaseFence(lctx)}})
		var leave func()
		if l.b.lockSection != nil {
			leave = l.b.lockSection(pk)
		}
		ferr := fn(lctx)
		if leave != nil {
			leave()
		}
		lost = errors.Is(context.Cause(lctx), contract.ErrLeaseLost)
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
