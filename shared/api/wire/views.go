package wire

import "github.com/sandkeep/sandkeep/shared/contract"

// Bounds of the viewer's listings.
const (
	DefaultListLimit   = 50  // GET /v1/runs
	MaxListLimit       = 100 // GET /v1/runs (contract.MaxListLimit)
	DefaultSweepsLimit = 10  // GET /v1/reaper/sweeps
)

// RunListResponse answers GET /v1/runs: a page of the tenant's runs, newest first.
type RunListResponse struct {
	Runs []RunView `json:"runs"`
	Next *string   `json:"next"` // the cursor of the next page; null when done
	Now  int64     `json:"now"`  // server time (ms): lease and detach ages use its clock
}

// RunViewResponse answers GET /v1/runs/{runId}/view.
type RunViewResponse struct {
	Run RunView `json:"run"`
	Now int64   `json:"now"`
}

// RunView is a run as a viewer shows it: the record, the driver lease and the sandbox.
type RunView struct {
	contract.RunRecord
	LeaseUntil int64        `json:"leaseUntil,omitempty"` // end of the driver lease (ms); 0 = never leased
	Lapsed     bool         `json:"lapsed,omitempty"`     // the reaper stamped detachedSince from a lapsed lease
	Sandbox    *ViewSandbox `json:"sandbox,omitempty"`    // nil: the run names no sandbox
}

// ViewSandbox is the sandbox a listed run uses, as its instance row tells it now.
type ViewSandbox struct {
	Key               string `json:"key"`
	Provider          string `json:"provider,omitempty"`          // "" when the row is gone
	ProviderSandboxID string `json:"providerSandboxId,omitempty"` // the run's, else the row's
	State             string `json:"state"`                       // live, reclaiming (a reclaim is pending) or gone
	// Lifecycle is what the sandbox costs now: running, stopping, stopped, archived or gone,
	// since LifecycleSince (epoch ms; absent when unknown).
	Lifecycle      string `json:"lifecycle"`
	LifecycleSince int64  `json:"lifecycleSince,omitempty"`
}

// SweepsResponse answers GET /v1/reaper/sweeps: the server's last sweeps, newest first,
// each as the caller's tenant sees it.
type SweepsResponse struct {
	Sweeps        []TenantSweep `json:"sweeps"`
	Next          *string       `json:"next"` // the cursor of older sweeps; null when done
	Kept          int           `json:"kept"` // how many sweeps the server keeps
	EveryMs       int64         `json:"everyMs"`
	DetachedTTLMs int64         `json:"detachedTtlMs"`
	Now           int64         `json:"now"`
}

// TenantSweep is one reaper sweep as a tenant may see it (docs/design.md §5): when it
// started and what it did with that tenant's runs, nothing derived from other tenants'.
type TenantSweep struct {
	Seq       int64        `json:"seq"`
	StartedAt int64        `json:"startedAt"` // ms; sweeps start on a fixed period
	Report    TenantReport `json:"report"`
}

// TenantReport is the part of a sweep's report about one tenant's runs.
type TenantReport struct {
	Considered int             `json:"considered"` // this tenant's runs the sweep reported on
	Outcomes   SweepOutcomes   `json:"outcomes"`
	Sandboxes  SweepSandboxes  `json:"sandboxes"` // the sandboxes of this tenant's runs the sweep ended
	Runs       []SweepRunEntry `json:"runs"`
}

// SweepOutcomes counts a sweep's runs per outcome; every key is always present.
type SweepOutcomes struct {
	Finalized      int `json:"finalized"`
	Expired        int `json:"expired"`
	Producing      int `json:"producing"`
	Reshipped      int `json:"reshipped"`
	Unknown        int `json:"unknown"`
	BudgetExceeded int `json:"budget-exceeded"`
	NotClaimed     int `json:"not-claimed"`
	Failed         int `json:"failed"`
}

// SweepSandboxes counts the sandbox fates of the runs a sweep ended; every key is always
// present.
type SweepSandboxes struct {
	Reclaimed     int `json:"reclaimed"`
	Kept          int `json:"kept"`
	ReclaimFailed int `json:"reclaim-failed"`
}

// SweepRunEntry is one run's line in a sweep's report.
type SweepRunEntry struct {
	Tenant   string `json:"tenant"`
	RunID    string `json:"runId"`
	Outcome  string `json:"outcome"`            // finalized, expired, producing, reshipped, unknown, budget-exceeded, not-claimed, failed
	Status   string `json:"status,omitempty"`   // the run's status after the sweep acted
	ExitCode *int   `json:"exitCode,omitempty"` // when the journal's sentinel was read
	Events   int    `json:"events,omitempty"`   // events this sweep appended
	Error    string `json:"error,omitempty"`
	DryRun   bool   `json:"dryRun,omitempty"` // the outcome a real sweep would have had
	// Reclaim is a dry run's word on the run's sandbox after it ended: destroy-and-delete,
	// keep-in-use or none.
	Reclaim string `json:"reclaim,omitempty"`
	// Sandbox is what a real sweep did with the sandbox of a run it ended: reclaimed, kept
	// or reclaim-failed (absent when it ended none).
	Sandbox string `json:"sandbox,omitempty"`
	// Kept says why a kept sandbox was kept: in-use (KeptFor names the run using it) or
	// touched-recently (RetryAt is when a later sweep retries the reclaim, epoch ms).
	Kept    string `json:"kept,omitempty"`
	KeptFor string `json:"keptFor,omitempty"`
	RetryAt int64  `json:"retryAt,omitempty"`
}
