package reaper

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// ForceFinish is the operator's `runs finish --force <id>` in ctx's tenant, through k and
// the journals in journalDir ("" = the provider's): it claims a new epoch (whoever drives
// is superseded), kills the agent when its sandbox is reachable, writes aborted with code
// "forced" and closes the log, leaving the thread's sandbox to the idle stop (a one-run
// sandbox goes with its run), as a sweep ends an expired run. Refusals: ErrUnknownRun, ErrTerminalRun. It needs no sweep (no TTL,
// no sweep lock): the claim alone fences every other writer out.
func ForceFinish(ctx context.Context, k *keeper.Keeper, journalDir, runID string) (RunEntry, error) {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return RunEntry{RunID: runID}, fmt.Errorf("reaper: force finish %q: %w", runID, err)
	}
	r := newReaper(Config{Keeper: k, JournalDir: journalDir})
	e := RunEntry{Tenant: tenant, RunID: runID}
	st, err := r.st.Runs().State(ctx, runID)
	switch {
	case err != nil:
		return e, fmt.Errorf("reaper: force finish %q: %w", runID, err)
	case st == nil:
		return e, fmt.Errorf("reaper: force finish %q: %w", runID, contract.ErrUnknownRun)
	case st.Status.Terminal():
		return e, fmt.Errorf("reaper: force finish %q: %w", runID, contract.ErrTerminalRun)
	}
	cl, ok, err := r.claim(ctx, runID, contract.ClaimCond{}, &e)
	if err != nil {
		return e, fmt.Errorf("reaper: force finish %q: %w", runID, err)
	}
	if !ok {
		return e, fmt.Errorf("reaper: force finish %q: %s: %w", runID, e.Error, contract.ErrTerminalRun)
	}
	pl, err := r.locate(ctx, *st)
	if err != nil {
		return e, fmt.Errorf("reaper: force finish %q: %w", runID, err)
	}
	// The agent is killed once the terminal write landed (end), as on the expiry path.
	in := keeper.FinishInput{Status: contract.StatusAborted, Error: &contract.RunError{Message: "finished by an operator", Code: "forced"}}
	out, _ := r.end(ctx, *st, pl, cl.cur, in, true, Expired, &e)
	if out.Outcome == Failed || out.Outcome == NotClaimed {
		return *out, fmt.Errorf("reaper: force finish %q: %s", runID, out.Error)
	}
	return *out, nil
}

// StuckRun is a non-terminal run whose driver lease lapsed, or that is detached or cancelled.
type StuckRun struct {
	Tenant    string            `json:"tenant"`
	ReclaimAt int64             `json:"reclaimAt"`
	Run       contract.RunState `json:"run"`
}

// Stuck lists up to limit stuck runs across tenants (`runs list --stuck`), oldest reclaimAt
// first (cancelled runs have 0); every index hit is re-read and kept only if it qualifies.
func Stuck(ctx context.Context, b contract.Backend, now, driverLeaseMs int64, limit int) ([]StuckRun, error) {
	cands, err := b.Reaper().ReclaimCandidates(ctx, now, limit)
	if err != nil {
		return nil, fmt.Errorf("reaper: list stuck runs: %w", err)
	}
	out := []StuckRun{}
	var errs []error
	for _, c := range cands {
		tctx := contract.WithTenant(ctx, c.Tenant)
		st, err := b.Runs().State(tctx, c.RunID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st == nil {
			continue
		}
		if at, ok := contract.ReclaimAt(*st, driverLeaseMs); ok && at <= now {
			out = append(out, StuckRun{Tenant: c.Tenant, ReclaimAt: at, Run: *st})
		}
	}
	return out, errors.Join(errs...)
}
