// Package wire holds the JSON documents of sandkeep's HTTP API (api/openapi.yaml): the
// request and response body of every route, the problem+json error body and its codes, and
// the API's size and wait bounds. The handlers (shared/api/httpapi) and the Go client decode
// and encode exactly these types, so the two cannot drift apart. Optional request members
// are pointers or raw documents: JSON null reads as absent.
package wire

import (
	"encoding/json"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Body limits.
const (
	MaxBodyBytes   = 256 << 10 // every JSON body but POST /events
	MaxEventsBytes = 1 << 20   // POST /v1/runs/{runId}/events
)

// Read bounds of GET /v1/runs/{runId}/events.
const (
	DefaultReadLimit = 100
	MaxReadLimit     = 1000
	MaxWaitMs        = 20_000
)

// MaxLabelLen bounds a snapshot label, in characters.
const MaxLabelLen = 256

// Empty is the body of attach, cancel and cancel-thread: an empty object (or no body).
type Empty struct{}

// StartRequest is the body of POST /v1/runs.
type StartRequest struct {
	RunID     string        `json:"runId"`
	ThreadID  string        `json:"threadId"`
	StartedAt *int64        `json:"startedAt"`
	Sandbox   *SetupRequest `json:"sandbox"`
}

// SetupRequest is the sandbox a start asks for.
type SetupRequest struct {
	ID               string          `json:"id"`
	Provider         string          `json:"provider"`
	Workspace        json.RawMessage `json:"workspace"`
	Reuse            *string         `json:"reuse"`
	SnapshotMaxAgeMs *int64          `json:"snapshotMaxAgeMs"`
	DestroyOnCancel  *bool           `json:"destroyOnCancel"`
	IdleStopMs       *int64          `json:"idleStopMs"`
}

// CursorRequest is the body of heartbeat and detach: only the driver's cursor.
type CursorRequest struct {
	Cursor string `json:"cursor"`
}

// SnapshotRequest is the body of POST /v1/runs/{runId}/snapshot.
type SnapshotRequest struct {
	Cursor string  `json:"cursor"`
	Label  *string `json:"label"`
}

// AppendRequest is the body of POST /v1/runs/{runId}/events.
type AppendRequest struct {
	Cursor string    `json:"cursor"`
	Events []EventIn `json:"events"`
}

// EventIn is one event to append.
type EventIn struct {
	Data json.RawMessage `json:"data"`
	Src  *int64          `json:"src"`
}

// FinishRequest is the body of POST /v1/runs/{runId}/finish.
type FinishRequest struct {
	Cursor string             `json:"cursor"`
	Status string             `json:"status"`
	Error  *contract.RunError `json:"error"`
	Usage  json.RawMessage    `json:"usage"`
}

// RunResponse answers get, detach, cancel, cancel-thread and finish.
type RunResponse struct {
	Run contract.RunRecord `json:"run"`
}

// ActiveRunResponse answers GET /v1/threads/{threadId}/active-run.
type ActiveRunResponse struct {
	Run *contract.RunRecord `json:"run"` // null when the thread is idle
}

// Outcome says how a start got its sandbox.
type Outcome string

// Start outcomes.
const (
	OutcomeResumed   Outcome = "resumed"
	OutcomeRestored  Outcome = "restored"
	OutcomeCreated   Outcome = "created"
	OutcomeTakenOver Outcome = "taken-over"
)

// Sandbox is the sandbox a run uses (start, attach, snapshot).
type Sandbox struct {
	Key               string `json:"key"`
	Provider          string `json:"provider"`
	ProviderSandboxID string `json:"providerSandboxId"`
	LatestSnapshotID  string `json:"latestSnapshotId,omitempty"`
}

// StartResponse answers POST /v1/runs.
type StartResponse struct {
	Run             contract.RunRecord `json:"run"`
	Sandbox         Sandbox            `json:"sandbox"`
	Outcome         Outcome            `json:"outcome"`
	DriverEpoch     int64              `json:"driverEpoch"`
	Cursor          string             `json:"cursor"`
	LeaseMs         int64              `json:"leaseMs"`
	LeaseUntil      int64              `json:"leaseUntil"`
	LastOffset      *int64             `json:"lastOffset,omitempty"`      // taken-over only
	Src             *int64             `json:"src,omitempty"`             // taken-over only
	CancelRequested *bool              `json:"cancelRequested,omitempty"` // taken-over only
}

// AttachResponse answers POST /v1/runs/{runId}/attach.
type AttachResponse struct {
	Run             contract.RunRecord `json:"run"`
	Sandbox         Sandbox            `json:"sandbox"`
	DriverEpoch     int64              `json:"driverEpoch"`
	Cursor          string             `json:"cursor,omitempty"` // only with Shipping "host"
	LastOffset      int64              `json:"lastOffset"`
	Src             int64              `json:"src"`
	CancelRequested bool               `json:"cancelRequested"`
	LeaseMs         int64              `json:"leaseMs"`
	LeaseUntil      int64              `json:"leaseUntil"`
	// Shipping: "sandbox" when a shipper in the sandbox ships the run (its live one, left
	// in charge: nothing claimed and Cursor empty; or a new one this attach started): the
	// caller only reads. "host": the caller drives the run with Cursor.
	Shipping string `json:"shipping"`
}

// SandboxResponse answers POST /v1/runs/{runId}/snapshot.
type SandboxResponse struct {
	Sandbox Sandbox `json:"sandbox"`
}

// HeartbeatResponse answers POST /v1/runs/{runId}/heartbeat.
type HeartbeatResponse struct {
	CancelRequested bool  `json:"cancelRequested"`
	LeaseUntil      int64 `json:"leaseUntil"`
}

// AppendResponse answers POST /v1/runs/{runId}/events.
type AppendResponse struct {
	Cursor          string `json:"cursor"`
	LastOffset      int64  `json:"lastOffset"`
	CancelRequested bool   `json:"cancelRequested"`
}

// ReadResponse answers GET /v1/runs/{runId}/events.
type ReadResponse struct {
	Events []contract.Event `json:"events"`
	Next   int64            `json:"next"`
	Closed bool             `json:"closed"`
}

// Bounds of the agent and pump routes.
const (
	MaxCommandBytes = 64 << 10 // an agent's shell text
	MaxEnvVars      = 256      // variables in an agent's env
	MaxPumpWaitMs   = 10_000   // a pump's wait for new journal bytes
)

// AgentRequest is the body of POST /v1/runs/{runId}/agent.
type AgentRequest struct {
	Cursor  string            `json:"cursor"`
	Command string            `json:"command"` // shell text, run under the journal wrapper
	Env     map[string]string `json:"env"`     // the agent's alone: never stored or logged
}

// AgentResponse answers POST /v1/runs/{runId}/agent.
type AgentResponse struct {
	// Launched is false when the run's agent was launched before (a retry, a second call):
	// nothing more was started.
	Launched bool `json:"launched"`
	// Shipping says who moves the agent's journal into the run's log: "sandbox" (a
	// shipper beside the agent; the caller only reads) or "host" (the caller pumps).
	Shipping string `json:"shipping"`
}

// The values of AgentResponse.Shipping.
const (
	ShippingSandbox = "sandbox"
	ShippingHost    = "host"
)

// PumpRequest is the body of POST /v1/runs/{runId}/pump.
type PumpRequest struct {
	Cursor string `json:"cursor"`
	WaitMs *int64 `json:"waitMs"` // 0..MaxPumpWaitMs, default 0
}

// PumpResponse answers POST /v1/runs/{runId}/pump.
type PumpResponse struct {
	Cursor          string `json:"cursor"`
	Appended        int    `json:"appended"`
	LastOffset      int64  `json:"lastOffset"`
	Src             int64  `json:"src"`
	Exited          bool   `json:"exited"`
	ExitCode        *int   `json:"exitCode,omitempty"` // when exited
	CancelRequested bool   `json:"cancelRequested"`
}
