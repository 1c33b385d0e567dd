package memstore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// runItem is a stored run: its state plus the tokens that let a retried conditional write
// recognise that its first attempt landed.
type runItem struct {
	st          sandbox.RunState
	createToken string // CreateClaimed's token
	claimToken  string // the token of the claim that set the current epoch
	gcAt        int64  // set at the terminal write (ms)
}

// clone deep-copies r (state and tokens): the next version of the run, written in place of r.
func (r *runItem) clone() *runItem {
	c := *r
	c.st = cloneState(r.st)
	return &c
}

// fencedRuns is the Store's sandbox.FencedRuns view.
type fencedRuns struct{ s *Store }

var _ sandbox.FencedRuns = fencedRuns{}

// cloneRecord deep-copies r, so neither a caller nor the store can alias the other.
func cloneRecord(r sandbox.RunRecord) sandbox.RunRecord {
	r.FinishedAt = clonePtr(r.FinishedAt)
	r.Error = clonePtr(r.Error)
	if r.Usage != nil {
		r.Usage = append(json.RawMessage(nil), r.Usage...)
	}
	r.SandboxKey = clonePtr(r.SandboxKey)
	r.DetachedSince = clonePtr(r.DetachedSince)
	r.CancelRequested = clonePtr(r.CancelRequested)
	r.DriverEpoch = clonePtr(r.DriverEpoch)
	return r
}

func cloneState(st sandbox.RunState) sandbox.RunState {
	st.RunRecord = cloneRecord(st.RunRecord)
	return st
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// checkStored validates a stored status on the way out (docs/design.md §2.2: reads validate status).
func checkStored(st sandbox.RunState) error {
	if _, err := sandbox.ParseRunStatus(string(st.Status)); err != nil {
		return fmt.Errorf("memstore: run %q has a stored status that is not valid: %w", st.RunID, err)
	}
	return nil
}

// newStatus reads the status of a new run: "" is running.
func newStatus(st sandbox.RunStatus) (sandbox.RunStatus, error) {
	if st == "" {
		return sandbox.StatusRunning, nil
	}
	return sandbox.ParseRunStatus(string(st))
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
func (v fencedRuns) CreateOrResume(ctx context.Context, in sandbox.NewRun) (sandbox.RunRecord, error) {
	k, err := scope(ctx, "runId", in.RunID)
	if err != nil {
		return sandbox.RunRecord{}, err
	}
	if err := sandbox.CheckStoreID("threadId", in.ThreadID); err != nil {
		return sandbox.RunRecord{}, err
	}
	st, err := newStatus(in.Status)
	if err != nil {
		return sandbox.RunRecord{}, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runs[k]; r != nil {
		return cloneRecord(r.st.RunRecord), checkStored(r.st)
	}
	r := &runItem{st: sandbox.RunState{RunRecord: sandbox.RunRecord{
		RunID: in.RunID, ThreadID: in.ThreadID, Status: st, StartedAt: in.StartedAt,
	}}}
	s.putRun(k, r)
	return cloneRecord(r.st.RunRecord), nil
}

// Update applies p; an unknown run is a silent no-op and an empty patch does nothing.
func (v fencedRuns) Update(ctx context.Context, runID string, p sandbox.RunPatch) error {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return err
	}
	if err := p.Check(); err != nil {
		return err
	}
	if p.Empty() {
		return nil
	}
	s := v.s
	if s.broke.updateKeepsDurable {
		// Negative control: Clear on a durable field silently does nothing.
		if p.SandboxKey.IsClear() {
			p.SandboxKey = sandbox.Field[string]{}
		}
		if p.DetachedSince.IsClear() {
			p.DetachedSince = sandbox.Field[int64]{}
		}
		if p.CancelRequested.IsClear() {
			p.CancelRequested = sandbox.Field[bool]{}
		}
		if p.DriverEpoch.IsClear() {
			p.DriverEpoch = sandbox.Field[int64]{}
		}
	}
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

// Get returns the run; unknown: (nil, nil).
func (v fencedRuns) Get(ctx context.Context, runID string) (*sandbox.RunRecord, error) {
	st, err := v.State(ctx, runID)
	if err != nil || st == nil {
		return nil, err
	}
	return &st.RunRecord, nil
}

// State returns the run with its driver attributes; unknown: (nil, nil).
func (v fencedRuns) State(ctx context.Context, runID string) (*sandbox.RunState, error) {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return nil, err
	}
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
	st := cloneState(r.st)
	return &st, nil
}

// threadRuns returns copies of the thread's runs. Call with s.mu held.
func (s *Store) threadRuns(tenant, threadID string) []sandbox.RunRecord {
	ids := s.byThread[tkey{tenant: tenant, id: threadID}]
	out := make([]sandbox.RunRecord, 0, len(ids))
	for id := range ids {
		out = append(out, cloneRecord(s.runs[tkey{tenant: tenant, id: id}].st.RunRecord))
	}
	return out
}

func byStart(a, b sandbox.RunRecord) int {
	return cmp.Or(cmp.Compare(a.StartedAt, b.StartedAt), cmp.Compare(a.RunID, b.RunID))
}

// FindActiveRun returns the thread's running run with the greatest startedAt (ties:
// greatest runId); none: (nil, nil).
func (v fencedRuns) FindActiveRun(ctx context.Context, threadID string) (*sandbox.RunRecord, error) {
	k, err := scope(ctx, "threadId", threadID)
	if err != nil {
		return nil, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *sandbox.RunRecord
	for _, r := range s.threadRuns(k.tenant, threadID) {
		if r.Status == sandbox.StatusRunning && (best == nil || byStart(r, *best) > 0) {
			best = &r
		}
	}
	return best, nil
}

// ListByThread returns every run of the thread, ascending startedAt (ties: runId).
func (v fencedRuns) ListByThread(ctx context.Context, threadID string) ([]sandbox.RunRecord, error) {
	k, err := scope(ctx, "threadId", threadID)
	if err != nil {
		return nil, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.threadRuns(k.tenant, threadID)
	slices.SortFunc(out, byStart)
	return out, nil
}

// ListReclaimable returns running runs with detachedSince <= now-ttlMs, oldest detachment
// first, from the (possibly lagging) detached-runs index: entries are index projections.
func (v fencedRuns) ListReclaimable(ctx context.Context, now, ttlMs int64) ([]sandbox.RunRecord, error) {
	t, err := sandbox.Tenant(ctx)
	if err != nil {
		return nil, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	hits := s.idx.query(ixDetached, func(item tkey, e ixEntry) bool {
		return item.tenant == t && e.sort <= now-ttlMs
	}, 0)
	out := make([]sandbox.RunRecord, 0, len(hits))
	for _, h := range hits {
		out = append(out, cloneRecord(*h.e.rec))
	}
	return out, nil
}

// RunsUsingKey returns the ids of non-terminal runs stamped with sandbox key, from the
// (possibly lagging) key index: re-read each before acting on it.
func (v fencedRuns) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	k, err := scope(ctx, "sandboxKey", key)
	if err != nil {
		return nil, err
	}
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
func (v fencedRuns) CreateClaimed(ctx context.Context, in sandbox.CreateClaimedRun) (sandbox.RunState, bool, error) {
	k, err := scope(ctx, "runId", in.RunID)
	if err != nil {
		return sandbox.RunState{}, false, err
	}
	if err := sandbox.CheckStoreID("threadId", in.ThreadID); err != nil {
		return sandbox.RunState{}, false, err
	}
	if err := sandbox.CheckStoreID("sandboxKey", in.SandboxKey); err != nil {
		return sandbox.RunState{}, false, err
	}
	status, err := newStatus(in.Status)
	if err != nil {
		return sandbox.RunState{}, false, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.runs[k]; r != nil {
		return cloneState(r.st), in.Token != "" && r.createToken == in.Token, checkStored(r.st)
	}
	key, epoch := in.SandboxKey, int64(1)
	r := &runItem{
		st: sandbox.RunState{
			RunRecord: sandbox.RunRecord{
				RunID: in.RunID, ThreadID: in.ThreadID, Status: status, StartedAt: in.StartedAt,
				SandboxKey: &key, DriverEpoch: &epoch,
			},
			ProviderSandboxID: in.ProviderSandboxID,
			LeaseUntil:        in.LeaseUntil,
		},
		createToken: in.Token,
	}
	s.putRun(k, r)
	return cloneState(r.st), true, nil
}

// Claim bumps driverEpoch and renews the lease while the run exists, is not terminal and
// c.If holds; a refused claim on a run still carrying c.Token is this claim's own landed
// attempt (nobody claimed since), returned as success.
func (v fencedRuns) Claim(ctx context.Context, runID string, c sandbox.Claim) (sandbox.RunState, error) {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return sandbox.RunState{}, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[k]
	ok := r != nil && !r.st.Status.Terminal() && c.If.Holds(r.st)
	switch {
	case ok:
	case r == nil:
		return sandbox.RunState{}, fmt.Errorf("memstore: claim %q: %w", runID, sandbox.ErrUnknownRun)
	case c.Token != "" && r.claimToken == c.Token:
		return cloneState(r.st), nil // my claim landed and nobody claimed since
	case r.st.Status.Terminal():
		return sandbox.RunState{}, fmt.Errorf("memstore: claim %q: %w", runID, sandbox.ErrTerminalRun)
	default:
		return sandbox.RunState{}, fmt.Errorf("memstore: claim %q: condition failed: %w", runID, sandbox.ErrConflict)
	}
	next := r.clone()
	next.claimToken = c.Token
	epoch := r.st.Epoch() + 1
	next.st.DriverEpoch = &epoch
	next.st.LeaseUntil = c.LeaseUntil
	if next.st.Status == sandbox.StatusInterrupted {
		next.st.Status = sandbox.StatusRunning
	}
	if c.ClearDetached {
		next.st.DetachedSince = nil
		next.st.Lapsed = false
	}
	s.putRun(k, next)
	return cloneState(next.st), nil
}

// fenced runs fn on a copy of the run while driverEpoch == epoch and the run is not
// terminal, storing the result; retried reports whether a terminal run already holds
// the caller's landed write. Refusals: ErrUnknownRun, ErrTerminalRun, ErrSuperseded.
func (v fencedRuns) fenced(ctx context.Context, op, runID string, epoch int64,
	retried func(sandbox.RunState) bool, fn func(*sandbox.RunState) error) (sandbox.RunState, error) {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return sandbox.RunState{}, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[k]
	switch {
	case r == nil:
		return sandbox.RunState{}, fmt.Errorf("memstore: %s %q: %w", op, runID, sandbox.ErrUnknownRun)
	case r.st.Status.Terminal():
		if retried != nil && r.st.Epoch() == epoch && retried(r.st) {
			return cloneState(r.st), nil
		}
		return sandbox.RunState{}, fmt.Errorf("memstore: %s %q: %w", op, runID, sandbox.ErrTerminalRun)
	case r.st.Epoch() != epoch:
		return sandbox.RunState{}, fmt.Errorf("memstore: %s %q: epoch %d, run is at %d: %w",
			op, runID, epoch, r.st.Epoch(), sandbox.ErrSuperseded)
	}
	next := r.clone()
	if err := fn(&next.st); err != nil {
		return sandbox.RunState{}, err
	}
	s.putRun(k, next)
	return cloneState(next.st), nil
}

// UpdateFenced applies p while driverEpoch == epoch and the run is not terminal; a retried
// terminal write that already landed (same epoch, same terminal status) succeeds.
func (v fencedRuns) UpdateFenced(ctx context.Context, runID string, epoch int64, p sandbox.RunPatch) (sandbox.RunState, error) {
	if err := p.Check(); err != nil {
		return sandbox.RunState{}, err
	}
	retried := func(st sandbox.RunState) bool {
		want, ok := p.Status.Value()
		return ok && want == st.Status
	}
	return v.fenced(ctx, "update", runID, epoch, retried, func(st *sandbox.RunState) error {
		st.RunRecord = cloneRecord(p.ApplyTo(st.RunRecord))
		return nil
	})
}

// RecordSandbox sets providerSandboxId under the same fence as UpdateFenced.
func (v fencedRuns) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (sandbox.RunState, error) {
	if psid == "" {
		return sandbox.RunState{}, sandbox.Invalid("providerSandboxId", "empty")
	}
	return v.fenced(ctx, "record sandbox", runID, epoch, nil, func(st *sandbox.RunState) error {
		st.ProviderSandboxID = psid
		return nil
	})
}

// Heartbeat sets leaseUntil under the fence; on a lapsed run it also removes lapsed and
// the detachedSince the reaper stamped (never an explicit one).
func (v fencedRuns) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (sandbox.RunState, error) {
	return v.fenced(ctx, "heartbeat", runID, epoch, nil, func(st *sandbox.RunState) error {
		st.LeaseUntil = leaseUntil
		if st.Lapsed {
			st.Lapsed = false
			st.DetachedSince = nil
		}
		return nil
	})
}

// Detach sets detachedSince = now only if absent, and sandboxKey, under the fence.
func (v fencedRuns) Detach(ctx context.Context, runID string, epoch int64, sandboxKey string, now int64) (sandbox.RunState, error) {
	if sandboxKey != "" { // "" keeps the stored key
		if err := sandbox.CheckStoreID("sandboxKey", sandboxKey); err != nil {
			return sandbox.RunState{}, err
		}
	}
	return v.fenced(ctx, "detach", runID, epoch, nil, func(st *sandbox.RunState) error {
		if st.DetachedSince == nil {
			st.DetachedSince = &now
		}
		if sandboxKey != "" {
			st.SandboxKey = &sandboxKey
		}
		return nil
	})
}

// Lapse stamps detachedSince = leaseUntil and lapsed while driverEpoch and leaseUntil are
// as read and detachedSince is absent; a run already lapsed exactly so is this call's own
// landed write; else ErrConflict (ErrUnknownRun when absent, as dynamostore).
func (v fencedRuns) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[k]
	if r == nil {
		return fmt.Errorf("memstore: lapse %q: %w", runID, sandbox.ErrUnknownRun)
	}
	st := r.st
	asRead := st.Epoch() == epoch && st.LeaseUntil == leaseUntil && !st.Status.Terminal()
	switch {
	case asRead && st.Lapsed && st.DetachedSince != nil && *st.DetachedSince == leaseUntil:
		return nil
	case !asRead || st.DetachedSince != nil:
		return fmt.Errorf("memstore: lapse %q: condition failed: %w", runID, sandbox.ErrConflict)
	}
	next := r.clone()
	next.st.DetachedSince = &leaseUntil
	next.st.Lapsed = true
	s.putRun(k, next)
	return nil
}

// RequestCancel sets cancelRequested (sticky), which moves the run to the front of the
// reclaim index; a terminal run is returned unchanged; unknown: ErrUnknownRun.
func (v fencedRuns) RequestCancel(ctx context.Context, runID string) (sandbox.RunState, error) {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return sandbox.RunState{}, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.runs[k]
	switch {
	case r == nil:
		return sandbox.RunState{}, fmt.Errorf("memstore: cancel %q: %w", runID, sandbox.ErrUnknownRun)
	case r.st.Status.Terminal() || r.st.Cancelled():
		return cloneState(r.st), nil
	}
	next := r.clone()
	yes := true
	next.st.CancelRequested = &yes
	s.putRun(k, next)
	return cloneState(next.st), nil
}
