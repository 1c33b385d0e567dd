package dynamostore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Run item <tenant>#RUN#<runId> (sk RUN): the record under its JSON names, the driver
// attributes, the tokens that let a retried write recognise itself, a version every write
// bumps (the read-then-write paths are conditioned on it), and the index helpers, which
// every write recomputes from the resulting state (docs/design.md §3.1):
//
//	byThread, threadSort   always (runsByThread; ListByThread returns finished runs too)
//	byTenant               always (runsByTenant; ListRuns)
//	activeThread           while running (activeByThread)
//	reclaimShard/At        while running (reclaimCandidates; sandbox.ReclaimAt)
//	keyRef                 while non-terminal with a sandboxKey (runsByKey)
//	gcAt                   once terminal: finishedAt + LogRetention + 1 day (epoch seconds)
const (
	attrStatus        = "status"
	attrStartedAt     = "startedAt"
	attrFinishedAt    = "finishedAt"
	attrError         = "error" // JSON of sandbox.RunError
	attrUsage         = "usage" // the opaque document's bytes, verbatim (B: valid JSON may hold invalid UTF-8)
	attrSandboxKey    = "sandboxKey"
	attrDetachedSince = "detachedSince"
	attrCancel        = "cancelRequested"
	attrEpoch         = "driverEpoch"
	attrLeaseUntil    = "leaseUntil"
	attrLapsed        = "lapsed"
	attrVer           = "ver"
	attrCreateToken   = "createToken"
	attrClaimToken    = "claimToken"
)

// storedRun is a decoded run item.
type storedRun struct {
	st          sandbox.RunState
	ver         int64
	createToken string
	claimToken  string
}

// clone deep-copies r so a mutation never aliases what was read.
func (r *storedRun) clone() *storedRun {
	c := *r
	c.st = r.st.Clone()
	return &c
}

// threadRef is the value of byThread/activeThread: <tenant>#<threadId>.
func threadRef(tenant, threadID string) string { return tenant + "#" + threadID }

// threadSortKey orders a thread's runs by startedAt, then runId.
func threadSortKey(startedAt int64, runID string) string { return sortInt(startedAt) + "#" + runID }

// keyRefOf is the value of keyRef: <tenant>#<sandboxKey>.
func keyRefOf(tenant, key string) string { return tenant + "#" + key }

// gcAtOf is the TTL of a terminal run: its finish (or now) + log retention + 1 day, in
// epoch seconds, so the run outlives its log items.
func (s *Store) gcAtOf(finishedAt *int64) int64 {
	fin := s.nowMs()
	if finishedAt != nil {
		fin = *finishedAt
	}
	return (fin + (s.cfg.LogRetention + 24*time.Hour).Milliseconds()) / 1000
}

// runItem renders the full item of r, helpers recomputed from its state.
func (s *Store) runItem(tenant string, r *storedRun) map[string]types.AttributeValue {
	st := r.st
	m := itemKey(tenant, kindRun, st.RunID)
	m[attrTenant] = avS(tenant)
	m[attrRunID] = avS(st.RunID)
	putS(m, attrThreadID, st.ThreadID)
	m[attrStatus] = avS(string(st.Status))
	m[attrStartedAt] = avN(st.StartedAt)
	if st.FinishedAt != nil {
		m[attrFinishedAt] = avN(*st.FinishedAt)
	}
	if st.Error != nil {
		m[attrError] = avS(errorJSON(*st.Error))
	}
	if st.Usage != nil {
		m[attrUsage] = &types.AttributeValueMemberB{Value: append([]byte(nil), st.Usage...)}
	}
	if st.SandboxKey != nil {
		m[attrSandboxKey] = avS(*st.SandboxKey)
	}
	if st.DetachedSince != nil {
		m[attrDetachedSince] = avN(*st.DetachedSince)
	}
	if st.CancelRequested != nil {
		m[attrCancel] = avBool(*st.CancelRequested)
	}
	if st.DriverEpoch != nil {
		m[attrEpoch] = avN(*st.DriverEpoch)
	}
	putS(m, attrPSID, st.ProviderSandboxID)
	if st.LeaseUntil != 0 {
		m[attrLeaseUntil] = avN(st.LeaseUntil)
	}
	if st.Lapsed {
		m[attrLapsed] = avBool(true)
	}
	m[attrVer] = avN(r.ver)
	putS(m, attrCreateToken, r.createToken)
	putS(m, attrClaimToken, r.claimToken)

	m[attrByThread] = avS(threadRef(tenant, st.ThreadID))
	m[attrByTenant] = avS(tenantRunsRef(tenant))
	m[attrThreadSort] = avS(threadSortKey(st.StartedAt, st.RunID))
	if st.Status == sandbox.StatusRunning {
		m[attrActiveThread] = avS(threadRef(tenant, st.ThreadID))
	}
	if at, ok := sandbox.ReclaimAt(st, s.cfg.DriverLease.Milliseconds()); ok {
		m[attrReclaimShard] = avS(shard(tenant, st.RunID))
		m[attrReclaimAt] = avN(at)
	}
	if !st.Status.Terminal() && st.SandboxKey != nil {
		m[attrKeyRef] = avS(keyRefOf(tenant, *st.SandboxKey))
	}
	if st.Status.Terminal() {
		m[attrGCAt] = avN(s.gcAtOf(st.FinishedAt))
	}
	return m
}

func errorJSON(e sandbox.RunError) string {
	b, _ := json.Marshal(e) // a struct of two strings always encodes
	return string(b)
}

// decodeRun reads a run item; a stored status outside the known set is an error.
func decodeRun(m map[string]types.AttributeValue) (*storedRun, error) {
	r := &storedRun{}
	st := &r.st
	var err error
	str := func(name string, dst *string) {
		if err == nil {
			*dst, err = getS(m, name)
		}
	}
	optN := func(name string) *int64 {
		if err != nil {
			return nil
		}
		n, ok, e := getN(m, name)
		if err = e; !ok || e != nil {
			return nil
		}
		return &n
	}
	var status, errJSON string
	str(attrRunID, &st.RunID)
	str(attrThreadID, &st.ThreadID)
	str(attrStatus, &status)
	str(attrError, &errJSON)
	str(attrPSID, &st.ProviderSandboxID)
	str(attrCreateToken, &r.createToken)
	str(attrClaimToken, &r.claimToken)
	if _, ok := m[attrSandboxKey]; ok {
		var k string
		str(attrSandboxKey, &k)
		st.SandboxKey = &k
	}
	if p := optN(attrStartedAt); p != nil {
		st.StartedAt = *p
	}
	st.FinishedAt = optN(attrFinishedAt)
	st.DetachedSince = optN(attrDetachedSince)
	st.DriverEpoch = optN(attrEpoch)
	if p := optN(attrLeaseUntil); p != nil {
		st.LeaseUntil = *p
	}
	if p := optN(attrVer); p != nil {
		r.ver = *p
	}
	if err == nil {
		var b, ok bool
		if b, ok, err = getBool(m, attrCancel); ok && err == nil {
			st.CancelRequested = &b
		}
	}
	if err == nil {
		st.Lapsed, _, err = getBool(m, attrLapsed)
	}
	if err != nil {
		return nil, err
	}
	if st.Status, err = sandbox.ParseRunStatus(status); err != nil {
		return nil, fmt.Errorf("dynamostore: run %q has a stored status that is not valid: %w", st.RunID, err)
	}
	if errJSON != "" {
		st.Error = &sandbox.RunError{}
		if err := json.Unmarshal([]byte(errJSON), st.Error); err != nil {
			return nil, fmt.Errorf("dynamostore: run %q: %w: error: %w", st.RunID, errAttr, err)
		}
	}
	if av, ok := m[attrUsage]; ok {
		b, ok := av.(*types.AttributeValueMemberB)
		if !ok {
			return nil, fmt.Errorf("dynamostore: run %q: %w: usage is %T, want B", st.RunID, errAttr, av)
		}
		st.Usage = append(json.RawMessage(nil), b.Value...)
	}
	return r, nil
}
