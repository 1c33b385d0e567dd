package contract

import (
	"context"
	"encoding/json"
)

// RunStatus is the lifecycle state of a run.
type RunStatus string

// The run statuses; completed, failed and aborted are terminal.
const (
	StatusRunning     RunStatus = "running"
	StatusInterrupted RunStatus = "interrupted"
	StatusCompleted   RunStatus = "completed"
	StatusFailed      RunStatus = "failed"
	StatusAborted     RunStatus = "aborted"
)

// ParseRunStatus parses s exactly (case-sensitive); anything else is ErrInvalid.
func ParseRunStatus(s string) (RunStatus, error) {
	switch st := RunStatus(s); st {
	case StatusRunning, StatusInterrupted, StatusCompleted, StatusFailed, StatusAborted:
		return st, nil
	}
	return "", Invalid("status", "unknown run status %q", s)
}

// Terminal reports whether s is completed, failed or aborted.
func (s RunStatus) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusAborted
}

// RunError is the error a failed run ended with.
type RunError struct {
	Message string `json:"message"`
	Code    string `json:"code,omitempty"`
}

// RunRecord is the reference run record plus the four durable fields.
type RunRecord struct {
	RunID           string          `json:"runId"`
	ThreadID        string          `json:"threadId"`
	Status          RunStatus       `json:"status"`
	StartedAt       int64           `json:"startedAt"`
	FinishedAt      *int64          `json:"finishedAt,omitempty"`
	Error           *RunError       `json:"error,omitempty"`
	Usage           json.RawMessage `json:"usage,omitempty"` // opaque document, round-trips deep-equal
	SandboxKey      *string         `json:"sandboxKey,omitempty"`
	DetachedSince   *int64          `json:"detachedSince,omitempty"`
	CancelRequested *bool           `json:"cancelRequested,omitempty"`
	DriverEpoch     *int64          `json:"driverEpoch,omitempty"`
}

// Epoch returns the driver epoch, 0 when none was ever claimed.
func (r RunRecord) Epoch() int64 {
	if r.DriverEpoch == nil {
		return 0
	}
	return *r.DriverEpoch
}

// Cancelled reports whether a cancel was requested.
func (r RunRecord) Cancelled() bool { return r.CancelRequested != nil && *r.CancelRequested }

// NewRun is the input of CreateOrResume.
type NewRun struct {
	RunID     string
	ThreadID  string
	StartedAt int64
	Status    RunStatus // "" = running
	// AppDriven marks the run as driven by the caller of the reference run store, durably
	// and for good (docs/design.md §2.2): sandkeep's claims refuse it (ErrAppDriven).
	AppDriven bool
}

// RunPatch is a partial update of a run; zero Fields are left alone.
type RunPatch struct {
	Status          Field[RunStatus]       `json:"status,omitzero"` // Clear is ErrInvalid
	FinishedAt      Field[int64]           `json:"finishedAt,omitzero"`
	Error           Field[RunError]        `json:"error,omitzero"`
	Usage           Field[json.RawMessage] `json:"usage,omitzero"`
	SandboxKey      Field[string]          `json:"sandboxKey,omitzero"`
	DetachedSince   Field[int64]           `json:"detachedSince,omitzero"`
	CancelRequested Field[bool]            `json:"cancelRequested,omitzero"`
	DriverEpoch     Field[int64]           `json:"driverEpoch,omitzero"`
}

// Check validates the patch: Status may not be cleared and must be a known status.
func (p RunPatch) Check() error {
	if p.Status.IsClear() {
		return Invalid("status", "cannot be cleared")
	}
	if st, ok := p.Status.Value(); ok {
		if _, err := ParseRunStatus(string(st)); err != nil {
			return err
		}
	}
	if u, ok := p.Usage.Value(); ok && !json.Valid(u) {
		return Invalid("usage", "not a JSON document")
	}
	return nil
}

// Empty reports whether the patch changes nothing.
func (p RunPatch) Empty() bool {
	return p.Status.IsZero() && p.FinishedAt.IsZero() && p.Error.IsZero() && p.Usage.IsZero() &&
		p.SandboxKey.IsZero() && p.DetachedSince.IsZero() && p.CancelRequested.IsZero() &&
		p.DriverEpoch.IsZero()
}

// ApplyTo returns r with the patch applied (r is not modified). The patch must be valid.
func (p RunPatch) ApplyTo(r RunRecord) RunRecord {
	if st, ok := p.Status.Value(); ok {
		r.Status = st
	}
	r.FinishedAt = p.FinishedAt.Apply(r.FinishedAt)
	r.Error = p.Error.Apply(r.Error)
	if u := p.Usage.Apply(rawPtr(r.Usage)); u != nil {
		r.Usage = append(json.RawMessage(nil), (*u)...)
	} else {
		r.Usage = nil
	}
	r.SandboxKey = p.SandboxKey.Apply(r.SandboxKey)
	r.DetachedSince = p.DetachedSince.Apply(r.DetachedSince)
	r.CancelRequested = p.CancelRequested.Apply(r.CancelRequested)
	r.DriverEpoch = p.DriverEpoch.Apply(r.DriverEpoch)
	return r
}

func rawPtr(u json.RawMessage) *json.RawMessage {
	if u == nil {
		return nil
	}
	return &u
}

// RunStore is the reference run store, scoped by the context's tenant. It is not part of
// the backend contract: refstore.Runs builds it on FencedRuns and RunWriter.
type RunStore interface {
	RunWriter
	// Get returns the run; unknown: (nil, nil). A stored unknown status is an error.
	Get(ctx context.Context, runID string) (*RunRecord, error)
	// FindActiveRun returns the thread's running run with the greatest startedAt (ties:
	// greatest runId); none: (nil, nil).
	FindActiveRun(ctx context.Context, threadID string) (*RunRecord, error)
}

// ThreadLister lists a thread's runs (reference; refstore.Runs derives it from RunLister).
type ThreadLister interface {
	// ListByThread returns every run of the thread, finished ones included, ascending
	// startedAt (ties: runId).
	ListByThread(ctx context.Context, threadID string) ([]RunRecord, error)
}

// ReclaimableLister lists the caller tenant's detached runs past a TTL (reference;
// refstore.Runs derives it from RunLister).
type ReclaimableLister interface {
	// ListReclaimable returns running runs with detachedSince <= now-ttlMs (inclusive),
	// oldest detachment first.
	ListReclaimable(ctx context.Context, now, ttlMs int64) ([]RunRecord, error)
}
