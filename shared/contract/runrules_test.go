package contract

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// run builds a state: status, epoch (0 = none), detachedSince (nil = absent), lease.
func run(status RunStatus, epoch int64, ds *int64, lease int64) *RunState {
	st := &RunState{RunRecord: RunRecord{RunID: "r", ThreadID: "t", Status: status, StartedAt: 1, DetachedSince: ds}, LeaseUntil: lease}
	if epoch > 0 {
		st.DriverEpoch = ptr(epoch)
	}
	return st
}

func with(st *RunState, f func(*RunState)) *RunState { c := st.Clone(); f(&c); return &c }

// ruleCase is one decision: want is the next state (nil: refused with wantErr).
type ruleCase struct {
	name      string
	decide    func() (RunState, bool, error)
	want      *RunState
	wantWrite bool
	wantErr   error
}

func checkRules(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, c := range cases {
		next, write, err := c.decide()
		switch {
		case c.wantErr != nil:
			if !errors.Is(err, c.wantErr) || write {
				t.Errorf("%s: got write=%v err=%v, want refusal %v", c.name, write, err, c.wantErr)
			}
		case err != nil || write != c.wantWrite || !reflect.DeepEqual(next, *c.want):
			t.Errorf("%s: got %+v write=%v err=%v\nwant %+v write=%v", c.name, next, write, err, *c.want, c.wantWrite)
		}
	}
}

func TestClaimNext(t *testing.T) {
	ds := ptr(int64(50))
	live := run(StatusInterrupted, 2, ds, 40)
	live.Lapsed = true
	claimed := with(live, func(s *RunState) { s.Status, s.DriverEpoch, s.LeaseUntil = StatusRunning, ptr(int64(3)), 99 })
	checkRules(t, []ruleCase{
		{name: "absent", decide: func() (RunState, bool, error) { return ClaimNext(nil, "", Claim{}) }, wantErr: ErrUnknownRun},
		{name: "bumps, interrupted->running, keeps detachment", decide: func() (RunState, bool, error) {
			return ClaimNext(live, "old", Claim{Token: "tok", LeaseUntil: 99})
		}, want: claimed, wantWrite: true},
		{name: "ClearDetached removes detachedSince and lapsed", decide: func() (RunState, bool, error) {
			return ClaimNext(live, "", Claim{LeaseUntil: 99, ClearDetached: true})
		}, want: with(claimed, func(s *RunState) { s.DetachedSince, s.Lapsed = nil, false }), wantWrite: true},
		{name: "never claimed: epoch 1", decide: func() (RunState, bool, error) {
			return ClaimNext(run(StatusRunning, 0, nil, 0), "", Claim{LeaseUntil: 5})
		}, want: with(run(StatusRunning, 1, nil, 5), func(*RunState) {}), wantWrite: true},
		{name: "own landed claim (token) is answered, not bumped", decide: func() (RunState, bool, error) {
			return ClaimNext(live, "tok", Claim{Token: "tok", LeaseUntil: 99})
		}, want: live},
		{name: "own landed claim recognised even on a terminal run", decide: func() (RunState, bool, error) {
			return ClaimNext(run(StatusCompleted, 4, nil, 0), "tok", Claim{Token: "tok"})
		}, want: run(StatusCompleted, 4, nil, 0)},
		{name: "terminal", decide: func() (RunState, bool, error) {
			return ClaimNext(run(StatusFailed, 1, nil, 0), "other", Claim{Token: "tok"})
		}, wantErr: ErrTerminalRun},
		{name: "empty token never matches", decide: func() (RunState, bool, error) {
			return ClaimNext(run(StatusAborted, 1, nil, 0), "", Claim{})
		}, wantErr: ErrTerminalRun},
		{name: "If.DetachedSince differs", decide: func() (RunState, bool, error) {
			return ClaimNext(live, "", Claim{If: ClaimCond{DetachedSince: ptr(int64(51))}})
		}, wantErr: ErrConflict},
		{name: "If.Cutoff before detachment", decide: func() (RunState, bool, error) {
			return ClaimNext(live, "", Claim{If: ClaimCond{Cutoff: ptr(int64(49))}})
		}, wantErr: ErrConflict},
		{name: "If.Cancelled on an uncancelled run", decide: func() (RunState, bool, error) {
			return ClaimNext(live, "", Claim{If: ClaimCond{Cancelled: true}})
		}, wantErr: ErrConflict},
	})
}

func TestFencedRules(t *testing.T) {
	cur := run(StatusRunning, 2, nil, 10)
	done := with(run(StatusCompleted, 2, nil, 10), func(s *RunState) { s.FinishedAt = ptr(int64(7)) })
	finish := RunPatch{Status: Set(StatusCompleted), FinishedAt: Set(int64(7))}
	lapsed := with(run(StatusRunning, 2, ptr(int64(10)), 10), func(s *RunState) { s.Lapsed = true })
	detached := run(StatusRunning, 2, ptr(int64(8)), 10)
	checkRules(t, []ruleCase{
		{name: "update: absent", decide: func() (RunState, bool, error) { return UpdateFencedNext(nil, 2, finish) }, wantErr: ErrUnknownRun},
		{name: "update: superseded", decide: func() (RunState, bool, error) { return UpdateFencedNext(cur, 1, finish) }, wantErr: ErrSuperseded},
		{name: "update: epoch 0 on an unclaimed run", decide: func() (RunState, bool, error) {
			return UpdateFencedNext(run(StatusRunning, 0, nil, 0), 0, RunPatch{Usage: Set(json.RawMessage(`{}`))})
		}, want: with(run(StatusRunning, 0, nil, 0), func(s *RunState) { s.Usage = []byte(`{}`) }), wantWrite: true},
		{name: "update: terminal write", decide: func() (RunState, bool, error) { return UpdateFencedNext(cur, 2, finish) }, want: done, wantWrite: true},
		{name: "update: own landed terminal write", decide: func() (RunState, bool, error) { return UpdateFencedNext(done, 2, finish) }, want: done},
		{name: "update: landed needs the same epoch", decide: func() (RunState, bool, error) { return UpdateFencedNext(done, 1, finish) }, wantErr: ErrTerminalRun},
		{name: "update: landed needs the same status", decide: func() (RunState, bool, error) {
			return UpdateFencedNext(done, 2, RunPatch{Status: Set(StatusFailed)})
		}, wantErr: ErrTerminalRun},
		{name: "update: terminal, no status", decide: func() (RunState, bool, error) {
			return UpdateFencedNext(done, 2, RunPatch{Usage: Set(json.RawMessage(`1`))})
		}, wantErr: ErrTerminalRun},
		{name: "record sandbox", decide: func() (RunState, bool, error) { return RecordSandboxNext(cur, 2, "p") },
			want: with(cur, func(s *RunState) { s.ProviderSandboxID = "p" }), wantWrite: true},
		{name: "record sandbox: terminal", decide: func() (RunState, bool, error) { return RecordSandboxNext(done, 2, "p") }, wantErr: ErrTerminalRun},
		{name: "record sandbox: superseded", decide: func() (RunState, bool, error) { return RecordSandboxNext(cur, 3, "p") }, wantErr: ErrSuperseded},
		{name: "heartbeat", decide: func() (RunState, bool, error) { return HeartbeatNext(cur, 2, 90) },
			want: run(StatusRunning, 2, nil, 90), wantWrite: true},
		{name: "heartbeat undoes a lapse", decide: func() (RunState, bool, error) { return HeartbeatNext(lapsed, 2, 90) },
			want: run(StatusRunning, 2, nil, 90), wantWrite: true},
		{name: "heartbeat keeps an explicit detachment", decide: func() (RunState, bool, error) { return HeartbeatNext(detached, 2, 90) },
			want: run(StatusRunning, 2, ptr(int64(8)), 90), wantWrite: true},
		{name: "heartbeat: superseded", decide: func() (RunState, bool, error) { return HeartbeatNext(cur, 1, 90) }, wantErr: ErrSuperseded},
		{name: "heartbeat: absent", decide: func() (RunState, bool, error) { return HeartbeatNext(nil, 1, 90) }, wantErr: ErrUnknownRun},
		{name: "detach stamps now and the key", decide: func() (RunState, bool, error) { return DetachNext(cur, 2, "k", 30) },
			want: with(run(StatusRunning, 2, ptr(int64(30)), 10), func(s *RunState) { s.SandboxKey = ptr("k") }), wantWrite: true},
		{name: "detach never pushes expiry back; \"\" keeps the key", decide: func() (RunState, bool, error) {
			return DetachNext(with(detached, func(s *RunState) { s.SandboxKey = ptr("old") }), 2, "", 30)
		}, want: with(detached, func(s *RunState) { s.SandboxKey = ptr("old") }), wantWrite: true},
		{name: "detach: terminal", decide: func() (RunState, bool, error) { return DetachNext(done, 2, "k", 30) }, wantErr: ErrTerminalRun},
	})
}

func TestLapseAndCancelNext(t *testing.T) {
	cur := run(StatusRunning, 2, nil, 10)
	lapsed := with(run(StatusRunning, 2, ptr(int64(10)), 10), func(s *RunState) { s.Lapsed = true })
	cancelled := with(cur, func(s *RunState) { s.CancelRequested = ptr(true) })
	checkRules(t, []ruleCase{
		{name: "lapse", decide: func() (RunState, bool, error) { return LapseNext(cur, 2, 10) }, want: lapsed, wantWrite: true},
		{name: "lapse: own landed", decide: func() (RunState, bool, error) { return LapseNext(lapsed, 2, 10) }, want: lapsed},
		{name: "lapse: absent", decide: func() (RunState, bool, error) { return LapseNext(nil, 2, 10) }, wantErr: ErrUnknownRun},
		{name: "lapse: epoch moved", decide: func() (RunState, bool, error) { return LapseNext(cur, 1, 10) }, wantErr: ErrConflict},
		{name: "lapse: lease renewed", decide: func() (RunState, bool, error) { return LapseNext(cur, 2, 9) }, wantErr: ErrConflict},
		{name: "lapse: detached", decide: func() (RunState, bool, error) { return LapseNext(run(StatusRunning, 2, ptr(int64(3)), 10), 2, 10) }, wantErr: ErrConflict},
		{name: "lapse: terminal", decide: func() (RunState, bool, error) { return LapseNext(run(StatusAborted, 2, nil, 10), 2, 10) }, wantErr: ErrConflict},
		{name: "lapse: terminal even if lapsed so", decide: func() (RunState, bool, error) {
			return LapseNext(with(lapsed, func(s *RunState) { s.Status = StatusFailed }), 2, 10)
		}, wantErr: ErrConflict},
		{name: "cancel", decide: func() (RunState, bool, error) { return CancelNext(cur) }, want: cancelled, wantWrite: true},
		{name: "cancel an interrupted run", decide: func() (RunState, bool, error) { return CancelNext(run(StatusInterrupted, 0, nil, 0)) },
			want: with(run(StatusInterrupted, 0, nil, 0), func(s *RunState) { s.CancelRequested = ptr(true) }), wantWrite: true},
		{name: "cancel is sticky", decide: func() (RunState, bool, error) { return CancelNext(cancelled) }, want: cancelled},
		{name: "cancel: terminal unchanged", decide: func() (RunState, bool, error) { return CancelNext(run(StatusCompleted, 2, nil, 10)) },
			want: run(StatusCompleted, 2, nil, 10)},
		{name: "cancel: absent", decide: func() (RunState, bool, error) { return CancelNext(nil) }, wantErr: ErrUnknownRun},
	})
}

func TestCreateRules(t *testing.T) {
	if CreatedBy("", "") || CreatedBy("a", "") || CreatedBy("a", "b") || !CreatedBy("a", "a") {
		t.Error("CreatedBy: only a non-empty matching token is the caller's own create")
	}
	rec, err := NewRun{RunID: "r", ThreadID: "t", StartedAt: 3}.Record()
	if err != nil || !reflect.DeepEqual(rec, RunRecord{RunID: "r", ThreadID: "t", Status: StatusRunning, StartedAt: 3}) {
		t.Errorf("Record: %+v %v", rec, err)
	}
	if _, err := (NewRun{ThreadID: "t", Status: "done"}).Record(); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown status: %v", err)
	}
	if _, err := (NewRun{RunID: "r"}).Record(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "threadId") {
		t.Errorf("no thread id: %v", err)
	}
	claimed := CreateClaimedRun{NewRun: NewRun{RunID: "r", ThreadID: "t", Status: StatusInterrupted}, SandboxKey: "k", ProviderSandboxID: "p", LeaseUntil: 9}
	st, err := claimed.State()
	if err != nil || st.Epoch() != 1 || *st.SandboxKey != "k" || st.ProviderSandboxID != "p" || st.LeaseUntil != 9 || st.Status != StatusInterrupted {
		t.Errorf("State: %+v %v", st, err)
	}
	claimed.SandboxKey = ""
	if _, err := claimed.State(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "sandboxKey") {
		t.Errorf("no sandbox key: %v", err)
	}
	if CheckDetach("") != nil || CheckDetach("k") != nil || !errors.Is(CheckDetach("a\x00b"), ErrInvalid) {
		t.Error(`CheckDetach: "" keeps the stored key, any other must be a store id`)
	}
}

// TestRulesNeverAlias: a rule's next state shares no pointer with the state it read nor
// with its input, so a store may keep either.
func TestRulesNeverAlias(t *testing.T) {
	cur := with(run(StatusRunning, 2, ptr(int64(5)), 10), func(s *RunState) {
		s.SandboxKey, s.CancelRequested, s.Usage = ptr("k"), ptr(false), []byte(`{"a":1}`)
	})
	p := RunPatch{Usage: Set(json.RawMessage(`{"b":2}`)), FinishedAt: Set(int64(4)), Error: Set(RunError{Message: "m"})}
	next, _, err := UpdateFencedNext(cur, 2, p)
	if err != nil {
		t.Fatal(err)
	}
	next2, _, _ := ClaimNext(cur, "", Claim{})
	for _, n := range []RunState{next, next2} {
		if n.DetachedSince == cur.DetachedSince || n.SandboxKey == cur.SandboxKey || n.CancelRequested == cur.CancelRequested || n.DriverEpoch == cur.DriverEpoch {
			t.Error("next aliases cur")
		}
	}
	pu, _ := p.Usage.Value()
	if &next.Usage[0] == &pu[0] {
		t.Error("next aliases the patch")
	}
}
