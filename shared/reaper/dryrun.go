package reaper

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// The housekeeping kinds of a dry run's plan.
const (
	PlanPendingReclaim  = "pending-reclaim"  // a tombstoned row whose destroy is to be retried
	PlanIdleInstance    = "idle-instance"    // a row past the instance retention
	PlanDeferredReclaim = "deferred-reclaim" // a reclaim an earlier sweep deferred, now due
	PlanStaleIntent     = "stale-intent"     // an intent older than the lock lease
)

// The actions a dry run says a sweep would take.
const (
	ActDestroyAndDelete = "destroy-and-delete" // destroy the sandbox, delete the row
	ActKeepInUse        = "keep-in-use"        // a non-terminal run uses the sandbox (or its row was touched recently)
	ActDropIntent       = "drop-intent"        // the row names the intent's sandbox, or none is left
	ActDestroyOrphan    = "destroy-orphan"     // destroy the intent's unrecorded sandbox, then drop the intent
	ActNone             = "none"               // nothing can be done (Why says why)
)

// Planned is one housekeeping action a dry run found a sweep would take now.
type Planned struct {
	Kind              string `json:"kind"`
	Tenant            string `json:"tenant"`
	Key               string `json:"key"`
	ProviderSandboxID string `json:"providerSandboxId,omitempty"`
	Action            string `json:"action"`
	Why               string `json:"why,omitempty"`
}

// predict is a dry run's entry for a candidate the sweep would end with outcome o; its
// Reclaim says what the reclaim that follows would do with the sandbox (the in-use check,
// reads only, and the tombstone's recency condition): a real sweep reports a kept sandbox
// as the outcome in-use.
func (r *Reaper) predict(ctx context.Context, runID string, pl place, o Outcome, e *RunEntry) *RunEntry {
	e.Outcome, e.DryRun = o, true
	if o == Finalized && e.ExitCode != nil {
		e.Status = string(sandbox.StatusCompleted)
		if *e.ExitCode != 0 {
			e.Status = string(sandbox.StatusFailed)
		}
	}
	if pl.gone || pl.row == nil {
		return e
	}
	p := r.planReclaim(ctx, "", "", pl.row, runID)
	e.Reclaim, e.Error = p.Action, p.Why
	return e
}

// planReclaim is a dry run's word on reclaiming row (keeper.PlanReclaim, reads only): keep
// it (in use, or touched too recently), none (nothing can be done) or destroy it and
// delete the row.
func (r *Reaper) planReclaim(ctx context.Context, kind, tenant string, row *sandbox.InstanceRow, except string) Planned {
	p := Planned{Kind: kind, Tenant: tenant, Key: row.Key, ProviderSandboxID: row.ProviderSandboxID, Action: ActDestroyAndDelete}
	switch rp := r.k.PlanReclaim(ctx, row, except); {
	case rp.Err != nil:
		p.Action, p.Why = ActNone, rp.Err.Error()
	case rp.Kept == keeper.KeptInUse:
		p.Action, p.Why = ActKeepInUse, "a non-terminal run is stamped with the key"
	case rp.Kept == keeper.KeptTouched:
		p.Action, p.Why = ActKeepInUse, "the row was touched too recently (a later sweep retries)"
	}
	return p
}

// planStaleIntent decides from reads only what resolving a stale intent would do.
func (r *Reaper) planStaleIntent(ctx context.Context, ref sandbox.IntentRef) Planned {
	p := Planned{Kind: PlanStaleIntent, Tenant: ref.Tenant, Key: ref.Key, Action: ActDropIntent}
	ip, err := r.planIntent(ctx, ref.Key)
	switch {
	case err != nil:
		p.Action, p.Why = ActNone, err.Error()
	case ip.in == nil:
		p.Action, p.Why = ActNone, "the intent is gone"
	case ip.orphan != "":
		p.Action, p.ProviderSandboxID = ActDestroyOrphan, ip.orphan
	default:
		p.ProviderSandboxID = ip.in.ProviderSandboxID
	}
	return p
}
