package contract

import (
	"encoding/json"
	"fmt"
)

// The run-state rules: one plain function per fenced primitive of FencedRuns, deciding
// from the run as read (cur; nil = absent) what the call does. Every backend asks them:
// memstore for every call, dynamostore whenever the condition of a single-call fast path
// fails (the rule then classifies the refusal or recognises the call's own landed retry).
//
// Each returns (next, write, err): write=true: store next; write=false and err=nil:
// nothing to write and next is the answer (the call's own landed retry, or the run is
// already so); err: the refusal, wrapping ErrUnknownRun, ErrTerminalRun, ErrSuperseded or
// ErrConflict. next is a deep copy: it never aliases cur nor the input.

// Clone deep-copies s, so neither a caller nor a store can alias the other's pointers.
func (s RunState) Clone() RunState {
	r := &s.RunRecord
	r.FinishedAt = clonePtr(r.FinishedAt)
	r.Error = clonePtr(r.Error)
	if r.Usage != nil {
		r.Usage = append(json.RawMessage(nil), r.Usage...)
	}
	r.SandboxKey = clonePtr(r.SandboxKey)
	r.DetachedSince = clonePtr(r.DetachedSince)
	r.CancelRequested = clonePtr(r.CancelRequested)
	r.DriverEpoch = clonePtr(r.DriverEpoch)
	return s
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// Record is the run CreateOrResume stores for in: a valid thread id (CheckStoreID),
// Status "" is running, any other must be a known status (else ErrInvalid).
func (in NewRun) Record() (RunRecord, error) {
	if err := CheckStoreID("threadId", in.ThreadID); err != nil {
		return RunRecord{}, err
	}
	st := in.Status
	if st == "" {
		st = StatusRunning
	} else if _, err := ParseRunStatus(string(st)); err != nil {
		return RunRecord{}, err
	}
	return RunRecord{RunID: in.RunID, ThreadID: in.ThreadID, Status: st, StartedAt: in.StartedAt}, nil
}

// CreateOrResumeExisting decides CreateOrResume on an existing run: it is returned unchanged
// unless it is driven by the other party — an app-driven run to a sandkeep caller
// (ErrAppDriven), a sandkeep-driven one to the reference store's caller (ErrSandkeepDriven).
// The mark is written at creation only, so deciding on the run as read is exact.
func CreateOrResumeExisting(cur RunState, in NewRun) (RunRecord, error) {
	switch {
	case cur.AppDriven && !in.AppDriven:
		return RunRecord{}, fmt.Errorf("run %q: %w", in.RunID, ErrAppDriven)
	case !cur.AppDriven && in.AppDriven:
		return RunRecord{}, fmt.Errorf("run %q: %w", in.RunID, ErrSandkeepDriven)
	}
	return cur.RunRecord, nil
}

// State is the run CreateClaimed stores for in: holding epoch 1, in's key (a valid store
// id), sandbox and lease.
func (in CreateClaimedRun) State() (RunState, error) {
	rec, err := in.NewRun.Record()
	if err != nil {
		return RunState{}, err
	}
	if err := CheckStoreID("sandboxKey", in.SandboxKey); err != nil {
		return RunState{}, err
	}
	key, epoch := in.SandboxKey, int64(1)
	rec.SandboxKey, rec.DriverEpoch = &key, &epoch
	return RunState{RunRecord: rec, ProviderSandboxID: in.ProviderSandboxID, LeaseUntil: in.LeaseUntil,
		LaunchBy: max(in.LaunchBy, 0)}, nil
}

// CreatedBy is CreateClaimed's answer on an existing run: created only when the run carries
// the caller's non-empty token (its own landed create); runToken is the run's create token.
func CreatedBy(runToken, token string) bool { return token != "" && runToken == token }

// ClaimNext decides a Claim: on a run that exists, is not terminal and satisfies c.If,
// driverEpoch+1, the lease renewed, interrupted -> running (and detachedSince, lapsed
// removed with ClearDetached), the caller then storing c.Token as the run's claim token; a
// run still carrying c.Token (runToken) is this claim's own landed attempt, never bumped twice.
func ClaimNext(cur *RunState, runToken string, c Claim) (RunState, bool, error) {
	switch {
	case cur == nil:
		return RunState{}, false, ErrUnknownRun
	case cur.AppDriven:
		return RunState{}, false, ErrAppDriven // its app drives it: never claimed
	case c.Token != "" && runToken == c.Token:
		return cur.Clone(), false, nil // my claim landed and nobody claimed since
	case cur.Status.Terminal():
		return RunState{}, false, ErrTerminalRun
	case !c.If.Holds(*cur):
		return RunState{}, false, &ClaimRefused{State: cur.Clone()}
	}
	next := cur.Clone()
	epoch := next.Epoch() + 1
	next.DriverEpoch = &epoch
	next.LeaseUntil = c.LeaseUntil
	next.Status = StatusRunning // not terminal: running or interrupted
	if c.ClearDetached {
		next.DetachedSince = nil
		next.Lapsed = false
	}
	return next, true, nil
}

// fence is the check every fenced write shares: the run exists, is not terminal and is at
// epoch; landed(cur) recognises, on a terminal run at epoch, the caller's own landed write.
func fence(cur *RunState, epoch int64, landed func(RunState) bool) (done bool, err error) {
	switch {
	case cur == nil:
		return false, ErrUnknownRun
	case cur.Status.Terminal():
		if landed != nil && cur.Epoch() == epoch && landed(*cur) {
			return true, nil
		}
		return false, ErrTerminalRun
	case cur.Epoch() != epoch:
		return false, fmt.Errorf("epoch %d, run is at %d: %w", epoch, cur.Epoch(), ErrSuperseded)
	}
	return false, nil
}

// fenced applies fn to a copy of cur under the fence.
func fenced(cur *RunState, epoch int64, landed func(RunState) bool, fn func(*RunState)) (RunState, bool, error) {
	done, err := fence(cur, epoch, landed)
	switch {
	case err != nil:
		return RunState{}, false, err
	case done:
		return cur.Clone(), false, nil
	}
	next := cur.Clone()
	fn(&next)
	return next, true, nil
}

// UpdateFencedNext decides UpdateFenced: p (valid) applied under the fence; a terminal run
// at epoch whose status is the one p sets is the caller's own landed terminal write.
func UpdateFencedNext(cur *RunState, epoch int64, p RunPatch) (RunState, bool, error) {
	landed := func(st RunState) bool {
		want, ok := p.Status.Value()
		return ok && want == st.Status
	}
	return fenced(cur, epoch, landed, func(st *RunState) {
		st.RunRecord = p.ApplyTo(st.RunRecord)
		*st = st.Clone() // ApplyTo shares the pointers of p's set values
	})
}

// RecordSandboxNext decides RecordSandbox: providerSandboxId = psid under the fence.
func RecordSandboxNext(cur *RunState, epoch int64, psid string) (RunState, bool, error) {
	return fenced(cur, epoch, nil, func(st *RunState) { st.ProviderSandboxID = psid })
}

// HeartbeatNext decides Heartbeat: leaseUntil under the fence; on a lapsed run it also
// removes lapsed and the detachedSince the reaper stamped (an explicit detach is not lapsed).
func HeartbeatNext(cur *RunState, epoch, leaseUntil int64) (RunState, bool, error) {
	return fenced(cur, epoch, nil, func(st *RunState) {
		st.LeaseUntil = leaseUntil
		if st.Lapsed {
			st.Lapsed = false
			st.DetachedSince = nil
		}
	})
}

// CheckDetach is Detach's argument check, every backend's: sandboxKey is "" (keep the
// stored key) or a valid store id.
func CheckDetach(sandboxKey string) error {
	if sandboxKey == "" {
		return nil
	}
	return CheckStoreID("sandboxKey", sandboxKey)
}

// DetachNext decides Detach: detachedSince = now only if absent (a repeated detach never
// pushes expiry back) and sandboxKey ("" keeps the stored key), under the fence.
func DetachNext(cur *RunState, epoch int64, sandboxKey string, now int64) (RunState, bool, error) {
	return fenced(cur, epoch, nil, func(st *RunState) {
		if st.DetachedSince == nil {
			st.DetachedSince = &now
		}
		if sandboxKey != "" {
			st.SandboxKey = &sandboxKey
		}
	})
}

// LapseNext decides Lapse: detachedSince = leaseUntil and lapsed while the run is not
// terminal, driverEpoch and leaseUntil are as read and detachedSince is absent; a run
// already lapsed exactly so is the call's own landed write; else ErrConflict.
func LapseNext(cur *RunState, epoch, leaseUntil int64) (RunState, bool, error) {
	if cur == nil {
		return RunState{}, false, ErrUnknownRun
	}
	asRead := cur.Epoch() == epoch && cur.LeaseUntil == leaseUntil && !cur.Status.Terminal()
	switch {
	case asRead && cur.Lapsed && cur.DetachedSince != nil && *cur.DetachedSince == leaseUntil:
		return cur.Clone(), false, nil
	case !asRead || cur.DetachedSince != nil:
		return RunState{}, false, fmt.Errorf("condition failed: %w", ErrConflict)
	}
	next := cur.Clone()
	next.DetachedSince = &leaseUntil
	next.Lapsed = true
	return next, true, nil
}

// CancelNext decides RequestCancel: cancelRequested = true (sticky); a terminal or already
// cancelled run is answered as it is.
func CancelNext(cur *RunState) (RunState, bool, error) {
	switch {
	case cur == nil:
		return RunState{}, false, ErrUnknownRun
	case cur.Status.Terminal() || cur.Cancelled():
		return cur.Clone(), false, nil
	}
	next := cur.Clone()
	yes := true
	next.CancelRequested = &yes
	return next, true, nil
}

// ClearLaunchNext decides ClearLaunch: launchBy removed from a non-terminal run that has
// one; a terminal run or one without launchBy is answered as it is.
func ClearLaunchNext(cur *RunState) (RunState, bool, error) {
	switch {
	case cur == nil:
		return RunState{}, false, ErrUnknownRun
	case cur.Status.Terminal() || cur.LaunchBy == 0:
		return cur.Clone(), false, nil
	}
	next := cur.Clone()
	next.LaunchBy = 0
	return next, true, nil
}
