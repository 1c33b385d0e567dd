package reaper

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep/shared/driver"
	"github.com/sandkeep/sandkeep/shared/journal"
	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// terminalTimeout bounds the terminal write, close and reclaim of a run whose budget ran
// out: they run on a context detached from the budget, so a claimed run is never left
// half-ended merely because its replay was slow.
const terminalTimeout = 20 * time.Second

// keptSandbox is a sandbox a sweep left standing for another run; its journal directory
// may hold journals of runs that ended.
type keptSandbox struct {
	tenant, provider, psid string
}

// place is where a run's sandbox is, as far as the instance row and provider say.
type place struct {
	key  string
	psid string
	prov sandbox.Provider
	row  *sandbox.InstanceRow // as read once per run; the reclaim's tombstone is conditioned on it
	gone bool                 // confirmed: the row is missing, tombstoned or names another sandbox
	why  string               // why gone, or why the probe cannot run
}

// handle re-reads candidate c under its tenant and acts on it; nil when the hit no longer
// qualifies (a lagging index, a heartbeat that came back).
func (r *Reaper) handle(ctx context.Context, c sandbox.Candidate, now int64, rep *Report) (*RunEntry, *keptSandbox) {
	tctx := sandbox.WithTenant(ctx, c.Tenant)
	e := &RunEntry{Tenant: c.Tenant, RunID: c.RunID}
	fail := func(err error) (*RunEntry, *keptSandbox) {
		e.Outcome, e.Error = Failed, err.Error()
		r.kc.Logger.ErrorContext(ctx, "reap: sweeping run failed", "tenant", c.Tenant, "runId", c.RunID, "err", err)
		return e, nil
	}
	st, err := retry(tctx, func() (*sandbox.RunState, error) { return r.kc.Backend.Runs().State(tctx, c.RunID) })
	if err != nil {
		return fail(fmt.Errorf("re-read: %w", err))
	}
	if st == nil || st.Status != sandbox.StatusRunning {
		rep.Swept.Stale++
		return nil, nil
	}
	if at, ok := sandbox.ReclaimAt(*st, r.kc.DriverLease.Milliseconds()); !ok || at > now {
		rep.Swept.Stale++
		return nil, nil
	}
	if st.DetachedSince == nil {
		// Not detached: its driver lease lapsed (or it is cancelled with a live driver,
		// which ends it itself). A never-leased run has no lease to lapse.
		if st.LeaseUntil == 0 || st.LeaseUntil > now {
			rep.Swept.Stale++
			return nil, nil
		}
		if r.cfg.BeforeAct != nil {
			r.cfg.BeforeAct(tctx, c, *st)
		}
		if !r.cfg.DryRun {
			err := retry0(tctx, func() error {
				return r.kc.Backend.Runs().Lapse(tctx, c.RunID, st.Epoch(), st.LeaseUntil)
			})
			if errors.Is(err, sandbox.ErrConflict) {
				// Re-read first (docs/design.md §2.1): a retry whose first attempt landed finds the very
				// lapse it asked for (one sweep at a time, so it was this one).
				if mine, rerr := r.lapsedAsAsked(tctx, *st); rerr != nil {
					return fail(fmt.Errorf("lapse: re-read: %w", rerr))
				} else if !mine {
					rep.Swept.Stale++ // a heartbeat, detach or claim got there first
					return nil, nil
				}
				err = nil
			}
			if err != nil {
				return fail(fmt.Errorf("lapse: %w", err))
			}
			rep.Swept.Lapsed++
		}
		lu := st.LeaseUntil
		st.DetachedSince, st.Lapsed = &lu, true
	} else if r.cfg.BeforeAct != nil {
		r.cfg.BeforeAct(tctx, c, *st)
	}
	ds := *st.DetachedSince
	cutoff := now - r.cfg.DetachedRunTTL.Milliseconds()
	expired := ds <= cutoff || st.Cancelled()
	pl, err := r.locate(tctx, *st)
	if err != nil {
		return fail(fmt.Errorf("locate sandbox: %w", err))
	}
	if !expired && !pl.gone {
		rep.Probed++
		pctx, cancel := context.WithTimeout(tctx, r.runBudget(tctx))
		pr := r.probe(pctx, &pl, c.RunID)
		cancel()
		switch {
		case pl.gone:
			// Status confirmed the sandbox gone: expire it below.
		case pr.State == journal.Producing:
			e.Outcome = Producing
			return e, nil
		case pr.State != journal.Finished:
			e.Outcome = Unknown
			if pr.Err != nil {
				e.Error = pr.Err.Error()
			}
			return e, nil
		default:
			code := pr.ExitCode
			e.ExitCode = &code
			if r.cfg.DryRun {
				return r.predict(tctx, c.RunID, pl, Finalized, e), nil
			}
			return r.finalize(tctx, *st, pl, code, e)
		}
	}
	if r.cfg.DryRun {
		return r.predict(tctx, c.RunID, pl, Expired, e), nil
	}
	return r.expire(tctx, *st, pl, cutoff, e)
}

// lapsedAsAsked re-reads a run whose lapse was refused and reports whether it stands
// exactly as that lapse would leave it: same epoch, lapsed, detached since the lease end.
func (r *Reaper) lapsedAsAsked(ctx context.Context, asked sandbox.RunState) (bool, error) {
	cur, err := retry(ctx, func() (*sandbox.RunState, error) { return r.kc.Backend.Runs().State(ctx, asked.RunID) })
	if err != nil || cur == nil {
		return false, err
	}
	return cur.Status == sandbox.StatusRunning && cur.Epoch() == asked.Epoch() && cur.Lapsed &&
		cur.DetachedSince != nil && *cur.DetachedSince == asked.LeaseUntil, nil
}

// locate reads the run's instance row (consistently) and names its sandbox; a row missing,
// tombstoned or naming another sandbox means the run's sandbox is gone.
func (r *Reaper) locate(ctx context.Context, st sandbox.RunState) (place, error) {
	if st.SandboxKey == nil {
		return place{psid: st.ProviderSandboxID, why: "the run has no sandbox key"}, nil
	}
	pl := place{key: *st.SandboxKey, psid: st.ProviderSandboxID}
	row, err := retry(ctx, func() (*sandbox.InstanceRow, error) { return r.kc.Backend.Instances().GetRow(ctx, pl.key) })
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
	sr, ok1 := pl.prov.(sandbox.StatusReader)
	ex, ok2 := pl.prov.(sandbox.Executor)
	if !ok1 || !ok2 {
		return unknown("probe: provider %s cannot read status and run commands", pl.prov.Name())
	}
	s, err := sr.Status(ctx, pl.psid)
	switch {
	case err != nil:
		return unknown("probe: status: %w", err)
	case s == sandbox.SandboxGone:
		pl.gone, pl.why = true, "the provider reports the sandbox gone"
		return unknown("probe: sandbox gone")
	case s != sandbox.SandboxAlive:
		return unknown("probe: sandbox is %s; a probe never starts it", s)
	}
	return journal.Probe(ctx, ex, pl.psid, r.cfg.JournalDir, runID)
}

// claimed is a run the reaper holds: its epoch and log cursor.
type claimed struct {
	st  sandbox.RunState
	cur sandbox.Cursor
}

// claim bumps the run's epoch under cond (one CAS; a refusal writes nothing) and fences its
// log, through the keeper's claim sequence (a closed log on a live run is repaired there).
// ok=false: not claimed (the entry says why).
func (r *Reaper) claim(ctx context.Context, runID string, cond sandbox.ClaimCond, e *RunEntry) (claimed, bool, error) {
	st, fence, err := r.k.ClaimFenced(ctx, runID, false, cond)
	switch {
	case errors.Is(err, sandbox.ErrConflict), errors.Is(err, sandbox.ErrTerminalRun),
		errors.Is(err, sandbox.ErrUnknownRun), errors.Is(err, sandbox.ErrSuperseded):
		e.Outcome, e.Error = NotClaimed, err.Error()
		return claimed{}, false, nil
	case err != nil:
		return claimed{}, false, fmt.Errorf("claim: %w", err)
	}
	return claimed{st: st, cur: fence.Cursor}, true, nil
}

// finalize ends a run that finished while detached: claim (on the listed detachedSince),
// replay the journal from the log's highest Src, end it from the exit code, reclaim.
func (r *Reaper) finalize(ctx context.Context, st sandbox.RunState, pl place, code int, e *RunEntry) (*RunEntry, *keptSandbox) {
	ds := *st.DetachedSince
	cl, ok, err := r.claim(ctx, st.RunID, sandbox.ClaimCond{DetachedSince: &ds}, e)
	if err != nil || !ok {
		return r.failIf(ctx, e, err), nil
	}
	ex := pl.prov.(sandbox.Executor)
	bctx, cancel := context.WithTimeout(ctx, r.runBudget(ctx))
	defer cancel()
	end, n, cur, err := r.replay(bctx, ex, pl.psid, st.RunID, cl.cur)
	e.Events = n
	switch {
	case errors.Is(err, sandbox.ErrSuperseded), errors.Is(err, sandbox.ErrLogClosed):
		e.Outcome, e.Error = NotClaimed, err.Error()
		return e, nil
	case err != nil && bctx.Err() != nil && ctx.Err() == nil:
		// The rest is replayed by the next sweep from the log's highest Src: nothing is lost
		// or doubled, so a slow replay is a diagnostic, not a reason to abort the run.
		e.Outcome, e.Error = BudgetExceeded, err.Error()
		return e, nil
	case err != nil:
		return r.failIf(ctx, e, fmt.Errorf("replay: %w", err)), nil
	case !end.Finished:
		return r.failIf(ctx, e, errors.New("replay: the journal ended without the sentinel the probe saw")), nil
	}
	in := keeper.FinishInput{Status: sandbox.StatusCompleted}
	if code != 0 {
		in = keeper.FinishInput{Status: sandbox.StatusFailed, Error: r.exitError(ctx, ex, pl.psid, st.RunID, code)}
	}
	return r.end(ctx, st, pl, cur, in, false, Finalized, e)
}

// expire ends a run detached past the TTL, cancelled, or whose sandbox is gone: claim (a
// returning viewer wins), deliver what the journal holds, end it aborted (or from the
// sentinel when it was there) with cancelRequested set in that same fenced write, kill the
// agent, reclaim.
//
// The claim fences every other driver out (its next append or heartbeat is superseded), so
// the sticky cancel flag needs no write of its own before the replay: it rides on the
// terminal write (one UpdateItem on DynamoDB instead of a read and a put). The agent is
// killed only after that write landed: a viewer who takes the run over while the journal
// is read supersedes the reaper's writes and keeps a live agent.
func (r *Reaper) expire(ctx context.Context, st sandbox.RunState, pl place, cutoff int64, e *RunEntry) (*RunEntry, *keptSandbox) {
	ds := *st.DetachedSince
	cond := sandbox.ClaimCond{DetachedSince: &ds}
	switch {
	case st.Cancelled():
		cond.Cancelled = true
	case !pl.gone:
		cond.Cutoff = &cutoff
	}
	cl, ok, err := r.claim(ctx, st.RunID, cond, e)
	if err != nil || !ok {
		return r.failIf(ctx, e, err), nil
	}
	reason := sandbox.RunError{Message: "detached longer than the TTL", Code: "expired"}
	if st.Cancelled() {
		reason = sandbox.RunError{Message: "cancelled", Code: "cancelled"}
	}
	in := keeper.FinishInput{Status: sandbox.StatusAborted, Error: &reason, CancelRequested: true}
	cur := cl.cur
	ex, canExec := pl.prov.(sandbox.Executor)
	if pl.gone || !canExec {
		if pl.gone {
			in.Error = &sandbox.RunError{Message: "sandbox gone: " + pl.why, Code: "sandbox-gone"}
		}
		return r.end(ctx, st, pl, cur, in, false, Expired, e)
	}
	bctx, cancel := context.WithTimeout(ctx, r.runBudget(ctx))
	defer cancel()
	if sr, ok := pl.prov.(sandbox.StatusReader); ok {
		// The expired path may start a stopped sandbox once to read its journal.
		if s, err := sr.Status(bctx, pl.psid); err == nil && s == sandbox.SandboxStopped {
			if err := pl.prov.Resume(bctx, pl.psid); err != nil {
				r.kc.Logger.WarnContext(ctx, "reap: resuming a stopped sandbox failed", "runId", st.RunID, "err", err)
			}
		}
	}
	end, n, next, err := r.replay(bctx, ex, pl.psid, st.RunID, cur)
	e.Events, cur = n, next
	switch {
	case errors.Is(err, sandbox.ErrSuperseded), errors.Is(err, sandbox.ErrLogClosed):
		e.Outcome, e.Error = NotClaimed, err.Error()
		return e, nil
	case err != nil:
		// The budget is the designed stop of an expired run: what was delivered stays.
		r.kc.Logger.WarnContext(ctx, "reap: reading an expired run's journal stopped", "runId", st.RunID, "err", err)
	}
	if end.Finished {
		code := end.ExitCode
		e.ExitCode = &code
		in = keeper.FinishInput{Status: sandbox.StatusCompleted, CancelRequested: true}
		if code != 0 {
			in = keeper.FinishInput{Status: sandbox.StatusFailed, CancelRequested: true,
				Error: r.exitError(ctx, ex, pl.psid, st.RunID, code)}
		}
	}
	return r.end(ctx, st, pl, cur, in, true, Expired, e)
}

// exitError is the terminal error of a run that exited with code, its stderr tail read
// within terminalTimeout and detached from a spent run budget.
func (r *Reaper) exitError(ctx context.Context, ex sandbox.Executor, psid, runID string, code int) *sandbox.RunError {
	xctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminalTimeout)
	defer cancel()
	return driver.ExitError(xctx, ex, psid, r.cfg.JournalDir, runID, code)
}

// replay appends the journal's lines from the cursor's Src to the journal's current end
// (or its sentinel), fenced by the cursor's epoch. It returns where it stopped, the events
// appended and the cursor after them.
func (r *Reaper) replay(ctx context.Context, ex sandbox.Executor, psid, runID string, cur sandbox.Cursor) (journal.End, int, sandbox.Cursor, error) {
	n := 0
	end, err := driver.Pump(ctx, ex, psid, r.cfg.JournalDir, runID, cur.Src, journal.NewTranslator(runID),
		driver.DefaultBatchEvents, driver.DefaultBatchBytes, func(batch []sandbox.Event) error {
			res, err := r.k.Append(ctx, runID, cur, batch)
			if err != nil {
				return err
			}
			cur, n = res.Cursor, n+len(batch)
			return nil
		}, nil)
	return end, n, cur, err
}

// end writes the terminal status and closes the log, kills the agent (when kill: only now
// that the run is provably the reaper's and terminal), deletes the journal, and reclaims
// the sandbox; all of it runs detached from the run budget.
func (r *Reaper) end(ctx context.Context, st sandbox.RunState, pl place, cur sandbox.Cursor, in keeper.FinishInput, kill bool, o Outcome, e *RunEntry) (*RunEntry, *keptSandbox) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminalTimeout)
	defer cancel()
	rec, err := r.k.Finish(tctx, st.RunID, cur, in)
	if errors.Is(err, sandbox.ErrSuperseded) || errors.Is(err, sandbox.ErrTerminalRun) {
		e.Outcome, e.Error = NotClaimed, err.Error()
		return e, nil
	}
	if err != nil {
		return r.failIf(ctx, e, fmt.Errorf("terminal write: %w", err)), nil
	}
	e.Outcome, e.Status = o, string(rec.Status)
	if ex, ok := pl.prov.(sandbox.Executor); ok && !pl.gone && pl.psid != "" {
		if kill {
			if err := journal.KillAgent(tctx, ex, pl.psid, r.cfg.JournalDir, st.RunID); err != nil {
				r.kc.Logger.WarnContext(ctx, "reap: killing an ended run's agent failed", "runId", st.RunID, "err", err)
			}
		}
		if err := journal.Delete(tctx, ex, pl.psid, r.cfg.JournalDir, st.RunID); err != nil {
			r.kc.Logger.WarnContext(ctx, "reap: deleting a journal failed", "runId", st.RunID, "err", err)
		}
	}
	if pl.key == "" || pl.gone {
		return e, nil
	}
	o, rr, err := r.reclaim(tctx, pl.row, st.RunID)
	switch o {
	case InUse:
		e.Outcome, e.Kept, e.KeptFor, e.RetryAt = InUse, rr.Kept, rr.UsedBy, rr.RetryAt
		if pl.prov == nil {
			return e, nil // a provider this reaper lacks: nobody here can sweep its journals
		}
		return e, &keptSandbox{tenant: e.Tenant, provider: pl.prov.Name(), psid: pl.psid}
	case ReclaimFailed:
		e.Outcome, e.Error = ReclaimFailed, err.Error()
		r.kc.Logger.ErrorContext(ctx, "reap: reclaiming a sandbox failed", "runId", st.RunID, "key", pl.key, "err", err)
	}
	return e, nil
}

// failIf records err as a failed outcome; nil err keeps the entry as it is.
func (r *Reaper) failIf(ctx context.Context, e *RunEntry, err error) *RunEntry {
	if err == nil {
		return e
	}
	e.Outcome, e.Error = Failed, err.Error()
	r.kc.Logger.ErrorContext(ctx, "reap: sweeping run failed", "tenant", e.Tenant, "runId", e.RunID, "err", err)
	return e
}

// reclaim reclaims the sandbox of row through the keeper (keeper.Reclaim): outcome ""
// (reclaimed, or nothing to reclaim), InUse (kept) or ReclaimFailed (err says why).
func (r *Reaper) reclaim(ctx context.Context, row *sandbox.InstanceRow, except string) (Outcome, keeper.ReclaimResult, error) {
	rr, err := r.k.Reclaim(ctx, row, except)
	switch {
	case err != nil:
		return ReclaimFailed, rr, err
	case rr.Kept != "":
		return InUse, rr, nil
	}
	return "", rr, nil
}
