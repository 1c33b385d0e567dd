package reaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
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
	prov contract.Provider
	row  *contract.InstanceRow // as read once per run; the reclaim's tombstone is conditioned on it
	gone bool                  // confirmed: the row is missing, tombstoned or names another sandbox
	why  string                // why gone, or why the probe cannot run
}

// Act carries out d as a sweep would, writing only what d decided: turn a lapsed lease
// into a detach (conditional on the lease Classify read), then end the run (finalize or
// expire, each through a claim conditioned on what Classify read, then reclaim its
// sandbox), or leave it. A change since Classify (a returning viewer, a late heartbeat)
// makes those writes refuse, and the report says so. Act belongs under the sweep lock
// (Sweep holds it): a refused lapse counts as this sweep's own landed one only because no
// other sweep runs. The report holds d's run alone.
func (r *Reaper) Act(ctx context.Context, d Decision) Report {
	rep := Report{Runs: []RunEntry{}}
	r.tally(&rep, d)
	if e, _ := r.act(ctx, d, &rep); e != nil {
		rep.add(*e)
	}
	return rep
}

// act carries out d (Act); nil when there is nothing to report (d skips the hit, or a
// refused lapse found the run moved on). It also returns the sandbox kept for another run.
func (r *Reaper) act(ctx context.Context, d Decision, rep *Report) (*RunEntry, *keptSandbox) {
	if d.Outcome == "" {
		return nil, nil
	}
	tctx := contract.WithTenant(ctx, d.Candidate.Tenant)
	e := d.entry
	if d.NotLaunched {
		return r.notLaunched(tctx, d.st, d.pl, &e)
	}
	if d.ClearLaunch {
		if err := r.k.ClearLaunch(tctx, d.Candidate.RunID); err != nil {
			return r.failIf(ctx, &e, err), nil
		}
	}
	if d.Lapse {
		switch err := r.lapse(tctx, d.read); {
		case errors.Is(err, errMovedOn):
			rep.Swept.Stale++ // a heartbeat, detach or claim got there first
			return nil, nil
		case err != nil:
			return r.failIf(ctx, &e, err), nil
		}
		rep.Swept.Lapsed++
	}
	switch d.Outcome {
	case Finalized:
		return r.finalize(tctx, d.st, d.pl, *e.ExitCode, &e)
	case Expired:
		return r.expire(tctx, d.st, d.pl, d.cutoff, &e)
	case Reshipped:
		return r.reship(tctx, d.st, d.pl, &e), nil
	}
	return &e, nil // left alone (producing, unknown) or failed to classify
}

// errMovedOn: a refused lapse re-read the run and found it changed by someone else.
var errMovedOn = errors.New("reaper: the run moved on")

// lapse turns st's lapsed driver lease into a detach since the lease end, conditional on
// the epoch and lease st was read with. Refused, it re-reads first (docs/design.md §2.1): a
// retry whose first attempt landed finds the very lapse it asked for (one sweep at a time,
// so it was this one); anything else is errMovedOn.
func (r *Reaper) lapse(ctx context.Context, st contract.RunState) error {
	err := r.st.Runs().Lapse(ctx, st.RunID, st.Epoch(), st.LeaseUntil)
	if errors.Is(err, contract.ErrConflict) {
		mine, rerr := r.lapsedAsAsked(ctx, st)
		switch {
		case rerr != nil:
			return fmt.Errorf("lapse: re-read: %w", rerr)
		case !mine:
			return errMovedOn
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("lapse: %w", err)
	}
	return nil
}

// lapsedAsAsked re-reads a run whose lapse was refused and reports whether it stands
// exactly as that lapse would leave it: same epoch, lapsed, detached since the lease end.
func (r *Reaper) lapsedAsAsked(ctx context.Context, asked contract.RunState) (bool, error) {
	cur, err := r.st.Runs().State(ctx, asked.RunID)
	if err != nil || cur == nil {
		return false, err
	}
	return cur.Status == contract.StatusRunning && cur.Epoch() == asked.Epoch() && cur.Lapsed &&
		cur.DetachedSince != nil && *cur.DetachedSince == asked.LeaseUntil, nil
}

// claimed is a run the reaper holds: its epoch and log cursor.
type claimed struct {
	st  contract.RunState
	cur contract.Cursor
}

// claim bumps the run's epoch under cond (one CAS; a refusal writes nothing) and fences its
// log, through the keeper's claim sequence (a closed log on a live run is repaired there).
// ok=false: not claimed (the entry says why).
func (r *Reaper) claim(ctx context.Context, runID string, cond contract.ClaimCond, e *RunEntry) (claimed, bool, error) {
	st, fence, err := r.k.ClaimFenced(ctx, runID, false, cond)
	switch {
	case errors.Is(err, contract.ErrConflict), errors.Is(err, contract.ErrTerminalRun),
		errors.Is(err, contract.ErrUnknownRun), errors.Is(err, contract.ErrSuperseded):
		e.Outcome, e.Error = NotClaimed, err.Error()
		return claimed{}, false, nil
	case err != nil:
		return claimed{}, false, fmt.Errorf("claim: %w", err)
	}
	return claimed{st: st, cur: fence.Cursor}, true, nil
}

// reship replaces a run's dead shipper (docs/design.md §8.3): claim the run on the listed
// detachedSince with detachedSince cleared (it is driven again, by the new shipper, whose
// answers renew the lease), then start a shipper at the new epoch; it learns from its first
// answer where the log stands and ships on from there. A sandbox that cannot start it
// leaves the run claimed with a lease that lapses again: the next sweep or an attach.
func (r *Reaper) reship(ctx context.Context, st contract.RunState, pl place, e *RunEntry) *RunEntry {
	ds := *st.DetachedSince
	cst, fence, err := r.k.ClaimFenced(ctx, st.RunID, true, contract.ClaimCond{DetachedSince: &ds})
	switch {
	case errors.Is(err, contract.ErrConflict), errors.Is(err, contract.ErrTerminalRun),
		errors.Is(err, contract.ErrUnknownRun), errors.Is(err, contract.ErrSuperseded):
		e.Outcome, e.Error = NotClaimed, err.Error()
		return e
	case err != nil:
		return r.failIf(ctx, e, fmt.Errorf("claim: %w", err))
	}
	at := fence.Cursor
	at.Epoch = cst.Epoch()
	bctx, cancel := context.WithTimeout(ctx, r.runBudget(ctx))
	defer cancel()
	started, err := r.cfg.Ship.Start(bctx, r.k, pl.prov.(contract.Executor), pl.psid, r.cfg.JournalDir, st.RunID, at)
	switch {
	case err != nil:
		return r.failIf(ctx, e, fmt.Errorf("start a shipper: %w", err))
	case !started:
		return r.failIf(ctx, e, errors.New("start a shipper: the sandbox could not run one (no curl, or the API unreachable)"))
	}
	e.Outcome = Reshipped
	return e
}

// finalize ends a run that finished while detached: claim (on the listed detachedSince),
// replay the journal from the log's highest Src, end it from the exit code, reclaim.
func (r *Reaper) finalize(ctx context.Context, st contract.RunState, pl place, code int, e *RunEntry) (*RunEntry, *keptSandbox) {
	ds := *st.DetachedSince
	cl, ok, err := r.claim(ctx, st.RunID, contract.ClaimCond{DetachedSince: &ds}, e)
	if err != nil || !ok {
		return r.failIf(ctx, e, err), nil
	}
	ex := pl.prov.(contract.Executor)
	bctx, cancel := context.WithTimeout(ctx, r.runBudget(ctx))
	defer cancel()
	end, n, cur, err := r.replay(bctx, ex, pl.psid, st.RunID, cl.cur)
	e.Events = n
	switch {
	case errors.Is(err, contract.ErrSuperseded), errors.Is(err, contract.ErrLogClosed):
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
	in := keeper.FinishInput{Status: contract.StatusCompleted}
	if code != 0 {
		in = keeper.FinishInput{Status: contract.StatusFailed, Error: r.exitError(ctx, ex, pl.psid, st.RunID, code)}
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
func (r *Reaper) expire(ctx context.Context, st contract.RunState, pl place, cutoff int64, e *RunEntry) (*RunEntry, *keptSandbox) {
	ds := *st.DetachedSince
	cond := contract.ClaimCond{DetachedSince: &ds}
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
	reason := contract.RunError{Message: "detached longer than the TTL", Code: "expired"}
	if st.Cancelled() {
		reason = contract.RunError{Message: "cancelled", Code: "cancelled"}
	}
	in := keeper.FinishInput{Status: contract.StatusAborted, Error: &reason, CancelRequested: true}
	cur := cl.cur
	ex, canExec := pl.prov.(contract.Executor)
	if pl.gone || !canExec {
		if pl.gone {
			in.Error = &contract.RunError{Message: "sandbox gone: " + pl.why, Code: "sandbox-gone"}
		}
		return r.end(ctx, st, pl, cur, in, false, Expired, e)
	}
	bctx, cancel := context.WithTimeout(ctx, r.runBudget(ctx))
	defer cancel()
	if sr, ok := pl.prov.(contract.StatusReader); ok {
		// The expired path may start a stopped sandbox once to read its journal.
		if s, err := sr.Status(bctx, pl.psid); err == nil && s.Resumable() {
			if err := pl.prov.Resume(bctx, pl.psid); err != nil {
				r.kc.Logger.WarnContext(ctx, "reap: resuming a stopped sandbox failed", "runId", st.RunID, "err", err)
			} else {
				e.Resumed = true
			}
		}
	}
	end, n, next, err := r.replay(bctx, ex, pl.psid, st.RunID, cur)
	e.Events, cur = n, next
	switch {
	case errors.Is(err, contract.ErrSuperseded), errors.Is(err, contract.ErrLogClosed):
		e.Outcome, e.Error = NotClaimed, err.Error()
		return e, nil
	case err != nil:
		// The budget is the designed stop of an expired run: what was delivered stays.
		r.kc.Logger.WarnContext(ctx, "reap: reading an expired run's journal stopped", "runId", st.RunID, "err", err)
	}
	if end.Finished {
		code := end.ExitCode
		e.ExitCode = &code
		in = keeper.FinishInput{Status: contract.StatusCompleted, CancelRequested: true}
		if code != 0 {
			in = keeper.FinishInput{Status: contract.StatusFailed, CancelRequested: true,
				Error: r.exitError(ctx, ex, pl.psid, st.RunID, code)}
		}
	}
	return r.end(ctx, st, pl, cur, in, true, Expired, e)
}

// notLaunched ends a run that missed its launch deadline (docs/design.md §4.2): claim it
// while its launch marker is as read (a launch recorded since refuses the claim), then
// write failed with keeper.CodeAgentNotLaunched, close and reclaim as an expiry does.
// There is no agent to kill and no journal to read.
func (r *Reaper) notLaunched(ctx context.Context, st contract.RunState, pl place, e *RunEntry) (*RunEntry, *keptSandbox) {
	lb := st.LaunchBy
	cl, ok, err := r.claim(ctx, st.RunID, contract.ClaimCond{LaunchBy: &lb}, e)
	if err != nil || !ok {
		return r.failIf(ctx, e, err), nil
	}
	return r.end(ctx, st, pl, cl.cur, keeper.NotLaunchedInput(lb), false, Expired, e)
}

// exitError is the terminal error of a run that exited with code, its stderr tail read
// within terminalTimeout and detached from a spent run budget.
func (r *Reaper) exitError(ctx context.Context, ex contract.Executor, psid, runID string, code int) *contract.RunError {
	xctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminalTimeout)
	defer cancel()
	return agentrun.ExitError(xctx, ex, psid, r.cfg.JournalDir, runID, code)
}

// replay appends the journal's lines from the cursor's Src to the journal's current end
// (or its sentinel), fenced by the cursor's epoch. It returns where it stopped, the events
// appended and the cursor after them.
func (r *Reaper) replay(ctx context.Context, ex contract.Executor, psid, runID string, cur contract.Cursor) (journal.End, int, contract.Cursor, error) {
	n := 0
	end, err := agentrun.Pump(ctx, ex, psid, r.cfg.JournalDir, runID, cur.Src, journal.NewTranslator(runID),
		agentrun.DefaultBatchEvents, agentrun.DefaultBatchBytes, func(batch []contract.Event) error {
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
func (r *Reaper) end(ctx context.Context, st contract.RunState, pl place, cur contract.Cursor, in keeper.FinishInput, kill bool, o Outcome, e *RunEntry) (*RunEntry, *keptSandbox) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminalTimeout)
	defer cancel()
	rec, err := r.k.Finish(tctx, st.RunID, cur, in)
	if errors.Is(err, contract.ErrSuperseded) || errors.Is(err, contract.ErrTerminalRun) {
		e.Outcome, e.Error = NotClaimed, err.Error()
		return e, nil
	}
	if err != nil {
		return r.failIf(ctx, e, fmt.Errorf("terminal write: %w", err)), nil
	}
	e.Outcome, e.Status = o, string(rec.Status)
	if ex, ok := pl.prov.(contract.Executor); ok && !pl.gone && pl.psid != "" {
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
	if pl.row != nil && !keeper.DestroysOnEnd(pl.row, rec) {
		// The thread's sandbox stays for its next run: the idle stop stops it after the
		// grace and the next start resumes it (docs/design.md §5). Only a one-run sandbox
		// (reuse "none"), or a cancelled run's whose setup asks for it, is reclaimed with
		// its run.
		e.Sandbox, e.Kept = SandboxKept, KeptIdleStop
		if r.cfg.IdleStop > 0 {
			if err := r.k.ListForStop(tctx, pl.row, rec, r.cfg.IdleStop); err != nil {
				r.kc.Logger.WarnContext(ctx, "reap: listing an ended run's sandbox for its stop failed", "runId", st.RunID, "err", err)
			}
		}
		if pl.prov == nil {
			return e, nil
		}
		return e, &keptSandbox{tenant: e.Tenant, provider: pl.prov.Name(), psid: pl.psid}
	}
	f, rr, err := r.reclaim(tctx, pl.row, st.RunID)
	e.Sandbox = f
	switch f {
	case SandboxKept:
		e.Kept, e.KeptFor, e.RetryAt = rr.Kept, rr.UsedBy, rr.RetryAt
		if pl.prov == nil {
			return e, nil // a provider this reaper lacks: nobody here can sweep its journals
		}
		return e, &keptSandbox{tenant: e.Tenant, provider: pl.prov.Name(), psid: pl.psid}
	case SandboxReclaimFailed:
		e.Error = err.Error()
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

// reclaim reclaims the sandbox of row through the keeper (keeper.Reclaim): reclaimed,
// kept or reclaim-failed (err says why).
func (r *Reaper) reclaim(ctx context.Context, row *contract.InstanceRow, except string) (SandboxFate, keeper.ReclaimResult, error) {
	rr, err := r.k.Reclaim(ctx, row, except)
	switch {
	case err != nil:
		return SandboxReclaimFailed, rr, err
	case rr.Kept != "":
		return SandboxKept, rr, nil
	}
	return SandboxReclaimed, rr, nil
}
