package reaper

import (
	"context"
	"fmt"
	"strconv"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

// Decision is what a sweep does with one candidate run, decided by Classify from reads
// only: the run re-read under its tenant, its instance row, and (when it is not expired)
// its journal probed. Act carries it out; a dry run reports it instead.
type Decision struct {
	Candidate contract.Candidate
	// Outcome is what acting aims at: Finalized or Expired (the run is ended), Producing
	// or Unknown (left alone), Failed (classification failed); "" when the hit no longer
	// qualifies (a lagging index, a heartbeat that came back): nothing to do.
	Outcome Outcome
	// Lapse: the run is not detached and its driver lease ran out; acting first turns
	// the lapse into a detach since the lease end (the decision is made as if it had).
	Lapse bool
	// Probed: the journal was probed (counted in the report).
	Probed bool
	// Reship: the agent is producing and the run's shipper is dead (docs/design.md §8.3):
	// acting claims the run and starts a new shipper (Outcome Reshipped).
	Reship bool
	// NotLaunched: the run missed its launch deadline (agentrun.CheckLaunch): acting ends it
	// failed with keeper.CodeAgentNotLaunched (Outcome Expired). ClearLaunch: its launch
	// marker is stale (an agent is there); acting clears it.
	NotLaunched, ClearLaunch bool

	entry  RunEntry          // the report line so far (exit code, probe error)
	read   contract.RunState // the run as re-read (the lapse is conditioned on it)
	st     contract.RunState // as the decision sees it (after the lapse, when Lapse)
	pl     place             // where its sandbox is
	cutoff int64             // now - TTL: an expiry's claim condition
}

// Classify re-reads candidate c and decides now, from reads only, what a sweep does with
// it (Decision). It writes nothing and never starts a stopped sandbox.
func (r *Reaper) Classify(ctx context.Context, c contract.Candidate) Decision {
	return r.classify(ctx, c, r.kc.Now().UnixMilli())
}

// classify is Classify at the sweep's now.
func (r *Reaper) classify(ctx context.Context, c contract.Candidate, now int64) Decision {
	tctx := contract.WithTenant(ctx, c.Tenant)
	d := Decision{Candidate: c, entry: RunEntry{Tenant: c.Tenant, RunID: c.RunID}}
	fail := func(err error) Decision {
		d.Outcome, d.entry.Outcome, d.entry.Error = Failed, Failed, err.Error()
		r.kc.Logger.ErrorContext(ctx, "reap: sweeping run failed", "tenant", c.Tenant, "runId", c.RunID, "err", err)
		return d
	}
	st, err := r.st.Runs().State(tctx, c.RunID)
	if err != nil {
		return fail(fmt.Errorf("re-read: %w", err))
	}
	if st == nil || st.Status != contract.StatusRunning {
		return d
	}
	if st.AppDriven {
		// Its app drives and finalizes it (docs/design.md §5): listed for the app's own
		// reaper while detached, never finalized, expired or claimed here.
		return d
	}
	if at, ok := contract.ReclaimAt(*st, r.kc.DriverLease.Milliseconds()); !ok || at > now {
		return d
	}
	d.read = *st
	if r.k.LaunchOverdue(*st) && !st.Cancelled() {
		if done, nd := r.classifyLaunch(tctx, &d, *st, now); done {
			return nd
		}
		st.LaunchBy = 0 // an agent is there: classified as if the marker were cleared
		if at, _ := contract.ReclaimAt(*st, r.kc.DriverLease.Milliseconds()); at > now {
			return d
		}
	}
	if st.DetachedSince == nil {
		// Not detached: its driver lease lapsed (or it is cancelled with a live driver,
		// which ends it itself). A never-leased run has no lease to lapse.
		if st.LeaseUntil == 0 || st.LeaseUntil > now {
			return d
		}
		lu := st.LeaseUntil
		st.DetachedSince, st.Lapsed, d.Lapse = &lu, true, true
	}
	d.st = *st
	d.cutoff = now - r.cfg.DetachedRunTTL.Milliseconds()
	expired := *st.DetachedSince <= d.cutoff || st.Cancelled()
	if d.pl, err = r.locate(tctx, *st); err != nil {
		return fail(fmt.Errorf("locate sandbox: %w", err))
	}
	if !expired && !d.pl.gone {
		d.Probed = true
		pctx, cancel := context.WithTimeout(tctx, r.runBudget(tctx))
		pr := r.probe(pctx, &d.pl, c.RunID)
		cancel()
		switch {
		case d.pl.gone:
			// Status confirmed the sandbox gone: expire it below.
		case pr.State == journal.Producing && r.shipperDead(tctx, &d.pl, c.RunID):
			d.Outcome, d.Reship = Reshipped, true
			return d
		case pr.State == journal.Producing:
			d.Outcome, d.entry.Outcome = Producing, Producing
			return d
		case pr.State != journal.Finished:
			d.Outcome, d.entry.Outcome = Unknown, Unknown
			if pr.Err != nil {
				d.entry.Error = pr.Err.Error()
			}
			return d
		default:
			code := pr.ExitCode
			d.Outcome, d.entry.ExitCode = Finalized, &code
			return d
		}
	}
	d.Outcome = Expired
	return d
}

// shipperDead reports a run whose shipper died while its agent runs: the reaper can start a
// new one (Config.Ship), the sandbox has the run's shipper pid file, and it names no live
// process. A failed probe is not dead: the run is left alone as producing.
func (r *Reaper) shipperDead(ctx context.Context, pl *place, runID string) bool {
	ex, ok := pl.prov.(contract.Executor)
	if r.cfg.Ship == nil || r.cfg.Ship.URL == "" || !ok {
		return false
	}
	s, err := agentrun.ShipperOf(ctx, ex, pl.psid, r.cfg.JournalDir, runID)
	if err != nil {
		r.kc.Logger.WarnContext(ctx, "reap: the shipper probe failed", "runId", runID, "err", err)
	}
	return err == nil && s == agentrun.ShipperDead
}

// tally counts what classifying d found: a hit that no longer qualifies, a probe.
func (r *Reaper) tally(rep *Report, d Decision) {
	if d.Outcome == "" {
		rep.Swept.Stale++
	}
	if d.Probed {
		rep.Probed++
	}
}

// locate reads the run's instance row (consistently) and names its sandbox; a row missing,
// tombstoned or naming another sandbox means the run's sandbox is gone.
func (r *Reaper) locate(ctx context.Context, st contract.RunState) (place, error) {
	if st.SandboxKey == nil {
		return place{psid: st.ProviderSandboxID, why: "the run has no sandbox key"}, nil
	}
	pl := place{key: *st.SandboxKey, psid: st.ProviderSandboxID}
	row, err := r.st.Instances().GetRow(ctx, pl.key)
	if err != nil {
		return place{}, err
	}
	switch {
	case row == nil:
		pl.gone, pl.why = true, "no instance row"
	case row.Reclaiming != "":
		pl.gone, pl.why = true, "instance row is being reclaimed"
	case pl.psid != "" && row.ProviderSandboxID != pl.psid:
		pl.gone, pl.why = true, "instance row names another sandbox"
	default:
		pl.row = row
		pl.psid = row.ProviderSandboxID
		pl.prov = r.providers[row.Provider]
		if pl.prov == nil {
			pl.why = "no provider named " + strconv.Quote(row.Provider)
		}
	}
	return pl, nil
}

// probe asks the journal whether the agent finished, reading only: a stopped sandbox is
// never started (unknown); Status gone marks pl gone. ctx bounds its provider calls.
func (r *Reaper) probe(ctx context.Context, pl *place, runID string) journal.ProbeResult {
	unknown := func(format string, args ...any) journal.ProbeResult {
		return journal.ProbeResult{State: journal.Unknown, Err: fmt.Errorf(format, args...)}
	}
	if pl.prov == nil {
		return unknown("probe: %s", pl.why)
	}
	sr, ok1 := pl.prov.(contract.StatusReader)
	ex, ok2 := pl.prov.(contract.Executor)
	if !ok1 || !ok2 {
		return unknown("probe: provider %s cannot read status and run commands", pl.prov.Name())
	}
	s, err := sr.Status(ctx, pl.psid)
	switch {
	case err != nil:
		return unknown("probe: status: %w", err)
	case s == contract.SandboxGone:
		pl.gone, pl.why = true, "the provider reports the sandbox gone"
		return unknown("probe: sandbox gone")
	case s != contract.SandboxAlive:
		return unknown("probe: sandbox is %s; a probe never starts it", s)
	}
	return journal.Probe(ctx, ex, pl.psid, r.cfg.JournalDir, runID)
}

// classifyLaunch applies the launch rule (agentrun.CheckLaunch) to a run past its launch
// deadline with no agent known: done with the decision when the launch was missed (or the
// check failed); otherwise d notes the stale marker and classification goes on.
func (r *Reaper) classifyLaunch(ctx context.Context, d *Decision, st contract.RunState, now int64) (bool, Decision) {
	pl, err := r.locate(ctx, st)
	if err != nil {
		d.Outcome, d.entry.Outcome, d.entry.Error = Failed, Failed, "locate sandbox: "+err.Error()
		return true, *d
	}
	var ex contract.Executor
	if !pl.gone {
		ex, _ = pl.prov.(contract.Executor)
	}
	ls, err := agentrun.CheckLaunch(ctx, r.k, ex, pl.psid, r.cfg.JournalDir, st)
	switch {
	case err != nil:
		d.Outcome, d.entry.Outcome, d.entry.Error = Failed, Failed, "launch check: "+err.Error()
		r.kc.Logger.ErrorContext(ctx, "reap: the launch check failed", "runId", st.RunID, "err", err)
		return true, *d
	case ls == agentrun.LaunchMissed:
		d.st, d.pl, d.NotLaunched, d.Outcome = st, pl, true, Expired
		return true, *d
	}
	d.ClearLaunch = true
	return false, *d
}
