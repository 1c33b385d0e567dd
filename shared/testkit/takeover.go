package testkit

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/driver"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// RunTakeoverConformance proves that a run survives its host (docs/design.md §4.2, §6; reference
// takeover-conformance T1–T7) on a backend and a provider with a real shell: a successor
// resumes at the log's highest Src and delivers every line exactly once; the attach
// preflight answers unknown-run / terminal-run at once and bounds its wait for a journal;
// of two concurrent drivers with no lock the epoch fence alone stops the loser; a finished
// run's journal is deleted only after its terminal write and close; a successor resuming
// inside a long line (T8) stores the rest of it exactly once.
func RunTakeoverConformance(t *testing.T, newBackend NewBackend, newProvider NewProvider) {
	t.Helper()
	runRigCases(t, []rigCase{
		{"T1 a successor delivers the run exactly once after the host dies mid-stream", takeoverT1},
		{"T2 attach to an unknown run is unknown-run without waiting", takeoverT2},
		{"T3 attach to a terminal run without journal is terminal-run", takeoverT3},
		{"T4 attach waits for a live run's late journal", takeoverT4},
		{"T5 attach bounds its wait with journal-timeout", takeoverT5},
		{"T6 of two concurrent drivers the loser appends nothing after the fence", takeoverT6},
		{"T7 a finished run's journal is deleted and a later attach is terminal-run", takeoverT7},
		{"T8 a successor resumes inside a long line and stores the rest exactly once", takeoverT8},
	}, newBackend, newProvider)
}

// drive drives runID in psid in-process from d (what Start/Attach answered) with the suites'
// settings; log, when set, wraps the pump's appends (a test's hold at that seam).
func (r *rig) drive(ctx context.Context, runID, psid string, d keeper.Driver, log func(agentrun.Log) agentrun.Log) (driver.Result, error) {
	return r.driveWith(ctx, runID, psid, d, log, r.ex)
}

// driveWith is drive reading the journal through ex.
func (r *rig) driveWith(ctx context.Context, runID, psid string, d keeper.Driver, log func(agentrun.Log) agentrun.Log, ex contract.Executor) (driver.Result, error) {
	svc, err := agentrun.NewService(agentrun.ServiceConfig{Keeper: r.k, Dir: rigJournalDir, PollMin: 10 * time.Millisecond, PollMax: 20 * time.Millisecond})
	if err != nil {
		return driver.Result{}, err
	}
	var l agentrun.Log = r.k
	if log != nil {
		l = log(l)
	}
	tr, err := driver.NewLocal(svc, driver.LocalConfig{RunID: runID, Driver: d, Executor: ex, SandboxID: psid, Log: l, BatchEvents: 1})
	if err != nil {
		return driver.Result{}, err
	}
	return driver.Drive(ctx, tr, driver.Config{RunID: runID, LeaseMs: d.LeaseMs, CancelRequested: d.CancelRequested,
		PumpWait: 200 * time.Millisecond})
}

// heldLog calls before ahead of every append (a test's seam in the pump).
type heldLog struct {
	agentrun.Log
	before func(ctx context.Context, events []contract.Event)
}

func (h heldLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	h.before(ctx, events)
	return h.Log.Append(ctx, runID, at, events)
}

// getRun is the preflight's record lookup through the keeper.
func (r *rig) getRun(runID string) func(ctx context.Context) (*contract.RunRecord, error) {
	return func(ctx context.Context) (*contract.RunRecord, error) {
		rec, err := r.k.Get(ctx, runID)
		if err != nil {
			return nil, err
		}
		return &rec, nil
	}
}

func takeoverT1(t *testing.T, r *rig) {
	runID := r.id("tko-t1")
	res := r.start(runID, runID+"-t")
	psid := res.Sandbox.ProviderSandboxID
	gate := "gate-" + runID
	r.launch(psid, runID, printDeltas("1", "2", "3")+waitGate(gate)+printDeltas("4", "5", "6"))

	// The host drives, delivers 3 lines and dies (its context ends: no finish, no close).
	hctx, die := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := r.drive(hctx, runID, psid, res.Driver, nil)
		done <- err
	}()
	r.eventually("the host to deliver 3 events", func() bool { return len(r.events(runID)) >= 3 })
	die()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("dying host: %v", err)
	}
	if got := deltas(t, r.events(runID)); strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("the host delivered %v", got)
	}

	// A successor attaches: epoch 2, resuming at the log's highest Src.
	att, err := r.k.Attach(r.ctx, runID)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if att.Driver.Epoch != 2 || att.Driver.Src == 0 {
		t.Fatalf("attach driver = %+v", att.Driver)
	}
	if err := agentrun.AwaitJournal(r.ctx, r.ex, psid, rigJournalDir, runID, r.getRun(runID), 0, 0); err != nil {
		t.Fatalf("preflight: %v", err)
	}
	r.exec(psid, ": >> "+journal.Quote(gate))
	out, err := r.drive(r.ctx, runID, psid, att.Driver, nil)
	if err != nil || out.Outcome != driver.Completed || out.Events != 3 {
		t.Fatalf("successor: %+v, %v", out, err)
	}
	evs := r.events(runID)
	if got := deltas(t, evs); strings.Join(got, ",") != "1,2,3,4,5,6" {
		t.Fatalf("log = %v; want exactly 1..6 in order", got)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Src <= evs[i-1].Src {
			t.Fatalf("src not increasing at %d: %d after %d", i, evs[i].Src, evs[i-1].Src)
		}
	}
	st := r.state(runID)
	if st.Status != contract.StatusCompleted || st.Epoch() != 2 || st.Error != nil {
		t.Fatalf("record = %+v", st.RunRecord)
	}
	if r.exists(psid, r.paths(runID).Journal) {
		t.Fatal("the journal survived the finished run")
	}
}

// preflightCase runs the attach preflight with a counting executor.
func (r *rig) preflight(psid, runID string, wait time.Duration) (execs int64, err error) {
	ce := &countingExecutor{Executor: r.ex}
	err = agentrun.AwaitJournal(r.ctx, ce, psid, rigJournalDir, runID, r.getRun(runID), wait, 50*time.Millisecond)
	return ce.n.Load(), err
}

func wantReason(t *testing.T, err error, reason string) {
	t.Helper()
	var u *agentrun.Unavailable
	if !errors.As(err, &u) || !errors.Is(err, agentrun.ErrJournalUnavailable) || u.Reason != reason {
		t.Fatalf("preflight err = %v, want reason %s", err, reason)
	}
}

func takeoverT2(t *testing.T, r *rig) {
	execs, err := r.preflight(r.sandbox(), r.id("tko-t2"), 8*time.Second)
	wantReason(t, err, agentrun.ReasonUnknownRun)
	if execs != 1 {
		t.Fatalf("%d execs; want exactly 1 (no polling)", execs)
	}
}

func takeoverT3(t *testing.T, r *rig) {
	runID := r.id("tko-t3")
	res := r.start(runID, runID+"-t")
	if _, err := r.k.Finish(r.ctx, runID, res.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted}); err != nil {
		t.Fatal(err)
	}
	execs, err := r.preflight(res.Sandbox.ProviderSandboxID, runID, 8*time.Second)
	wantReason(t, err, agentrun.ReasonTerminalRun)
	if execs != 1 {
		t.Fatalf("%d execs; want exactly 1", execs)
	}
}

func takeoverT4(t *testing.T, r *rig) {
	runID := r.id("tko-t4")
	res := r.start(runID, runID+"-t")
	psid := res.Sandbox.ProviderSandboxID
	ce := &countingExecutor{Executor: r.ex}
	done := make(chan error, 1)
	go func() {
		done <- agentrun.AwaitJournal(r.ctx, ce, psid, rigJournalDir, runID, r.getRun(runID), 20*time.Second, 20*time.Millisecond)
	}()
	// The journal appears only once the preflight is provably waiting (re-probing).
	r.eventually("the preflight to re-probe", func() bool { return ce.n.Load() >= 3 })
	r.launch(psid, runID, printDeltas("1"))
	if err := <-done; err != nil {
		t.Fatalf("preflight: %v", err)
	}
	if !r.exists(psid, r.paths(runID).Journal) {
		t.Fatal("journal missing after the preflight resolved")
	}
}

func takeoverT5(t *testing.T, r *rig) {
	runID := r.id("tko-t5")
	res := r.start(runID, runID+"-t")
	execs, err := r.preflight(res.Sandbox.ProviderSandboxID, runID, 600*time.Millisecond)
	wantReason(t, err, agentrun.ReasonJournalTimeout)
	if !strings.Contains(err.Error(), "600ms") || execs < 2 {
		t.Fatalf("err %q after %d execs", err, execs)
	}
}

func takeoverT6(t *testing.T, r *rig) {
	runID := r.id("tko-t6")
	res := r.start(runID, runID+"-t")
	psid := res.Sandbox.ProviderSandboxID
	r.launch(psid, runID, printDeltas("1", "2", "3"))
	r.waitFinished(psid, runID)

	// The loser (epoch 1) is held at its first append; no lock stands between the two. It
	// is let go right after the successor claimed and fenced the log, before the successor
	// appended anything: the epoch fence is all that can stop its stale appends.
	gate, held := make(chan struct{}), make(chan struct{})
	var attempts atomic.Int64
	hold := func(l agentrun.Log) agentrun.Log {
		return heldLog{Log: l, before: func(ctx context.Context, evs []contract.Event) {
			if attempts.Add(1) == 1 {
				close(held)
				<-gate
			}
		}}
	}
	type result struct {
		out driver.Result
		err error
	}
	loser := make(chan result, 1)
	go func() {
		out, err := r.drive(r.ctx, runID, psid, res.Driver, hold)
		loser <- result{out, err}
	}()
	<-held

	att, err := r.k.Attach(r.ctx, runID)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	close(gate)
	lr := <-loser
	if lr.err != nil || lr.out.Outcome != driver.Superseded || lr.out.Events != 0 {
		t.Fatalf("loser: %+v, %v; want superseded with no event", lr.out, lr.err)
	}
	if attempts.Load() != 1 {
		t.Fatalf("the loser attempted %d appends; the dangerous path (a stale append) must be hit exactly once", attempts.Load())
	}
	if evs := r.events(runID); len(evs) != 0 {
		t.Fatalf("the loser's stale append landed: %v", deltas(t, evs))
	}
	win, err := r.drive(r.ctx, runID, psid, att.Driver, nil)
	if err != nil || win.Outcome != driver.Completed || win.Events != 3 {
		t.Fatalf("winner: %+v, %v", win, err)
	}
	evs := r.events(runID)
	if got := deltas(t, evs); strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("log = %v; want exactly 1,2,3", got)
	}
	st := r.state(runID)
	if st.Status != contract.StatusCompleted || st.Error != nil || st.Epoch() != 2 {
		t.Fatalf("record = %+v", st.RunRecord)
	}
}

func takeoverT7(t *testing.T, r *rig) {
	runID := r.id("tko-t7")
	res := r.start(runID, runID+"-t")
	psid := res.Sandbox.ProviderSandboxID
	r.launch(psid, runID, printDeltas("1", "2")+"echo note >&2\n")
	out, err := r.drive(r.ctx, runID, psid, res.Driver, nil)
	if err != nil || out.Outcome != driver.Completed {
		t.Fatalf("drive: %+v, %v", out, err)
	}
	if got := deltas(t, r.events(runID)); strings.Join(got, ",") != "1,2" {
		t.Fatalf("log = %v", got)
	}
	p := r.paths(runID)
	if r.exists(psid, p.Journal) || r.exists(psid, p.Stderr) || r.exists(psid, p.PID) {
		t.Fatalf("journal files survived: %v %v %v", r.exists(psid, p.Journal), r.exists(psid, p.Stderr), r.exists(psid, p.PID))
	}
	if st := r.state(runID); st.Status != contract.StatusCompleted {
		t.Fatalf("status %s", st.Status)
	}
	execs, err := r.preflight(psid, runID, 8*time.Second)
	wantReason(t, err, agentrun.ReasonTerminalRun)
	if execs != 1 {
		t.Fatalf("%d execs; want 1", execs)
	}
}
