package contract

import (
	"context"
	"math"
)

// RunState is a run record plus the driver-side attributes the fenced primitives keep.
type RunState struct {
	RunRecord
	// ProviderSandboxID is the sandbox the run got at start; "" when not recorded (a run
	// started on the fast path, docs/design.md §4.1 step 2).
	ProviderSandboxID string `json:"providerSandboxId,omitempty"`
	// LeaseUntil is the end of the driver lease (ms); 0 = never leased.
	LeaseUntil int64 `json:"leaseUntil,omitempty"`
	// Lapsed: the reaper stamped detachedSince from an expired driver lease.
	Lapsed bool `json:"lapsed,omitempty"`
	// AppDriven: created through the reference run store (NewRun.AppDriven), never changed
	// after: its caller drives it, sandkeep's claims refuse it (docs/design.md §2.2).
	AppDriven bool `json:"appDriven,omitempty"`
	// LaunchBy is the run's launch deadline (ms) while no agent is known to have launched:
	// set at creation when the keeper has a launch deadline, removed (ClearLaunch) once an
	// agent launched or the driver appended an event; 0 = none pending (docs/design.md §4.2).
	LaunchBy int64 `json:"launchBy,omitempty"`
}

// CreateClaimedRun is the input of CreateClaimed: a run born holding epoch 1.
type CreateClaimedRun struct {
	NewRun
	SandboxKey        string
	ProviderSandboxID string // "" when not known yet
	LeaseUntil        int64
	LaunchBy          int64  // the launch deadline (ms); 0 = none
	Token             string // per-call token recognising a retried create
}

// ClaimCond is the extra condition of a reaper claim; the zero value is none.
type ClaimCond struct {
	// DetachedSince, when non-nil, requires detachedSince to equal *DetachedSince.
	DetachedSince *int64
	// Cutoff, when non-nil, also requires detachedSince <= *Cutoff.
	Cutoff *int64
	// Cancelled requires cancelRequested = true (the reaper's cancel path, no cutoff).
	Cancelled bool
	// LaunchBy, when non-nil, requires launchBy to equal *LaunchBy: still no agent known
	// (the reaper's agent-not-launched path; a launch recorded since refuses the claim).
	LaunchBy *int64
	// Unheld, when non-nil, requires that no driver holds the run at *Unheld (ms): it is
	// detached, or its driver lease ended by then (attach beside a shipper,
	// docs/design.md §8.3: a held run is refused with the state read, ClaimRefused).
	Unheld *int64
}

// HeldAt reports whether a driver holds st at now (ms): not detached and its lease not
// yet run out. A shipped run's lease is renewed by its shipper's requests (docs/design.md §8.3).
func (st RunState) HeldAt(now int64) bool {
	return st.DetachedSince == nil && st.LeaseUntil > now
}

// ClaimRefused is a Claim refused because its condition (If) failed: ErrConflict, with the
// run as the refusing store read it (consistently), so a caller deciding on the refusal
// needs no second read.
type ClaimRefused struct {
	State RunState
}

func (e *ClaimRefused) Error() string { return "condition failed: " + ErrConflict.Error() }
func (e *ClaimRefused) Unwrap() error { return ErrConflict }

// Holds reports whether the condition holds on st (every backend decides refusals with it).
func (c ClaimCond) Holds(st RunState) bool {
	ds := st.DetachedSince
	switch {
	case c.DetachedSince != nil && (ds == nil || *ds != *c.DetachedSince):
		return false
	case c.Cutoff != nil && (ds == nil || *ds > *c.Cutoff):
		return false
	case c.Cancelled && !st.Cancelled():
		return false
	case c.LaunchBy != nil && st.LaunchBy != *c.LaunchBy:
		return false
	case c.Unheld != nil && st.HeldAt(*c.Unheld):
		return false
	}
	return true
}

// Claim is the input of a claim: one compare-and-set bumping driverEpoch.
type Claim struct {
	Token         string // per-call token recognising a retried claim
	LeaseUntil    int64  // new driver lease end (ms)
	ClearDetached bool   // also remove detachedSince and lapsed (attach, start take-over)
	If            ClaimCond
}

// FencedRuns is the run store the operations use (docs/design.md §2.2): every driver write is fenced by
// its epoch, every write maintains the index helpers, and every conditional write
// recognises its own retried attempt by its token.
type FencedRuns interface {
	// Reads (consistent, or an index re-read before any decision).

	// State returns the run with its driver attributes (consistent read); unknown: (nil, nil).
	// A stored unknown status is an error.
	State(ctx context.Context, runID string) (*RunState, error)
	// FindActiveRun returns the thread's running run with the greatest startedAt (ties:
	// greatest runId), re-read from its item; none: (nil, nil).
	FindActiveRun(ctx context.Context, threadID string) (*RunRecord, error)
	// RunsUsingKey returns the ids of non-terminal runs stamped with sandbox key, from an
	// index that may lag: re-read each before acting on it.
	RunsUsingKey(ctx context.Context, key string) ([]string, error)

	// Claims: a run born at epoch 1, or its epoch bumped.

	// CreateClaimed creates the run holding epoch 1, a lease and in.Token in one write;
	// an existing run is returned untouched with created=false, unless it carries in.Token.
	CreateClaimed(ctx context.Context, in CreateClaimedRun) (rec RunState, created bool, err error)
	// Claim sets driverEpoch = (driverEpoch or 0)+1 and renews the lease while the run
	// exists, is not terminal and c.If holds; interrupted becomes running. Refusals:
	// ErrUnknownRun, ErrTerminalRun, ErrConflict. Returns the record after the write.
	Claim(ctx context.Context, runID string, c Claim) (RunState, error)

	// The driver's writes, fenced by its epoch.

	// UpdateFenced applies p only while driverEpoch == epoch and the run is not terminal;
	// else ErrSuperseded / ErrTerminalRun (ErrUnknownRun when absent). A retried terminal
	// write that already landed (same epoch, same terminal status) succeeds.
	UpdateFenced(ctx context.Context, runID string, epoch int64, p RunPatch) (RunState, error)
	// RecordSandbox sets providerSandboxId under the same fence as UpdateFenced.
	RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (RunState, error)
	// Heartbeat sets leaseUntil under the same fence as UpdateFenced; on a lapsed run it
	// also removes lapsed and the detachedSince the reaper stamped (never an explicit one).
	Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (RunState, error)
	// Detach sets detachedSince = now only if absent (a repeated detach never pushes expiry
	// back) and sandboxKey ("" keeps the stored key), under the same fence as UpdateFenced.
	Detach(ctx context.Context, runID string, epoch int64, sandboxKey string, now int64) (RunState, error)

	// Writes by others than the driver: the reaper's lapse, anybody's cancel.

	// Lapse stamps detachedSince = leaseUntil and lapsed only while driverEpoch and
	// leaseUntil are as read and detachedSince is absent; else ErrConflict.
	Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error
	// RequestCancel sets cancelRequested (sticky) and moves the run to the front of the
	// reclaim queue; a terminal run is returned unchanged; unknown: ErrUnknownRun.
	RequestCancel(ctx context.Context, runID string) (RunState, error)
	// ClearLaunch removes launchBy (an agent launched, or the driver appended an event):
	// unfenced, as whoever confirms a launch may say so and it is never untrue later; a
	// terminal run or one without launchBy is returned unchanged; unknown: ErrUnknownRun.
	ClearLaunch(ctx context.Context, runID string) (RunState, error)
}

// DefaultDriverLease is the default driver lease (docs/design.md §4.2); drivers heartbeat every third.
const DefaultDriverLease = 60_000 // ms

// LeaseReclaimAt is the reclaimAt of a lease ending at leaseEnd (ms): leaseEnd rounded up to
// a whole driver lease (driverLeaseMs, the step; leaseEnd as it is when not positive), never
// earlier than leaseEnd, saturating at the largest int64. A driver renews every third (hosts)
// or half (ship answers) of its lease, so at least half the renewals leave reclaimAt, and
// with it the reclaim index, as it was; the reaper meets a lapsed lease at most one lease later (docs/design.md §2.2).
func LeaseReclaimAt(leaseEnd, driverLeaseMs int64) int64 {
	if driverLeaseMs <= 0 {
		return leaseEnd
	}
	r := leaseEnd % driverLeaseMs
	switch {
	case r <= 0: // a whole step, or below zero (the remainder's sign rounds toward zero: up)
		return leaseEnd - r
	case leaseEnd > math.MaxInt64-(driverLeaseMs-r):
		return math.MaxInt64
	}
	return leaseEnd + driverLeaseMs - r
}

// ReclaimAt is the reclaim-candidate index value of a run (docs/design.md §3): present only while
// running; 0 when cancelled, else detachedSince when detached, else leaseUntil, else
// startedAt + the driver lease, a lease's end rounded up to a whole driver lease
// (LeaseReclaimAt); an app-driven run only while detached, at detachedSince.
// A pending launch deadline (launchBy) earlier than that comes first, so neither
// heartbeats nor a detach keep a run with no agent from the reaper past it. Every
// backend derives its index from this one function, and the reaper's re-read decides by
// it too (never by the index value alone).
func ReclaimAt(s RunState, driverLeaseMs int64) (at int64, indexed bool) {
	switch {
	case s.Status != StatusRunning:
		return 0, false
	case s.AppDriven:
		// No driver lease and no sandkeep cancel path: only a detached one is a candidate,
		// for the reference's ListReclaimable (the reaper leaves it to its app).
		if s.DetachedSince == nil {
			return 0, false
		}
		return *s.DetachedSince, true
	case s.Cancelled():
		return 0, true
	case s.DetachedSince != nil:
		at = *s.DetachedSince
	case s.LeaseUntil > 0:
		at = LeaseReclaimAt(s.LeaseUntil, driverLeaseMs)
	default:
		at = LeaseReclaimAt(s.StartedAt+driverLeaseMs, driverLeaseMs)
	}
	if s.LaunchBy > 0 && s.LaunchBy < at {
		at = s.LaunchBy
	}
	return at, true
}
