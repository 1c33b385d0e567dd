package faultrun

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// h builds a history of one partition: each op is (call, return, input, output);
// ret < 0 marks the op ambiguous.
type hop struct {
	call, ret int64
	in, out   any
}

func history(kind Kind, ops ...hop) []Op {
	var out []Op
	for i, o := range ops {
		op := Op{Kind: kind, Key: "t/run", Client: i, Call: o.call, Ret: o.ret, Input: o.in, Output: o.out}
		if o.ret < 0 {
			op.Ambiguous, op.Ret = true, o.call
		}
		out = append(out, op)
	}
	return out
}

func want(t *testing.T, name string, ops []Op, kind Kind, res porcupine.CheckResult) {
	t.Helper()
	if v := Check(ops, kind, 5*time.Second); v.Result != res {
		t.Errorf("%s: porcupine %s, want %s", name, v.Result, res)
	}
}

func running(epoch, lease int64) RunView {
	return RunView{Exists: true, Epoch: epoch, Status: contract.StatusRunning, Lease: lease, Key: "k"}
}

// TestRunModel checks the register model on hand-written histories from docs/design.md §2.2.
func TestRunModel(t *testing.T) {
	create := hop{0, 1, RunInput{Op: runCreate, Token: "c", Lease: 10, Key: "k"}, RunOutput{Created: true, View: running(1, 10)}}
	claim := func(call, ret int64, tok string, epoch int64) hop {
		return hop{call, ret, RunInput{Op: runClaim, Token: tok, Lease: 20, ClearDetached: true}, RunOutput{View: running(epoch, 20)}}
	}
	hb := func(call, ret, epoch int64, err errClass) hop {
		out := RunOutput{Err: err}
		if err == errNone {
			out.View = running(epoch, 30)
		}
		return hop{call, ret, RunInput{Op: runHeartbeat, Epoch: epoch, Lease: 30}, out}
	}
	want(t, "create, claim, superseded heartbeat", history(KindRun, create, claim(2, 3, "a", 2), hb(4, 5, 1, errSuperseded)), KindRun, porcupine.Ok)
	want(t, "heartbeat of epoch 1 succeeding after epoch 2 was claimed", history(KindRun, create, claim(2, 3, "a", 2), hb(4, 5, 1, errNone)), KindRun, porcupine.Illegal)
	want(t, "two claims answering one epoch", history(KindRun, create, claim(2, 5, "a", 2), claim(3, 6, "b", 2)), KindRun, porcupine.Illegal)
	want(t, "concurrent claims, distinct epochs", history(KindRun, create, claim(2, 5, "a", 3), claim(3, 6, "b", 2)), KindRun, porcupine.Ok)
	want(t, "a claim that burned an epoch (SDK retry of a landed claim)", history(KindRun, create, claim(2, 3, "a", 3)), KindRun, porcupine.Ok)
	lost := hop{2, -1, RunInput{Op: runClaim, Token: "a", Lease: 20, ClearDetached: true}, RunOutput{Err: errOther}}
	want(t, "an ambiguous claim may have applied", history(KindRun, create, lost, claim(4, 5, "b", 3)), KindRun, porcupine.Ok)
	want(t, "an ambiguous claim may not have applied", history(KindRun, create, lost, claim(4, 5, "b", 2)), KindRun, porcupine.Ok)
	want(t, "an epoch going back", history(KindRun, create, claim(2, 3, "a", 3), claim(4, 5, "b", 2)), KindRun, porcupine.Illegal)
	det := func(call, ret, now, got int64) hop {
		v := running(1, 10)
		v.HasDetached, v.Detached = true, got
		return hop{call, ret, RunInput{Op: runDetach, Epoch: 1, Key: "k", Now: now}, RunOutput{View: v}}
	}
	want(t, "a repeated detach keeps the first detachedSince", history(KindRun, create, det(2, 3, 100, 100), det(4, 5, 200, 100)), KindRun, porcupine.Ok)
	want(t, "a repeated detach pushing expiry back", history(KindRun, create, det(2, 3, 100, 100), det(4, 5, 200, 200)), KindRun, porcupine.Illegal)
	fin := hop{2, 3, RunInput{Op: runUpdate, Epoch: 1, Patch: runPatch{Status: contract.StatusCompleted}},
		RunOutput{View: RunView{Exists: true, Epoch: 1, Status: contract.StatusCompleted, Lease: 10, Key: "k"}}}
	want(t, "a claim of a terminal run refused", history(KindRun, create, fin,
		hop{4, 5, RunInput{Op: runClaim, Token: "a"}, RunOutput{Err: errTerminal}}), KindRun, porcupine.Ok)
	want(t, "a claim reviving a terminal run", history(KindRun, create, fin, claim(4, 5, "a", 2)), KindRun, porcupine.Illegal)
	want(t, "a retried terminal write succeeds idempotently", history(KindRun, create, fin, fin), KindRun, porcupine.Ok)
}

// TestLogModel checks the log model on hand-written histories from docs/design.md §2.4.
func TestLogModel(t *testing.T) {
	app := func(call, ret, epoch int64, batch string, src int64, err errClass) hop {
		out := LogOutput{Err: err}
		if err == errNone {
			out.CursorEpoch, out.Src = epoch, src
		}
		return hop{call, ret, LogInput{Op: logAppend, Epoch: epoch, Batch: batch, Src: src}, out}
	}
	fence := func(call, ret, epoch, src int64) hop {
		return hop{call, ret, LogInput{Op: logFence, Epoch: epoch}, LogOutput{CursorEpoch: epoch, Src: src}}
	}
	read := func(call, ret int64, events string) hop {
		return hop{call, ret, LogInput{Op: logRead}, LogOutput{Events: events}}
	}
	want(t, "append, fence, superseded append, read", history(KindLog,
		app(0, 1, 1, "1.1;", 1, errNone), fence(2, 3, 2, 1), app(4, 5, 1, "1.2;", 2, errSuperseded), read(6, 7, "1.1;")), KindLog, porcupine.Ok)
	want(t, "a stale epoch appending after a fence", history(KindLog,
		app(0, 1, 1, "1.1;", 1, errNone), fence(2, 3, 2, 1), app(4, 5, 1, "1.2;", 2, errNone)), KindLog, porcupine.Illegal)
	want(t, "an ambiguous append retried after a fence (its first attempt landed)", history(KindLog,
		app(0, -1, 1, "1.1;", 1, errOther), fence(2, 3, 2, 1), app(4, 5, 1, "1.1;", 1, errNone)), KindLog, porcupine.Ok)
	want(t, "a read missing an acknowledged event", history(KindLog,
		app(0, 1, 1, "1.1;", 1, errNone), app(2, 3, 1, "1.2;", 2, errNone), read(4, 5, "1.2;")), KindLog, porcupine.Illegal)
	want(t, "a read seeing a batch twice", history(KindLog,
		app(0, 1, 1, "1.1;", 1, errNone), read(4, 5, "1.1;1.1;")), KindLog, porcupine.Illegal)
	want(t, "a read seeing an ambiguous append that landed", history(KindLog,
		app(0, -1, 1, "1.1;", 1, errOther), read(4, 5, "1.1;")), KindLog, porcupine.Ok)
	want(t, "a fence reporting a Src never stored", history(KindLog,
		app(0, 1, 1, "1.1;", 1, errNone), fence(2, 3, 2, 7)), KindLog, porcupine.Illegal)
	closeOp := hop{2, 3, LogInput{Op: logClose, Epoch: 1}, LogOutput{}}
	want(t, "an append after close", history(KindLog, app(0, 1, 1, "1.1;", 1, errNone), closeOp,
		app(4, 5, 1, "1.2;", 2, errNone)), KindLog, porcupine.Illegal)
	want(t, "a superseded close changes nothing", history(KindLog, fence(0, 1, 2, 0),
		hop{2, 3, LogInput{Op: logClose, Epoch: 1}, LogOutput{Err: errSuperseded}}, app(4, 5, 2, "2.1;", 1, errNone)), KindLog, porcupine.Ok)
}

// TestLockModel checks the lock model: a mutex with increasing fences.
func TestLockModel(t *testing.T) {
	acq := func(call, ret, holder, fence int64) hop {
		return hop{call, ret, LockInput{Op: lockAcquire, Holder: holder}, LockOutput{Fence: fence}}
	}
	rel := func(call, ret, holder int64) hop {
		return hop{call, ret, LockInput{Op: lockRelease, Holder: holder}, LockOutput{}}
	}
	want(t, "two sections in turn", history(KindLock, acq(0, 1, 1, 1), rel(2, 3, 1), acq(4, 5, 2, 2), rel(6, 7, 2)), KindLock, porcupine.Ok)
	want(t, "overlapping sections", history(KindLock, acq(0, 1, 1, 1), acq(2, 3, 2, 2), rel(4, 5, 1), rel(6, 7, 2)), KindLock, porcupine.Illegal)
	want(t, "a fence going back", history(KindLock, acq(0, 1, 1, 2), rel(2, 3, 1), acq(4, 5, 2, 1), rel(6, 7, 2)), KindLock, porcupine.Illegal)
	want(t, "a lost lease released from the acquire on", history(KindLock, acq(0, 1, 1, 1), rel(1, 9, 1), acq(4, 5, 2, 2), rel(6, 7, 2)), KindLock, porcupine.Ok)
}
