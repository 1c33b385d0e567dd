package memstore

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// runItem is a stored run: its state plus the tokens that let a retried conditional write
// recognise that its first attempt landed.
type runItem struct {
	st          contract.RunState
	createToken string // CreateClaimed's token
	claimToken  string // the token of the claim that set the current epoch
	gcAt        int64  // set at the terminal write (ms)
}

// fencedRuns is the Store's contract.FencedRuns view.
type fencedRuns struct{ view }

var (
	_ contract.FencedRuns = fencedRuns{}
	_ contract.RunWriter  = fencedRuns{} // the reference's unfenced writes (refstore.Runs)
)

// cloneRecord deep-copies r, so neither a caller nor the store can alias the other.
func cloneRecord(r contract.RunRecord) contract.RunRecord {
	return contract.RunState{RunRecord: r}.Clone().RunRecord
}

// checkStored validates a stored status on the way out (docs/design.md §2.2: reads validate status).
func checkStored(st contract.RunState) error {
	if _, err := contract.ParseRunStatus(string(st.Status)); err != nil {
		return fmt.Errorf("memstore: run %q has a stored status that is not valid: %w", st.RunID, err)
	}
	return nil
}

// putRun stores r (owned by the store from now on), keeping the by-thread map, the gcAt
// of a terminal run and every index helper in step with its state. Call with s.mu held.
func (s *Store) putRun(k tkey, r *runItem) {
	s.runs[k] = r
	tk := tkey{tenant: k.tenant, id: r.st.ThreadID}
	if s.byThread[tk] == nil {
		s.byThread[tk] = map[string]struct{}{}
	}
	s.byThread[tk][k.id] = struct{}{}
	if r.st.Status.Terminal() && r.gcAt == 0 {
		r.gcAt = s.opts.now().Add(s.opts.logRetention + 24*time.Hour).UnixMilli()
		s.wake(k) // a reader at the tail closes a terminal run's log
	}
	if !r.st.Status.Terminal() {
		r.gcAt = 0 // a plain Update may move a run back out of a terminal status
	}
	s.reindexRun(k, r)
	s.written()
}

// deleteRun forgets a run (gcAt passed). Call with s.mu held.
func (s *Store) deleteRun(k tkey) {
	r := s.runs[k]
	if r == nil {
		return
	}
	delete(s.runs, k)
	tk := tkey{tenant: k.tenant, id: r.st.ThreadID}
	delete(s.byThread[tk], k.id)
	if len(s.byThread[tk]) == 0 {
		delete(s.byThread, tk)
	}
	s.reindexRun(k, nil)
}

// CreateOrResume inserts the run only if absent; an existing run is returned unchanged.
func (v fencedRuns) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	k := v.key(in.RunID)
	rec, err := in.Record()
	if err != nil {
		return contract.RunRecord{}, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runs[k]; r != nil {
		if err := checkStored(r.st); err != nil {
			return contract.RunRecord{}, err
		}
		cur, err := contract.CreateOrResumeExisting(r.st, in)
		return cloneRecord(cur), err
	}
	r := &runItem{st: contract.RunState{RunRecord: rec, AppDriven: in.AppDriven}}
	s.putRun(k, r)
	return cloneRecord(r.st.RunRecord), nil
}

// Update applies p; an unknown run is a silent no-op and an empty patch does nothing.
func (v fencedRuns) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	k := v.key(runID)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[k]
	if r == nil {
		return nil
	}
	next := *r
	next.st.RunRecord = cloneRecord(p.ApplyTo(r.st.RunRecord)) // ApplyTo shares Set values' pointers
	s.putRun(k, &next)
	return nil
}

// State returns the run with its driver attributes; unknown: (nil, nil).
func (v fencedRuns) State(ctx context.Context, runID string) (*contract.RunState, error) {
	k := v.key(runID)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[k]
	if r == nil {
		return nil, nil
	}
	if err := checkStored(r.st); err != nil {
		return nil, err
	}
	st := r.st.Clone()
	return &st, nil
}

// threadRuns returns copies of the thread's runs. Call with s.mu held.
func (s *Store) threadRuns(tenant, threadID string) []contract.RunRecord {
	ids := s.byThread[tkey{tenant: tenant, id: threadID}]
	out := make([]contract.RunRecord, 0, len(ids))
	for id := range ids {
		out = append(out, cloneRecord(s.runs[tkey{tenant: tenant, id: id}].st.RunRecord))
	}
	return out
}

func byStart(a, b contract.RunRecord) int {
	return cmp.Or(cmp.Compare(a.StartedAt, b.StartedAt), cmp.Compare(a.RunID, b.RunID))
}

// FindActiveRun returns the thread's running run with the greatest startedAt (ties:
// greatest runId); none: (nil, nil).
func (v fencedRuns) FindActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	k := v.key(threadID)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *contract.RunRecord
	for _, r := range s.threadRuns(k.tenant, threadID) {
		if r.Status == contract.StatusRunning && (best == nil || byStart(r, *best) > 0) {
			best = &r
		}
	}
	return best, nil
}

// RunsUsingKey returns the ids of non-terminal runs stamped with sandbox key, from the
// (possibly lagging) key index: re-read each before acting on it.
func (v fencedRuns) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	k := v.key(key)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	hits := s.idx.query(ixKeyRef, func(item tkey, e ixEntry) bool {
		return item.tenant == k.tenant && e.ref == key
	}, 0)
	out := make([]string, 0, len(hits))
	for _, h := range hits {
		out = append(out, h.item.id)
	}
	return out, nil
}

// CreateClaimed creates the run holding epoch 1, a lease and in.Token in one write; an
// existing run is returned untouched, created=true only when it carries in.Token.
func (v fencedRuns) CreateClaimed(ctx context.Context, in contract.CreateClaimedRun) (contract.RunState, bool, error) {
	k := v.key(in.RunID)
	st, err := in.State()
	if err != nil {
		return contract.RunState{}, false, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runs[k]; r != nil {
		return r.st.Clone(), contract.CreatedBy(r.createToken, in.Token), checkStored(r.st)
	}
	r := &runItem{st: st, createToken: in.Token}
	s.putRun(k, r)
	return r.st.Clone(), true, nil
}

// decide runs rule on the run (nil when absent) and stores the next state it decides,
// onWrite (may be nil) adjusting the stored item's tokens; every decision is the rule's
// (sandbox/runrules.go), memstore only keeps the run, its tokens and its indexes.
func (v fencedRuns) decide(ctx context.Context, op, runID string,
	rule func(cur *contract.RunState, r *runItem) (contract.RunState, bool, error),
	onWrite func(*runItem)) (contract.RunState, error) {
	k := v.key(runID)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[k]
	var cur *contract.RunState
	if r != nil {
		cur = &r.st
	}
	next, write, err := rule(cur, r)
	switch {
	case err != nil:
		return contract.RunState{}, fmt.Errorf("memstore: %s %q: %w", op, runID, err)
	case !write:
		return next, nil
	}
	n := *r
	n.st = next
	if onWrite != nil {
		onWrite(&n)
	}
	s.putRun(k, &n)
	return next.Clone(), nil
}

// Claim bumps driverEpoch and renews the lease while the run exists, is not terminal and
// c.If holds; a run still carrying c.Token is this claim's own landed attempt.
func (v fencedRuns) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	return v.decide(ctx, "claim", runID, func(cur *contract.RunState, r *runItem) (contract.RunState, bool, error) {
		var token string
		if r != nil {
			token = r.claimToken
		}
		return contract.ClaimNext(cur, token, c)
	}, func(n *runItem) { n.claimToken = c.Token })
}

// fenced decides a fenced write by rule.
func (v fencedRuns) fenced(ctx context.Context, op, runID string,
	rule func(cur *contract.RunState) (contract.RunState, bool, error)) (contract.RunState, error) {
	return v.decide(ctx, op, runID, func(cur *contract.RunState, _ *runItem) (contract.RunState, bool, error) {
		return rule(cur)
	}, nil)
}

// UpdateFenced applies p while driverEpoch == epoch and the run is not terminal; a retried
// terminal write that already landed (same epoch, same terminal status) succeeds.
func (v fencedRuns) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	return v.fenced(ctx, "update", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.UpdateFencedNext(cur, epoch, p)
	})
}

// RecordSandbox sets providerSandboxId under the same fence as UpdateFenced.
func (v fencedRuns) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (contract.RunState, error) {
	return v.fenced(ctx, "record sandbox", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.RecordSandboxNext(cur, epoch, psid)
	})
}

// Heartbeat sets leaseUntil under the fence; on a lapsed run it also removes lapsed and
// the detachedSince the reaper stamped (never an explicit one).
func (v fencedRuns) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (contract.RunState, error) {
	return v.fenced(ctx, "heartbeat", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.HeartbeatNext(cur, epoch, leaseUntil)
	})
}

// Detach sets detachedSince = now only if absent, and sandboxKey, under the fence.
func (v fencedRuns) Detach(ctx context.Context, runID string, epoch int64, sandboxKey string, now int64) (contract.RunState, error) {
	return v.fenced(ctx, "detach", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.DetachNext(cur, epoch, sandboxKey, now)
	})
}

// Lapse stamps detachedSince = leaseUntil and lapsed while driverEpoch and leaseUntil are
// as read and detachedSince is absent; a run already lapsed exactly so is this call's own
// landed write; else ErrConflict (ErrUnknownRun when absent, as dynamostore).
func (v fencedRuns) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	_, err := v.fenced(ctx, "lapse", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.LapseNext(cur, epoch, leaseUntil)
	})
	return err
}

// RequestCancel sets cancelRequested (sticky), which moves the run to the front of the
// reclaim index; a terminal run is returned unchanged; unknown: ErrUnknownRun.
func (v fencedRuns) RequestCancel(ctx context.Context, runID string) (contract.RunState, error) {
	return v.fenced(ctx, "cancel", runID, contract.CancelNext)
}

// ClearLaunch removes launchBy from a non-terminal run; otherwise the run is returned as
// it is; unknown: ErrUnknownRun.
func (v fencedRuns) ClearLaunch(ctx context.Context, runID string) (contract.RunState, error) {
	return v.fenced(ctx, "clear launch", runID, contract.ClearLaunchNext)
}
