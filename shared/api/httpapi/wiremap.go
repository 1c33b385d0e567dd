package httpapi

import (
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
)

// The API's documents are wire's own (api/openapi.yaml); these map the operations' results
// onto them, so a change inside keeper or reaper never changes the API by itself.

func wireSandbox(s keeper.Sandbox) wire.Sandbox {
	return wire.Sandbox{Key: s.Key, Provider: s.Provider, ProviderSandboxID: s.ProviderSandboxID, LatestSnapshotID: s.LatestSnapshotID}
}

func wireRunView(v keeper.RunView) wire.RunView {
	out := wire.RunView{RunRecord: v.RunRecord, LeaseUntil: v.LeaseUntil, Lapsed: v.Lapsed}
	if s := v.Sandbox; s != nil {
		out.Sandbox = &wire.ViewSandbox{Key: s.Key, Provider: s.Provider, ProviderSandboxID: s.ProviderSandboxID, State: s.State,
			Lifecycle: s.Lifecycle, LifecycleSince: s.LifecycleSince}
	}
	return out
}

func wireSweep(s reaper.TenantSweep) wire.TenantSweep {
	r := s.Report
	out := wire.TenantSweep{Seq: s.Seq, StartedAt: s.StartedAt, Report: wire.TenantReport{
		Considered: r.Considered,
		Outcomes: wire.SweepOutcomes{Finalized: r.Outcomes.Finalized, Expired: r.Outcomes.Expired,
			Producing: r.Outcomes.Producing, Reshipped: r.Outcomes.Reshipped, Unknown: r.Outcomes.Unknown, BudgetExceeded: r.Outcomes.BudgetExceeded,
			NotClaimed: r.Outcomes.NotClaimed, Failed: r.Outcomes.Failed},
		Sandboxes: wire.SweepSandboxes{Reclaimed: r.Sandboxes.Reclaimed, Kept: r.Sandboxes.Kept, ReclaimFailed: r.Sandboxes.ReclaimFailed},
	}}
	if r.Runs != nil {
		out.Report.Runs = make([]wire.SweepRunEntry, 0, len(r.Runs))
	}
	for _, e := range r.Runs {
		out.Report.Runs = append(out.Report.Runs, wire.SweepRunEntry{Tenant: e.Tenant, RunID: e.RunID,
			Outcome: string(e.Outcome), Status: e.Status, ExitCode: e.ExitCode, Events: e.Events, Error: e.Error,
			DryRun: e.DryRun, Reclaim: e.Reclaim, Sandbox: string(e.Sandbox), Kept: e.Kept, KeptFor: e.KeptFor, RetryAt: e.RetryAt})
	}
	return out
}
