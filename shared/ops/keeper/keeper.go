// Package keeper holds sandkeep's operations (docs/design.md §4) as plain Go: start (resume or
// create a sandbox), attach (takeover), heartbeat, detach, cancel, append/read/finish of
// the event log, and snapshot. The HTTP handlers and the Lambdas are thin shells over it.
package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store"
)

// ErrUnsupported: the provider lacks a capability the operation needs (HTTP 501).
var ErrUnsupported = errors.New("unsupported by the provider")

// ErrUnavailable wraps retryable infrastructure failures: lock wait timed out, throttling,
// provider transient errors (HTTP 503 with Retry-After).
var ErrUnavailable = errors.New("temporarily unavailable")

// Config configures a Keeper.
type Config struct {
	Backend   contract.Backend
	Providers []contract.Provider // selected by a setup's Provider name
	// DriverLease is the driver lease (default 60 s); drivers heartbeat every third of it.
	DriverLease time.Duration
	// ReclaimMargin is added to the driver lease before a row counts as idle enough to
	// reclaim (default 5 s: clock skew between replicas); see reclaim.go.
	ReclaimMargin time.Duration
	// ResumeTimeout and DestroyTimeout bound single provider calls (defaults 10 s / 20 s).
	ResumeTimeout  time.Duration
	DestroyTimeout time.Duration
	// CreateTimeout bounds one provider Create or Restore under the sandbox lock (default
	// 5 min): a hanging provider must not hold the lock while its lease keeps renewing.
	CreateTimeout time.Duration
	// StartWait bounds how long a retried start waits for the run's first start to record
	// its sandbox (default 5 s); past it the retry answers ErrUnavailable (503, retry).
	StartWait time.Duration
	// LaunchDeadline is how long after its creation a run may go without an agent (a
	// launch, or an event its driver appended) before whoever meets it first — pump,
	// attach, the agent route or the reaper — ends it failed with CodeAgentNotLaunched
	// (docs/design.md §4.2). 0: runs get no launch deadline (the dev server and the
	// functions default to DefaultLaunchDeadline).
	LaunchDeadline time.Duration
	Now            func() time.Time // default time.Now
	Logger         *slog.Logger     // default slog.Default()
	// Observer hears of lost leases and provider failures (metrics); nil observes nothing.
	Observer Observer
	// Wake wakes this process's long polls at this keeper's log writes (default a fresh
	// wakeset.Set; a test may disconnect it).
	Wake LogWake
	// Push is told of every log write after Wake (the deployed push; nil: none).
	Push LogPush
	// IdleStop is the deployment's idle grace, the reaper's (default DefaultIdleStop): a run
	// end moves a setup's shorter grace into the stop index by it (docs/design.md §5).
	IdleStop time.Duration
}

// Observer is told of the keeper's noteworthy failures, e.g. to count them as metrics.
// Its methods run synchronously on the request path: they must be cheap and never block.
type Observer interface {
	// LeaseLost is called once each time a start lost its sandbox lock lease.
	LeaseLost(ctx context.Context)
	// ProviderError is called once per failed provider call whose error is neither a
	// sandbox sentinel nor the caller's own cancellation.
	ProviderError(ctx context.Context, provider string, err error)
}

// Reuse says which runs share a sandbox.
type Reuse string

// Reuse values.
const (
	ReuseThread Reuse = "thread" // every run of the thread resumes one sandbox (default)
	ReuseNone   Reuse = "none"   // every run gets its own sandbox
)

// Setup describes the sandbox a run wants.
type Setup struct {
	ID               string          `json:"id"`
	Provider         string          `json:"provider"`
	Workspace        json.RawMessage `json:"workspace,omitempty"` // its "secrets" member is injected as env, never stored
	Reuse            Reuse           `json:"reuse,omitempty"`
	SnapshotMaxAgeMs int64           `json:"snapshotMaxAgeMs,omitempty"` // 0 = rows never age out
	// DestroyOnCancel: a run that ends aborted by a cancel destroys its sandbox instead of
	// leaving it to the thread (docs/design.md §5).
	DestroyOnCancel bool `json:"destroyOnCancel,omitempty"`
	// IdleStopMs is this setup's idle grace, overriding the deployment's (0 = the
	// deployment's; at least MinIdleStop otherwise).
	IdleStopMs int64 `json:"idleStopMs,omitempty"`
}

// StartInput is the input of Start.
type StartInput struct {
	RunID     string
	ThreadID  string
	StartedAt int64 // 0 = now; clamped to now ± 5 s
	Sandbox   Setup
}

// Outcome says how Start got its sandbox.
type Outcome string

// Start outcomes.
const (
	OutcomeResumed   Outcome = "resumed"
	OutcomeRestored  Outcome = "restored"
	OutcomeCreated   Outcome = "created"
	OutcomeTakenOver Outcome = "taken-over"
)

// Sandbox is the instance a run uses.
type Sandbox struct {
	Key               string `json:"key"`
	Provider          string `json:"provider"`
	ProviderSandboxID string `json:"providerSandboxId"`
	LatestSnapshotID  string `json:"latestSnapshotId,omitempty"`
}

// Driver is what a driver holds: its epoch, its log cursor and its lease.
type Driver struct {
	Epoch           int64
	Cursor          contract.Cursor
	LeaseMs         int64
	LeaseUntil      int64
	LastOffset      int64 // set on take-over/attach
	Src             int64 // highest journal position stored; set on take-over/attach
	CancelRequested bool
}

// StartResult is the result of Start.
type StartResult struct {
	Run     contract.RunRecord
	Sandbox Sandbox
	Outcome Outcome
	Driver  Driver
}

// AttachResult is the result of Attach.
type AttachResult struct {
	Run     contract.RunRecord
	Sandbox Sandbox
	Driver  Driver
	// LaunchBy is the run's pending launch deadline (ms), 0 when none (contract.RunState).
	LaunchBy int64
}

// HeartbeatResult is the result of Heartbeat.
type HeartbeatResult struct {
	CancelRequested bool
	LeaseUntil      int64
}

// ReadResult is a page of a run's log.
type ReadResult struct {
	Events []contract.Event
	Next   int64
	Closed bool
}

// FinishInput is the terminal (or interrupted) write of a driver.
type FinishInput struct {
	Status contract.RunStatus
	Error  *contract.RunError
	Usage  json.RawMessage
	// CancelRequested also sets the sticky cancel flag in the same fenced write (the
	// reaper's expiry: one write instead of two).
	CancelRequested bool
}

// Keeper runs the operations; safe for concurrent use.
type Keeper struct {
	cfg       Config
	st        store.Store // cfg.Backend behind the store layer's retry policy (storePolicy)
	providers map[string]contract.Provider
	extenders map[string]contract.LifeExtender // the providers whose sandboxes need extending (extendLife)
	drain     chan struct{}                    // closed by Drain: long polls answer what they have
	drainOnce sync.Once
}
