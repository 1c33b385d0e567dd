package faultrun

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Kind names the model an operation belongs to.
type Kind string

// The recorded kinds.
const (
	KindRun  Kind = "run"  // a fenced-run call (register model)
	KindLog  Kind = "log"  // an event-log call (log model)
	KindLock Kind = "lock" // a lock acquire or release (mutex model)
)

// Op is one recorded call as its caller saw it. Ambiguous calls failed with an
// infrastructure error: they may have applied, so they get no return before the end.
type Op struct {
	Kind      Kind
	Key       string // the partition: tenant/runId, or tenant/lock key
	Client    int    // the replica that issued it
	Call, Ret int64  // monotonic nanoseconds since the recorder started
	Input     any
	Output    any
	Ambiguous bool
	// Extra marks a possible repeated application of a write inside the interval of the
	// call it belongs to (an SDK retry of an attempt that landed): its output is
	// ambiguous, its interval is the call's.
	Extra bool
}

// Recorder keeps the history of every recorded call; safe for concurrent use.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
	n     atomic.Int64
}

// NewRecorder returns an empty recorder whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// now is the recorder's monotonic clock, in nanoseconds.
func (r *Recorder) now() int64 { return int64(time.Since(r.start)) }

// add records op.
func (r *Recorder) add(op Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
}

// Ops returns a copy of the history so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Len returns how many calls were recorded.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops)
}

// seq returns a fresh positive number (lock holder ids).
func (r *Recorder) seq() int64 { return r.n.Add(1) }

// errClass is a call's error as the models see it.
type errClass string

// The error classes; errOther is an infrastructure error (the call is ambiguous).
const (
	errNone       errClass = ""
	errUnknown    errClass = "unknown-run"
	errTerminal   errClass = "terminal-run"
	errSuperseded errClass = "superseded"
	errConflict   errClass = "conflict"
	errClosed     errClass = "log-closed"
	errInvalid    errClass = "invalid"
	errOther      errClass = "other"
)

// classify maps err to its class: a sentinel is the store's answer, anything else may
// have applied (a lost response, a timeout, an exhausted retry).
func classify(err error) errClass {
	switch {
	case err == nil:
		return errNone
	case errors.Is(err, contract.ErrUnknownRun):
		return errUnknown
	case errors.Is(err, contract.ErrTerminalRun):
		return errTerminal
	case errors.Is(err, contract.ErrSuperseded):
		return errSuperseded
	case errors.Is(err, contract.ErrConflict):
		return errConflict
	case errors.Is(err, contract.ErrLogClosed):
		return errClosed
	case errors.Is(err, contract.ErrInvalid), errors.Is(err, contract.ErrNoTenant):
		return errInvalid // refused, nothing applied
	}
	return errOther
}

// Verdict is the outcome of one porcupine check.
type Verdict struct {
	Model      Kind
	Result     porcupine.CheckResult
	Partitions int
	Ops        int
	Ambiguous  int
	Took       time.Duration
	// Info is porcupine's linearization info (for a visualization of an Illegal result).
	Info porcupine.LinearizationInfo
	// Illegal names the partitions (run or lock keys) found illegal when Result is Illegal.
	Illegal []string
}

// porcupineOps turns the recorded ops of kind into porcupine operations: an ambiguous op
// returns after everything else (it may have applied at any point after its call).
func porcupineOps(ops []Op, kind Kind) (out []porcupine.Operation, ambiguous int) {
	end := int64(math.MaxInt64 / 2)
	for _, op := range ops {
		if op.Kind != kind {
			continue
		}
		if op.Extra {
			ambiguous++
		}
		ret := op.Ret
		if op.Ambiguous && !op.Extra {
			ret = end
			ambiguous++
		}
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: keyed{op.Key, op.Input}, Call: op.Call, Output: op.Output, Return: ret})
	}
	return out, ambiguous
}

// keyed carries an op's partition key with its input.
type keyed struct {
	key string
	in  any
}

// partition splits a history by partition key.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	by := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range history {
		k := op.Input.(keyed).key
		if _, ok := by[k]; !ok {
			keys = append(keys, k)
		}
		by[k] = append(by[k], op)
	}
	slices.Sort(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, by[k])
	}
	return out
}

// Check runs porcupine over the ops of kind with the model of that kind, bounded by
// timeout (an Unknown result means the search did not finish in time).
func Check(ops []Op, kind Kind, timeout time.Duration) Verdict {
	hist, amb := porcupineOps(ops, kind)
	var m porcupine.Model
	switch kind {
	case KindRun:
		m = RunModel()
	case KindLog:
		m = LogModel()
	case KindLock:
		m = LockModel()
	default:
		panic("faultrun: unknown kind " + string(kind))
	}
	began := time.Now()
	res, info := porcupine.CheckOperationsVerbose(m, hist, timeout)
	v := Verdict{Model: kind, Result: res, Partitions: len(partition(hist)), Ops: len(hist),
		Ambiguous: amb, Took: time.Since(began), Info: info}
	if res == porcupine.Illegal {
		for _, part := range partition(hist) {
			if porcupine.CheckOperationsTimeout(m, part, timeout) == porcupine.Illegal {
				v.Illegal = append(v.Illegal, part[0].Input.(keyed).key)
			}
		}
	}
	return v
}

// withKey unwraps a keyed input inside a model's step.
func unkey(in any) any {
	if k, ok := in.(keyed); ok {
		return k.in
	}
	return in
}

// tenantKey is the partition key of id under ctx's tenant; a context without one (refused
// by the store) gets a key no tenant has.
func tenantKey(ctx context.Context, id string) string {
	t, err := contract.Tenant(ctx)
	if err != nil {
		return "!" + id
	}
	return t + "/" + id
}
