package dynamostore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// fencedRuns is the Store's contract.FencedRuns view.
//
// Every write is one conditional single-item write. The hot primitives (claim, heartbeat,
// detach, record-sandbox, cancel, lapse, and update-fenced patches whose index helpers do
// not depend on unread state) are one UpdateItem whose condition also pins the state the
// helper expressions assume (e.g. "running and not cancelled"). When that condition fails
// the primitive falls back to the general path: a consistent GetItem, the contract's
// semantics applied in Go (which classifies refusals and recognises this call's own landed
// write by its token), and a PutItem of the whole item conditioned on the version read.
// The plain reference Update always takes the general path.
type fencedRuns struct{ view }

var (
	_ contract.FencedRuns = fencedRuns{}
	_ contract.RunWriter  = fencedRuns{} // the reference's unfenced writes (refstore.Runs)
)

// maxMutateAttempts bounds the read-then-write loop; each failed attempt means another
// writer changed the run in between, so reaching it means a livelock.
const maxMutateAttempts = 100

// read returns the run (consistent); unknown: (nil, nil).
func (v fencedRuns) read(ctx context.Context, runID string) (*storedRun, error) {
	return readItem(ctx, v.s, v.tenant, kindRun, runID, "run", decodeRun)
}

// create puts r only if the run is absent; created=false when it exists.
func (v fencedRuns) create(ctx context.Context, r *storedRun) (bool, error) {
	r.ver = 1
	item, err := v.s.runItem(v.tenant, r)
	if err != nil {
		return false, err
	}
	err = v.s.putAbsent(ctx, item)
	switch {
	case err == nil:
		return true, nil
	case isCondFailed(err):
		return false, nil
	}
	return false, fmt.Errorf("dynamostore: create run %q: %w", r.st.RunID, err)
}

// mutation is the general path's view of one primitive: given the current run (a private
// copy; nil when unknown) it returns the run to store (write=true), or the result without a
// write (write=false), or a refusal.
type mutation func(cur *storedRun) (next *storedRun, write bool, err error)

// mutate applies fn by read-then-write: a consistent read, then a PutItem of the whole
// item (helpers recomputed) conditioned on the version read, again on a lost race.
func (v fencedRuns) mutate(ctx context.Context, runID string, fn mutation) (*storedRun, error) {
	for attempt := 0; attempt < maxMutateAttempts; attempt++ {
		cur, err := v.read(ctx, runID)
		if err != nil {
			return nil, err
		}
		var in *storedRun
		if cur != nil {
			in = cur.clone()
		}
		next, write, err := fn(in)
		if err != nil || !write {
			return next, err
		}
		next.ver = cur.ver + 1
		cond := attr(attrVer).Equal(val(cur.ver))
		if cur.ver == 0 { // an item written before versions existed
			cond = rowExists().And(expression.AttributeNotExists(attr(attrVer)))
		}
		item, err := v.s.runItem(v.tenant, next)
		if err != nil {
			return nil, err
		}
		e, err := expr(expression.NewBuilder().WithCondition(cond))
		if err != nil {
			return nil, err
		}
		_, err = v.s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                 aws.String(v.s.cfg.Table),
			Item:                      item,
			ConditionExpression:       e.Condition(),
			ExpressionAttributeNames:  e.Names(),
			ExpressionAttributeValues: e.Values(),
		})
		switch {
		case err == nil:
			return next, nil
		case !isCondFailed(err):
			return nil, fmt.Errorf("dynamostore: write run %q: %w", runID, err)
		}
		if attempt >= 2 { // sustained contention: spread the retries out
			if err := sleepCtx(ctx, time.Duration(rand.N(10*attempt+1))*time.Millisecond); err != nil {
				return nil, err
			}
		}
	}
	return nil, fmt.Errorf("dynamostore: write run %q: version changed %d times in a row", runID, maxMutateAttempts)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// update is one fast path's UpdateItem: its SET and REMOVE clauses, and the conjuncts of
// its condition (each pins state the helper expressions assume).
type update struct {
	upd   expression.UpdateBuilder
	conds []expression.ConditionBuilder
}

// set adds `SET name = v`.
func (u *update) set(name string, v expression.OperandBuilder) { u.upd = u.upd.Set(attr(name), v) }

// del adds `REMOVE name` for each name.
func (u *update) del(names ...string) {
	for _, name := range names {
		u.upd = u.upd.Remove(attr(name))
	}
}

// cond adds a conjunct to the condition.
func (u *update) cond(c expression.ConditionBuilder) { u.conds = append(u.conds, c) }

// attr and val are the expression builder's names and values.
func attr(name string) expression.NameBuilder { return expression.Name(name) }
func val(v any) expression.ValueBuilder       { return expression.Value(v) }

// fast runs one conditional UpdateItem (bumping the version) and returns the run after it;
// failed=true when the condition did not hold.
func (v fencedRuns) fast(ctx context.Context, runID string, u *update) (r *storedRun, failed bool, err error) {
	u.set(attrVer, attr(attrVer).Plus(val(1)))
	e, err := expr(expression.NewBuilder().WithUpdate(u.upd).WithCondition(allOf(u.conds...)))
	if err != nil {
		return nil, false, err
	}
	out, err := v.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Key:                       itemKey(v.tenant, kindRun, runID),
		UpdateExpression:          e.Update(),
		ConditionExpression:       e.Condition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
		ReturnValues:              types.ReturnValueAllNew,
	})
	switch {
	case isCondFailed(err):
		return nil, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("dynamostore: update run %q: %w", runID, err)
	}
	r, err = decodeRun(out.Attributes)
	if err != nil {
		return nil, false, fmt.Errorf("dynamostore: run %q: %w", runID, err)
	}
	v.learnStep(runID, r.st)
	return r, false, nil
}

// learnStep remembers the reclaimAt st's lease left (only while the lease alone decides
// it: running, undetached, uncancelled, no launch deadline), or forgets it.
func (v fencedRuns) learnStep(runID string, st contract.RunState) {
	k := v.tenant + "\x00" + runID
	if st.Status == contract.StatusRunning && st.DetachedSince == nil && !st.Cancelled() && st.LaunchBy == 0 && st.LeaseUntil > 0 && !st.AppDriven {
		v.s.steps.put(k, contract.LeaseReclaimAt(st.LeaseUntil, v.s.cfg.DriverLease.Milliseconds()))
		return
	}
	v.s.steps.drop(k)
}

// Condition snippets of the fast paths.
func (u *update) condNotTerminal() {
	u.cond(attr(attrStatus).In(val(string(contract.StatusRunning)), val(string(contract.StatusInterrupted))))
}

func (u *update) condRunning() {
	u.cond(attr(attrStatus).Equal(val(string(contract.StatusRunning))))
}

// condNotAppDriven keeps a fast path off app-driven runs: Claim refuses them, and the
// general path derives their reclaimAt (contract.ReclaimAt: only while detached).
func (u *update) condNotAppDriven() {
	u.cond(expression.AttributeNotExists(attr(attrAppDriven)))
}

func (u *update) condNotCancelled() {
	u.cond(expression.AttributeNotExists(attr(attrCancel)).Or(attr(attrCancel).Equal(val(false))))
}

func (u *update) condEpoch(epoch int64) {
	if epoch == 0 {
		u.cond(expression.AttributeNotExists(attr(attrEpoch)).Or(attr(attrEpoch).Equal(val(0))))
		return
	}
	u.cond(attr(attrEpoch).Equal(val(epoch)))
}

// CreateOrResume inserts the run only if absent (one conditional PutItem); an existing run
// is returned unchanged (one more GetItem).
func (v fencedRuns) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	rec, err := in.Record()
	if err != nil {
		return contract.RunRecord{}, err
	}
	r := &storedRun{st: contract.RunState{RunRecord: rec, AppDriven: in.AppDriven}}
	created, err := v.create(ctx, r)
	if err != nil || created {
		return r.st.RunRecord, err
	}
	cur, err := v.read(ctx, in.RunID)
	switch {
	case err != nil:
		return contract.RunRecord{}, err
	case cur == nil: // deleted in between (gcAt): never revived
		return contract.RunRecord{}, fmt.Errorf("dynamostore: create run %q: existed, then vanished: %w", in.RunID, contract.ErrConflict)
	}
	return contract.CreateOrResumeExisting(cur.st, in)
}

// Update applies p by read-then-write on the version (2 calls; helpers recomputed); an
// unknown run is a silent no-op (an empty patch never reaches it: shared/store).
func (v fencedRuns) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	_, err := v.mutate(ctx, runID, func(cur *storedRun) (*storedRun, bool, error) {
		if cur == nil {
			return nil, false, nil
		}
		cur.st.RunRecord = p.ApplyTo(cur.st.RunRecord)
		return cur, true, nil
	})
	return err
}

// State returns the run with its driver attributes (consistent read); unknown: (nil, nil).
func (v fencedRuns) State(ctx context.Context, runID string) (*contract.RunState, error) {
	r, err := v.read(ctx, runID)
	if err != nil || r == nil {
		return nil, err
	}
	return &r.st, nil
}

// CreateClaimed creates the run holding epoch 1, a lease and in.Token in one conditional
// PutItem; an existing run is returned untouched (one GetItem), created=true only when it
// carries in.Token (this call's own landed create).
func (v fencedRuns) CreateClaimed(ctx context.Context, in contract.CreateClaimedRun) (contract.RunState, bool, error) {
	st, err := in.State()
	if err != nil {
		return contract.RunState{}, false, err
	}
	r := &storedRun{st: st, createToken: in.Token}
	created, err := v.create(ctx, r)
	if err != nil || created {
		return r.st, created, err
	}
	cur, err := v.read(ctx, in.RunID)
	switch {
	case err != nil:
		return contract.RunState{}, false, err
	case cur == nil:
		return contract.RunState{}, false, fmt.Errorf("dynamostore: create run %q: existed, then vanished: %w", in.RunID, contract.ErrConflict)
	}
	return cur.st, contract.CreatedBy(cur.createToken, in.Token), nil
}

// Claim bumps driverEpoch and renews the lease while the run exists, is not terminal and
// c.If holds: one UpdateItem (ALL_NEW) on success, conditioned on not carrying c.Token yet
// so an SDK retry never bumps twice. On a failed condition one GetItem classifies the
// refusal or recognises c.Token (this claim's own landed attempt); a
// cancelled run claimed without If.Cancelled takes the general path (its reclaimAt stays 0).
func (v fencedRuns) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	u := &update{}
	u.condNotTerminal()
	u.condNotAppDriven()
	if c.If.Cancelled {
		u.cond(attr(attrCancel).Equal(val(true)))
	} else {
		u.condNotCancelled()
	}
	if c.If.DetachedSince != nil {
		u.cond(attr(attrDetachedSince).Equal(val(*c.If.DetachedSince)))
	}
	if c.If.Cutoff != nil {
		u.cond(attr(attrDetachedSince).LessThanEqual(val(*c.If.Cutoff)))
	}
	if c.If.Unheld != nil {
		// contract.RunState.HeldAt negated; a lease of 0 is stored as no attribute.
		u.cond(expression.AttributeExists(attr(attrDetachedSince)).
			Or(expression.AttributeNotExists(attr(attrLeaseUntil))).
			Or(attr(attrLeaseUntil).LessThanEqual(val(*c.If.Unheld))))
	}
	// reclaimAt below ignores a pending launch deadline (contract.ReclaimAt takes the
	// earlier): such a run, and If.LaunchBy's, take the general path.
	u.cond(expression.AttributeNotExists(attr(attrLaunchBy)))
	if c.If.LaunchBy != nil {
		u.cond(attr(attrLaunchBy).Equal(val(*c.If.LaunchBy))) // never holds here: the general path decides
	}
	if c.Token != "" {
		// An SDK retry of this claim after its response was lost must not bump again: the
		// condition fails on my own token and the general path recognises it.
		u.cond(expression.AttributeNotExists(attr(attrClaimToken)).Or(attr(attrClaimToken).NotEqual(val(c.Token))))
	}
	leaseAt := val(contract.LeaseReclaimAt(c.LeaseUntil, v.s.cfg.DriverLease.Milliseconds()))
	u.set(attrEpoch, expression.Plus(attr(attrEpoch).IfNotExists(val(0)), val(1)))
	u.set(attrLeaseUntil, val(c.LeaseUntil))
	u.set(attrStatus, val(string(contract.StatusRunning)))
	u.set(attrActiveThread, attr(attrByThread))
	u.set(attrReclaimShard, val(shard(v.tenant, runID)))
	switch {
	case c.If.Cancelled:
		u.set(attrReclaimAt, val(0))
	case c.ClearDetached:
		u.set(attrReclaimAt, leaseAt)
	default:
		u.set(attrReclaimAt, attr(attrDetachedSince).IfNotExists(leaseAt))
	}
	if c.ClearDetached {
		u.del(attrDetachedSince, attrLapsed)
	}
	setOrDel(u, attrClaimToken, c.Token)
	r, failed, err := v.fast(ctx, runID, u)
	if err != nil || !failed {
		return stateOf(r), err
	}
	return v.decide(ctx, "claim", runID, func(cur *storedRun) (contract.RunState, bool, error) {
		var token string
		if cur != nil {
			token = cur.claimToken
			cur.claimToken = c.Token // stored only when the rule writes
		}
		return contract.ClaimNext(stPtr(cur), token, c)
	})
}

// setOrDel sets a string attribute, or removes it for "" (empty strings are never stored).
func setOrDel(u *update, name, v string) {
	if v == "" {
		u.del(name)
		return
	}
	u.set(name, val(v))
}

func stateOf(r *storedRun) contract.RunState {
	if r == nil {
		return contract.RunState{}
	}
	return r.st
}

func stPtr(r *storedRun) *contract.RunState {
	if r == nil {
		return nil
	}
	return &r.st
}

// decide is the general path of a primitive: rule (sandbox/runrules.go) decides on the run
// as read (a private copy; nil when unknown) whether to refuse, answer it as it is (the
// call's own landed retry) or write its next state, which mutate stores.
func (v fencedRuns) decide(ctx context.Context, op, runID string,
	rule func(cur *storedRun) (contract.RunState, bool, error)) (contract.RunState, error) {
	r, err := v.mutate(ctx, runID, func(cur *storedRun) (*storedRun, bool, error) {
		next, write, err := rule(cur)
		switch {
		case err != nil:
			return nil, false, fmt.Errorf("dynamostore: %s %q: %w", op, runID, err)
		case cur == nil: // every rule refuses an absent run
			return nil, false, fmt.Errorf("dynamostore: %s %q: a rule accepted an absent run", op, runID)
		}
		cur.st = next
		return cur, write, nil
	})
	return stateOf(r), err
}

// fenced decides a fenced write by rule on the general path.
func (v fencedRuns) fenced(ctx context.Context, op, runID string,
	rule func(cur *contract.RunState) (contract.RunState, bool, error)) (contract.RunState, error) {
	return v.decide(ctx, op, runID, func(cur *storedRun) (contract.RunState, bool, error) {
		return rule(stPtr(cur))
	})
}

// UpdateFenced applies p only while driverEpoch == epoch and the run is not terminal. A
// patch that makes the run terminal, or leaves status, detachedSince, cancelRequested and
// sandboxKey alone, is one UpdateItem; any other patch takes the general path. A retried
// terminal write that already landed (same epoch, same terminal status) succeeds.
func (v fencedRuns) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	status, hasStatus := p.Status.Value()
	terminal := hasStatus && status.Terminal()
	neutral := p.Status.IsZero() && p.DetachedSince.IsZero() && p.CancelRequested.IsZero() && p.SandboxKey.IsZero()
	if terminal || neutral {
		u := &update{}
		u.condNotTerminal()
		u.condEpoch(epoch)
		patchUpdate(u, p)
		if terminal {
			u.del(attrActiveThread, attrReclaimShard, attrReclaimAt, attrKeyRef)
			fin, _ := p.FinishedAt.Value()
			var finp *int64
			if p.FinishedAt.IsSet() {
				finp = &fin
			}
			u.set(attrGCAt, val(v.s.gcAtOf(finp)))
			if p.FinishedAt.IsZero() { // gcAt assumes no finishedAt is kept from before
				u.cond(expression.AttributeNotExists(attr(attrFinishedAt)))
			}
		}
		r, failed, err := v.fast(ctx, runID, u)
		if err != nil || !failed {
			return stateOf(r), err
		}
	}
	return v.fenced(ctx, "update", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.UpdateFencedNext(cur, epoch, p)
	})
}

// patchUpdate adds the record fields of a valid patch to u.
func patchUpdate(u *update, p contract.RunPatch) {
	if st, ok := p.Status.Value(); ok {
		u.set(attrStatus, val(string(st)))
	}
	num := func(name string, f contract.Field[int64]) {
		if n, ok := f.Value(); ok {
			u.set(name, val(n))
		} else if f.IsClear() {
			u.del(name)
		}
	}
	num(attrFinishedAt, p.FinishedAt)
	num(attrDetachedSince, p.DetachedSince)
	num(attrEpoch, p.DriverEpoch)
	if e, ok := p.Error.Value(); ok {
		u.set(attrError, val(errorJSON(e)))
	} else if p.Error.IsClear() {
		u.del(attrError)
	}
	if b, ok := p.Usage.Value(); ok {
		u.set(attrUsage, val(&types.AttributeValueMemberB{Value: append([]byte(nil), b...)}))
	} else if p.Usage.IsClear() {
		u.del(attrUsage)
	}
	if k, ok := p.SandboxKey.Value(); ok {
		u.set(attrSandboxKey, val(k))
	} else if p.SandboxKey.IsClear() {
		u.del(attrSandboxKey)
	}
	if c, ok := p.CancelRequested.Value(); ok {
		u.set(attrCancel, val(c))
	} else if p.CancelRequested.IsClear() {
		u.del(attrCancel)
	}
}

// RecordSandbox sets providerSandboxId under the same fence as UpdateFenced (one
// UpdateItem; the helpers do not depend on it).
func (v fencedRuns) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (contract.RunState, error) {
	u := &update{}
	u.condNotTerminal()
	u.condEpoch(epoch)
	u.set(attrPSID, val(psid))
	r, failed, err := v.fast(ctx, runID, u)
	if err != nil || !failed {
		return stateOf(r), err
	}
	return v.fenced(ctx, "record sandbox", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.RecordSandboxNext(cur, epoch, psid)
	})
}

// Heartbeat sets leaseUntil under the fence: for a running, uncancelled, unlapsed run one
// UpdateItem that leaves the reclaim helpers alone while they already hold what the new
// lease derives (contract.ReclaimAt: detached, or the lease's reclaimAt unchanged), so most
// renewals write no reclaim-index entry (docs/design.md §3); the renewal that crosses a
// whole driver lease takes the UpdateItem that sets them, first when this store left the
// run in the step before (steps), else after the other's refusal.
// Otherwise the general path, which on a lapsed run also removes lapsed and the
// detachedSince the reaper stamped (never an explicit one).
func (v fencedRuns) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (contract.RunState, error) {
	step := contract.LeaseReclaimAt(leaseUntil, v.s.cfg.DriverLease.Milliseconds())
	at := val(step)
	order := []bool{false, true}
	if was, ok := v.s.steps.get(v.tenant + "\x00" + runID); ok && was != step {
		order = []bool{true, false} // this store left the run in another step: cross first
	}
	for _, moves := range order {
		u := heartbeatUpdate(epoch, leaseUntil)
		if moves {
			// Only a lease that really moves the step sets the helpers: never a value SET
			// unchanged, nor a detached run's (its reclaimAt is detachedSince).
			u.cond(expression.AttributeNotExists(attr(attrDetachedSince)))
			u.cond(expression.AttributeNotExists(attr(attrReclaimAt)).Or(attr(attrReclaimAt).NotEqual(at)))
			u.set(attrReclaimShard, val(shard(v.tenant, runID)))
			u.set(attrReclaimAt, at)
		} else {
			u.cond(expression.AttributeExists(attr(attrDetachedSince)).Or(attr(attrReclaimAt).Equal(at)))
		}
		r, failed, err := v.fast(ctx, runID, u)
		if err != nil || !failed {
			return stateOf(r), err
		}
	}
	return v.fenced(ctx, "heartbeat", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.HeartbeatNext(cur, epoch, leaseUntil)
	})
}

// heartbeatUpdate is a heartbeat's fast path without its reclaim helpers: leaseUntil under
// the conditions that leave the rule nothing else to change.
func heartbeatUpdate(epoch, leaseUntil int64) *update {
	u := &update{}
	u.condRunning()
	u.condNotCancelled()
	u.condNotAppDriven()
	u.condEpoch(epoch)
	u.cond(expression.AttributeNotExists(attr(attrLapsed)))
	u.cond(expression.AttributeNotExists(attr(attrLaunchBy))) // else reclaimAt is the earlier of the two
	u.set(attrLeaseUntil, val(leaseUntil))
	return u
}

// Detach sets detachedSince = now only if absent, and sandboxKey, under the fence: one
// UpdateItem for a running, uncancelled run; otherwise the general path.
func (v fencedRuns) Detach(ctx context.Context, runID string, epoch int64, sandboxKey string, now int64) (contract.RunState, error) {
	u := &update{}
	u.condRunning()
	u.condNotCancelled()
	u.condEpoch(epoch)
	u.cond(expression.AttributeNotExists(attr(attrLaunchBy))) // else reclaimAt is the earlier of the two
	since := attr(attrDetachedSince).IfNotExists(val(now))
	u.set(attrDetachedSince, since)
	u.set(attrReclaimAt, since) // operands read the item before the update
	u.set(attrReclaimShard, val(shard(v.tenant, runID)))
	if sandboxKey != "" {
		u.set(attrSandboxKey, val(sandboxKey))
		u.set(attrKeyRef, val(keyRefOf(v.tenant, sandboxKey)))
	}
	r, failed, err := v.fast(ctx, runID, u)
	if err != nil || !failed {
		return stateOf(r), err
	}
	return v.fenced(ctx, "detach", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.DetachNext(cur, epoch, sandboxKey, now)
	})
}

// Lapse stamps detachedSince = leaseUntil and lapsed only while driverEpoch and leaseUntil
// are as read and detachedSince is absent; a run already lapsed exactly so is this call's
// own landed write; else ErrConflict (ErrUnknownRun when absent).
func (v fencedRuns) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	u := &update{}
	u.condRunning()
	u.condNotCancelled()
	u.condEpoch(epoch)
	lease := val(leaseUntil)
	u.cond(attr(attrLeaseUntil).Equal(lease))
	u.cond(expression.AttributeNotExists(attr(attrDetachedSince)))
	u.cond(expression.AttributeNotExists(attr(attrLaunchBy))) // else reclaimAt is the earlier of the two
	u.set(attrDetachedSince, lease)
	u.set(attrLapsed, val(true))
	u.set(attrReclaimAt, lease)
	u.set(attrReclaimShard, val(shard(v.tenant, runID)))
	_, failed, err := v.fast(ctx, runID, u)
	if err != nil || !failed {
		return err
	}
	_, err = v.fenced(ctx, "lapse", runID, func(cur *contract.RunState) (contract.RunState, bool, error) {
		return contract.LapseNext(cur, epoch, leaseUntil)
	})
	return err
}

// RequestCancel sets cancelRequested (sticky) and reclaimAt = 0: one UpdateItem on a
// running run; a terminal or already cancelled run is returned unchanged; an interrupted
// run takes the general path (it has no reclaim entry); unknown: ErrUnknownRun.
func (v fencedRuns) RequestCancel(ctx context.Context, runID string) (contract.RunState, error) {
	u := &update{}
	u.condRunning()
	u.condNotAppDriven()
	u.set(attrCancel, val(true))
	u.set(attrReclaimAt, val(0))
	u.set(attrReclaimShard, val(shard(v.tenant, runID)))
	r, failed, err := v.fast(ctx, runID, u)
	if err != nil || !failed {
		return stateOf(r), err
	}
	return v.fenced(ctx, "cancel", runID, contract.CancelNext)
}

// ClearLaunch removes launchBy from a non-terminal run, on the general path (the run's
// reclaimAt changes with it); otherwise the run is returned as it is; unknown:
// ErrUnknownRun. Once per run at most, so one read and one conditional put.
func (v fencedRuns) ClearLaunch(ctx context.Context, runID string) (contract.RunState, error) {
	return v.fenced(ctx, "clear launch", runID, contract.ClearLaunchNext)
}
