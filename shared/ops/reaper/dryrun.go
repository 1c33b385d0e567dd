package reaper

import (
	"context"
	"strconv"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// The housekeeping kinds of a dry run's plan.
const (
	PlanPendingReclaim  = "pending-reclaim"  // a tombstoned row whose destroy is to be retried
	PlanIdleInstance    = "idle-instance"    // a row past the instance retention
	PlanDeferredReclaim = "deferred-reclaim" // a reclaim an earlier sweep deferred, now due
	PlanStaleIntent     = "stale-intent"     // an intent older than the lock lease
	PlanIdleStop        = "idle-stop"        // a row idle past the grace (docs/design.md §5)
)

// The actions a dry run says a sweep would take.
const (
	ActDestroyAndDelete = "destroy-and-delete" // destroy the sandbox, delete the row
	ActKeepInUse        = "keep-in-use"        // a non-terminal run uses the sandbox (or its row was touched recently)
	ActDropIntent       = "drop-intent"        // the row names the intent's sandbox, or none is left
	ActDestroyOrphan    = "destroy-orphan"     // destroy the intent's unrecorded sandbox, then drop the intent
	ActNone             = "none"               // nothing can be done (Why says why)
	ActStopIfIdle       = "stop-if-idle"       // stop the sandbox unless the locked re-check finds a live run
	ActKeepIdleStop     = "keep-idle-stop"     // an ended run's sandbox stays for the thread (stopped after the grace)
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

// planning is a dry run's executor: it reports what acting on each decision would do and
// writes nothing.
type planning struct{ *Reaper }

// run is a dry run's entry for d: the outcome acting aims at, and for a run acting would
// end (marked dryRun) what the reclaim that follows would do with its sandbox (Reclaim:
// the in-use check, reads only, and the tombstone's recency condition; a real sweep reports
// such a sandbox kept). A lapse is not counted: none was written.
func (p planning) run(ctx context.Context, d Decision, _ *Report) (*RunEntry, *keptSandbox) {
	if d.Outcome == "" {
		return nil, nil
	}
	e := d.entry
	if d.Outcome != Finalized && d.Outcome != Expired {
		return &e, nil
	}
	e.Outcome, e.DryRun = d.Outcome, true
	if d.Outcome == Finalized {
		e.Status = string(contract.StatusCompleted)
		if *e.ExitCode != 0 {
			e.Status = string(contract.StatusFailed)
		}
	}
	if d.pl.gone || d.pl.row == nil {
		return &e, nil
	}
	// An expired cancelled run ends aborted with the cancel flag (as the sweep writes it).
	ended := d.st.RunRecord
	if d.Outcome == Expired && d.st.Cancelled() {
		ended.Status = contract.StatusAborted
	}
	if !keeper.DestroysOnEnd(d.pl.row, ended) {
		e.Reclaim = ActKeepIdleStop
		return &e, nil
	}
	pl := p.planReclaim(contract.WithTenant(ctx, d.Candidate.Tenant), "", "", d.pl.row, d.Candidate.RunID)
	e.Reclaim, e.Error = pl.Action, pl.Why
	return &e, nil
}

// chore reports what a sweep would do with c in the report's Planned list (the deletion of
// superseded snapshots and the clearing of a listing are not reported).
func (p planning) chore(ctx context.Context, c chore, rep *Report) {
	pl := Planned{Tenant: c.tenant, Key: c.key, Action: ActDestroyAndDelete}
	switch c.kind {
	case finishTombstone:
		pl.Kind, pl.ProviderSandboxID = PlanPendingReclaim, c.row.ProviderSandboxID
	case noProvider:
		pl.Kind, pl.ProviderSandboxID = PlanPendingReclaim, c.row.ProviderSandboxID
		pl.Action, pl.Why = ActNone, "no provider named "+strconv.Quote(c.row.Provider)
	case reclaimDeferred:
		pl = p.planReclaim(ctx, PlanDeferredReclaim, c.tenant, c.row, "")
	case reclaimIdle:
		pl = p.planReclaim(ctx, PlanIdleInstance, c.tenant, c.row, "")
	case stopIdle:
		pl.Kind, pl.Action = PlanIdleStop, ActStopIfIdle
	case resolveStaleIntent:
		// Read without the lock: the plan is what a sweep holding it would find now.
		pl = p.planStaleIntent(ctx, contract.IntentRef{Tenant: c.tenant, Key: c.key})
	default:
		return
	}
	rep.Planned = append(rep.Planned, pl)
}

// planReclaim is a dry run's word on reclaiming row (keeper.PlanReclaim, reads only): keep
// it (in use, or touched too recently), none (nothing can be done) or destroy it and
// delete the row.
func (r *Reaper) planReclaim(ctx context.Context, kind, tenant string, row *contract.InstanceRow, except string) Planned {
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
func (r *Reaper) planStaleIntent(ctx context.Context, ref contract.IntentRef) Planned {
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
