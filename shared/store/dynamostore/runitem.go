package dynamostore

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Run item <tenant>#RUN#<runId> (sk RUN): the record under its JSON names, the driver
// attributes, the tokens that let a retried write recognise itself, a version every write
// bumps (the read-then-write paths are conditioned on it), and the index helpers, which
// every write recomputes from the resulting state (docs/design.md §3.1):
//
//	byThread, threadSort   always (runsByThread; ListByThread returns finished runs too)
//	byTenant               always (runsByTenant; ListRuns)
//	activeThread           while running (activeByThread)
//	reclaimShard/At        while running (reclaimCandidates; contract.ReclaimAt)
//	keyRef                 while non-terminal with a sandboxKey (runsByKey)
//	gcAt                   once terminal: finishedAt + LogRetention + 1 day (epoch seconds)
const (
	attrStatus        = "status"
	attrStartedAt     = "startedAt"
	attrFinishedAt    = "finishedAt"
	attrError         = "error" // JSON of contract.RunError
	attrUsage         = "usage" // the opaque document's bytes, verbatim (B: valid JSON may hold invalid UTF-8)
	attrSandboxKey    = "sandboxKey"
	attrDetachedSince = "detachedSince"
	attrCancel        = "cancelRequested"
	attrEpoch         = "driverEpoch"
	attrLeaseUntil    = "leaseUntil"
	attrLapsed        = "lapsed"
	attrAppDriven     = "appDriven"
	attrLaunchBy      = "launchBy"
	attrVer           = "ver"
	attrCreateToken   = "createToken"
	attrClaimToken    = "claimToken"
)

// recordAttrs are the attributes of the reference's run record (contract.RunRecord), the
// ones runsByThread projects for ListByThread.
var recordAttrs = []string{attrRunID, attrThreadID, attrStatus, attrStartedAt, attrFinishedAt, attrError, attrUsage,
	attrSandboxKey, attrDetachedSince, attrCancel, attrEpoch}

// storedRun is a decoded run item.
type storedRun struct {
	st          contract.RunState
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

// runItem is the stored form of a run: the record under its JSON names, the driver
// attributes, the retry tokens, the version and the index helpers.
type runItem struct {
	keyAttrs
	Tenant            string  `dynamodbav:"tenant"`
	RunID             string  `dynamodbav:"runId"`
	ThreadID          string  `dynamodbav:"threadId,omitempty"`
	Status            string  `dynamodbav:"status"`
	StartedAt         int64   `dynamodbav:"startedAt"`
	FinishedAt        *int64  `dynamodbav:"finishedAt,omitempty"`
	Error             string  `dynamodbav:"error,omitempty"` // JSON of contract.RunError
	Usage             []byte  `dynamodbav:"usage,omitempty"` // B: valid JSON may hold invalid UTF-8
	SandboxKey        *string `dynamodbav:"sandboxKey,omitempty"`
	DetachedSince     *int64  `dynamodbav:"detachedSince,omitempty"`
	CancelRequested   *bool   `dynamodbav:"cancelRequested,omitempty"`
	DriverEpoch       *int64  `dynamodbav:"driverEpoch,omitempty"`
	ProviderSandboxID string  `dynamodbav:"providerSandboxId,omitempty"`
	LeaseUntil        int64   `dynamodbav:"leaseUntil,omitempty"`
	Lapsed            bool    `dynamodbav:"lapsed,omitempty"`
	AppDriven         bool    `dynamodbav:"appDriven,omitempty"`
	LaunchBy          int64   `dynamodbav:"launchBy,omitempty"`
	Ver               int64   `dynamodbav:"ver"`
	CreateToken       string  `dynamodbav:"createToken,omitempty"`
	ClaimToken        string  `dynamodbav:"claimToken,omitempty"`

	ByThread     string `dynamodbav:"byThread"`
	ByTenant     string `dynamodbav:"byTenant"`
	ThreadSort   string `dynamodbav:"threadSort"`
	ActiveThread string `dynamodbav:"activeThread,omitempty"`
	ReclaimShard string `dynamodbav:"reclaimShard,omitempty"`
	ReclaimAt    *int64 `dynamodbav:"reclaimAt,omitempty"` // 0 for a cancelled run
	KeyRef       string `dynamodbav:"keyRef,omitempty"`
	GCAt         int64  `dynamodbav:"gcAt,omitempty"`
}

// runItem renders the full item of r, helpers recomputed from its state.
func (s *Store) runItem(tenant string, r *storedRun) (map[string]types.AttributeValue, error) {
	st := r.st
	it := runItem{
		keyAttrs: singleKey(tenant, kindRun, st.RunID), Tenant: tenant, RunID: st.RunID,
		ThreadID: st.ThreadID, Status: string(st.Status), StartedAt: st.StartedAt, FinishedAt: st.FinishedAt,
		SandboxKey: st.SandboxKey, DetachedSince: st.DetachedSince, CancelRequested: st.CancelRequested,
		DriverEpoch: st.DriverEpoch, ProviderSandboxID: st.ProviderSandboxID, LeaseUntil: st.LeaseUntil,
		Lapsed: st.Lapsed, AppDriven: st.AppDriven, LaunchBy: st.LaunchBy, Ver: r.ver, CreateToken: r.createToken, ClaimToken: r.claimToken,
		ByThread: threadRef(tenant, st.ThreadID), ByTenant: tenantRunsRef(tenant),
		ThreadSort: threadSortKey(st.StartedAt, st.RunID),
	}
	if st.Error != nil {
		it.Error = errorJSON(*st.Error)
	}
	if st.Usage != nil {
		it.Usage = append([]byte(nil), st.Usage...)
	}
	if st.Status == contract.StatusRunning {
		it.ActiveThread = threadRef(tenant, st.ThreadID)
	}
	if at, ok := contract.ReclaimAt(st, s.cfg.DriverLease.Milliseconds()); ok {
		it.ReclaimShard, it.ReclaimAt = shard(tenant, st.RunID), &at
	}
	if !st.Status.Terminal() && st.SandboxKey != nil {
		it.KeyRef = keyRefOf(tenant, *st.SandboxKey)
	}
	if st.Status.Terminal() {
		it.GCAt = s.gcAtOf(st.FinishedAt)
	}
	return encodeItem(&it)
}

func errorJSON(e contract.RunError) string {
	b, _ := json.Marshal(e) // a struct of two strings always encodes
	return string(b)
}

// decodeRun reads a run item; a stored status outside the known set is an error.
func decodeRun(m map[string]types.AttributeValue) (*storedRun, error) {
	it, err := decodeItem[runItem](m)
	if err != nil {
		return nil, err
	}
	r := &storedRun{
		st: contract.RunState{
			RunRecord: contract.RunRecord{
				RunID: it.RunID, ThreadID: it.ThreadID, StartedAt: it.StartedAt, FinishedAt: it.FinishedAt,
				SandboxKey: it.SandboxKey, DetachedSince: it.DetachedSince, CancelRequested: it.CancelRequested,
				DriverEpoch: it.DriverEpoch,
			},
			ProviderSandboxID: it.ProviderSandboxID, LeaseUntil: it.LeaseUntil, Lapsed: it.Lapsed,
			AppDriven: it.AppDriven,
			LaunchBy:  it.LaunchBy,
		},
		ver: it.Ver, createToken: it.CreateToken, claimToken: it.ClaimToken,
	}
	st := &r.st
	if st.Status, err = contract.ParseRunStatus(it.Status); err != nil {
		return nil, fmt.Errorf("dynamostore: run %q has a stored status that is not valid: %w", st.RunID, err)
	}
	if it.Error != "" {
		st.Error = &contract.RunError{}
		if err := json.Unmarshal([]byte(it.Error), st.Error); err != nil {
			return nil, fmt.Errorf("dynamostore: run %q: %w: error: %w", st.RunID, errAttr, err)
		}
	}
	if it.Usage != nil {
		st.Usage = json.RawMessage(it.Usage)
	}
	return r, nil
}
