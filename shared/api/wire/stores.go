package wire

import (
	"encoding/json"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The reference store surface (docs/design.md §8, "Store routes"): TanStack AI's instance
// map, run store and lock store, for trusted callers. Member names are the reference's.

// InstanceRequest is the body of PUT /v1/store/instances/{key}: the full record (a full
// replace: an absent optional clears the stored one). key, when given, must be the path's.
type InstanceRequest struct {
	Key               *string `json:"key"`
	Provider          string  `json:"provider"`
	ProviderSandboxID string  `json:"providerSandboxId"`
	LatestSnapshotID  *string `json:"latestSnapshotId"`
	ThreadID          string  `json:"threadId"`
	LatestRunID       *string `json:"latestRunId"`
	UpdatedAt         *int64  `json:"updatedAt"`
}

// InstanceResponse answers GET /v1/store/instances/{key}.
type InstanceResponse struct {
	Instance *contract.InstanceRecord `json:"instance"` // null when the key has none
}

// StoreRunRequest is the body of POST /v1/store/runs (createOrResume).
type StoreRunRequest struct {
	RunID     string  `json:"runId"`
	ThreadID  string  `json:"threadId"`
	StartedAt *int64  `json:"startedAt"`
	Status    *string `json:"status"`
}

// StoreRunPatch is the body of PATCH /v1/store/runs/{runId}: an absent member leaves the
// field alone, null clears it, a value sets it (each member is read raw to tell the three
// apart).
type StoreRunPatch struct {
	Status          json.RawMessage `json:"status"`
	FinishedAt      json.RawMessage `json:"finishedAt"`
	Error           json.RawMessage `json:"error"`
	Usage           json.RawMessage `json:"usage"`
	SandboxKey      json.RawMessage `json:"sandboxKey"`
	DetachedSince   json.RawMessage `json:"detachedSince"`
	CancelRequested json.RawMessage `json:"cancelRequested"`
	DriverEpoch     json.RawMessage `json:"driverEpoch"`
}

// StoreRunResponse answers GET /v1/store/runs/{runId} and the store's active-run.
type StoreRunResponse struct {
	Run *contract.RunRecord `json:"run"` // null when unknown / idle
}

// CreatedRunResponse answers POST /v1/store/runs.
type CreatedRunResponse struct {
	Run contract.RunRecord `json:"run"`
}

// RunsResponse answers the store's listings.
type RunsResponse struct {
	Runs []contract.RunRecord `json:"runs"`
}

// MaxLockWaitMs bounds an acquire's wait, like a long poll's.
const MaxLockWaitMs = MaxWaitMs

// LockAcquireRequest is the body of POST /v1/store/locks/{key}/acquire.
type LockAcquireRequest struct {
	WaitMs *int64 `json:"waitMs"`
}

// LockAcquireResponse answers an acquire: the lease's owner token, its fence and the
// timing the holder keeps (renew every renewMs; lost at send time + leaseMs − skewMs).
type LockAcquireResponse struct {
	Token   string `json:"token"`
	Fence   int64  `json:"fence"`
	LeaseMs int64  `json:"leaseMs"`
	RenewMs int64  `json:"renewMs"`
	SkewMs  int64  `json:"skewMs"`
}

// LockTokenRequest is the body of renew and release.
type LockTokenRequest struct {
	Token string `json:"token"`
}

// LockRenewResponse answers a renew.
type LockRenewResponse struct {
	LeaseMs int64 `json:"leaseMs"`
}
