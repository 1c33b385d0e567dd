package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The idle stop lives here alone (docs/design.md §5): a sandbox whose key has no live run
// and whose latest run ended more than the grace ago is stopped (its files kept), a
// one-run sandbox (reuse "none") destroyed — normally at its run's end already
// (SettleEnded, below), the stop being the backstop. It runs under the key's lock, sandbox:<key>,
// the lock a start's locked path holds, and marks the row stopping before it asks the
// provider, conditioned on the updatedAt it read: a fast-path start that touched the row
// first makes the mark refuse, and one that touches it after finds the row stopping,
// queues for the lock and resumes the stopped sandbox once the stop is done.

// DefaultIdleStop is the idle grace when none is configured.
const DefaultIdleStop = 10 * time.Minute

// The bounds of a setup's own idle grace (Setup.IdleStopMs): a minute at least (the
// reaper sweeps about once a minute; a shorter grace would only cost reads), a week at
// most (the instance retention's order: a longer grace never stops).
const (
	MinIdleStop = time.Minute
	MaxIdleStop = 7 * 24 * time.Hour
)

// StopOutcome is what StopIdle did with a row.
type StopOutcome string

// The outcomes of StopIdle.
const (
	StopStopped     StopOutcome = "stopped"     // the provider stopped the sandbox
	StopArchived    StopOutcome = "archived"    // the provider had archived it already (its own rule): no stop asked
	StopGone        StopOutcome = "gone"        // the provider no longer has it; the next start recreates
	StopDestroyed   StopOutcome = "destroyed"   // a one-run sandbox (reuse "none") reclaimed
	StopInUse       StopOutcome = "in-use"      // a run that has not ended uses the key: deferred
	StopNotDue      StopOutcome = "not-due"     // its latest run ended within the grace: deferred
	StopUnsupported StopOutcome = "unsupported" // the provider cannot stop: looked at again after a grace
	StopKept        StopOutcome = "kept"        // a reclaim of a one-run sandbox kept it (Reclaim's reason)
	StopStale       StopOutcome = "stale"       // the listing was stale: gone, tombstoned, stopped or touched
	StopFailed      StopOutcome = "failed"      // the stop failed; the row is running again and retried later
)

// StopResult is what StopIdle did: Outcome, the run using the key (StopInUse) and when the
// row is due again (deferred outcomes), epoch ms.
type StopResult struct {
	Outcome StopOutcome
	UsedBy  string
	DueAt   int64
}

// StopIdle stops the sandbox of the row at key when it has been idle for grace at now,
// in ctx's tenant. The caller holds the lock sandbox:<key> (ctx is the lock's context): a
// start never gets a sandbox that is stopping under it because both serialize on that
// lock, and the row's stopping mark sends a fast-path start to it. An error is a failure
// the next sweep retries; the row is never left stopping by a stop that ran to its end.
func (k *Keeper) StopIdle(ctx context.Context, key string, grace time.Duration, now int64) (StopResult, error) {
	rows := k.st.Instances()
	row, err := rows.GetRow(ctx, key)
	switch {
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("read row: %w", err)
	case row == nil || row.Reclaiming != "" || row.IdleSince == 0 ||
		row.Lifecycle != contract.LifecycleRunning && row.Lifecycle != contract.LifecycleStopping:
		return StopResult{Outcome: StopStale}, nil
	}
	// The row is listed (idleSince <= now - the deployment's grace gd) by the index's sort
	// key; its own grace g (the setup's, else gd) decides. A deferral writes idleSince so
	// that the row is listed again when the stop is due: due - gd.
	gd := grace.Milliseconds()
	g := gd
	if row.IdleStopMs > 0 {
		g = row.IdleStopMs
	}
	psid := row.ProviderSandboxID
	if row.IdleSince > now-gd {
		return StopResult{Outcome: StopNotDue, DueAt: row.IdleSince + gd}, nil
	}
	// The latest run first (one read): a live one keeps the sandbox, one that ended within
	// the grace defers the stop to its end + grace.
	destroy := row.DestroyOnEnd
	if last := row.LatestRunID; last != "" {
		st, err := k.st.Runs().State(ctx, last)
		if st != nil && st.Status.Terminal() {
			destroy = DestroysOnEnd(row, st.RunRecord) // the run's end missed it (SettleEnded)
		}
		switch {
		case err != nil:
			return StopResult{Outcome: StopFailed}, fmt.Errorf("read latest run: %w", err)
		case st != nil && !st.Status.Terminal():
			return k.deferStop(ctx, row, now, StopResult{Outcome: StopInUse, UsedBy: last, DueAt: now + gd})
		case st != nil && st.FinishedAt != nil && *st.FinishedAt > now-g:
			return k.deferStop(ctx, row, *st.FinishedAt+g-gd, StopResult{Outcome: StopNotDue, DueAt: *st.FinishedAt + g})
		}
	}
	user, err := KeyUser(ctx, k.st.Runs(), key, "")
	switch {
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("in-use check: %w", err)
	case user != "":
		return k.deferStop(ctx, row, now, StopResult{Outcome: StopInUse, UsedBy: user, DueAt: now + gd})
	}
	prov := k.providers[row.Provider]
	if prov == nil {
		return StopResult{Outcome: StopFailed}, fmt.Errorf("no provider named %q configured", row.Provider)
	}
	if destroy && row.Lifecycle == contract.LifecycleRunning {
		rr, err := k.Reclaim(ctx, row, "")
		switch {
		case err != nil:
			return StopResult{Outcome: StopFailed}, err
		case rr.Kept != "":
			return StopResult{Outcome: StopKept, UsedBy: rr.UsedBy, DueAt: rr.RetryAt}, nil
		}
		return StopResult{Outcome: StopDestroyed}, nil
	}
	stopper, ok := prov.(contract.Stopper)
	if !ok {
		return k.deferStop(ctx, row, now, StopResult{Outcome: StopUnsupported, DueAt: now + g})
	}
	tok := newToken()
	err = rows.MarkStopping(ctx, key, psid, row.UpdatedAt, tok, now)
	switch {
	case errors.Is(err, contract.ErrConflict):
		return StopResult{Outcome: StopStale}, nil // a start touched it since the read
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("mark stopping: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, k.cfg.DestroyTimeout)
	archived := k.archived(sctx, prov, psid)
	var serr error
	if !archived {
		serr = k.providerErr(ctx, prov, stopper.Stop(sctx, psid))
	}
	cancel()
	res, next := StopResult{Outcome: StopStopped}, contract.LifecycleStopped
	switch {
	case archived:
		res, next = StopResult{Outcome: StopArchived}, contract.LifecycleArchived
	case errors.Is(serr, contract.ErrSandboxGone):
		res, next = StopResult{Outcome: StopGone}, contract.LifecycleGone
	case serr != nil:
		res, next = StopResult{Outcome: StopFailed, DueAt: k.nowMs() + g}, contract.LifecycleRunning
	}
	// Settled even when the lock's context is done: the mark is this stop's, and only its
	// token can end it (a start that took the lock meanwhile has settled it already).
	dctx, dcancel := detached(ctx, k.cfg.DestroyTimeout)
	defer dcancel()
	err = rows.SettleStop(dctx, key, tok, next, k.nowMs())
	switch {
	case serr != nil:
		return res, fmt.Errorf("stop %s: %w", psid, serr)
	case errors.Is(err, contract.ErrConflict):
		return StopResult{Outcome: StopStale}, nil
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("settle stop: %w", err)
	}
	k.cfg.Logger.DebugContext(ctx, "keeper: stopped an idle sandbox", "key", key, "providerSandboxId", psid, "outcome", res.Outcome)
	return res, nil
}

// archived is the idle stop's probe (docs/design.md §5): whether the provider reports the
// sandbox archived already (Daytona archives a stopped sandbox by its own rule), so that
// the row says archived rather than stopped and no stop is asked. A provider that cannot
// read a sandbox's state, or a failed read, is no archive: the stop goes ahead.
func (k *Keeper) archived(ctx context.Context, prov contract.Provider, psid string) bool {
	sr, ok := prov.(contract.StatusReader)
	if !ok {
		return false
	}
	st, err := sr.Status(ctx, psid)
	return err == nil && st == contract.SandboxArchived
}

// deferStop moves the row's idleSince to at (the sandbox served a run until then, or the
// stop is due a deployment grace after at) and answers res; a refusal (the row moved on)
// is no failure: the start that moved it decides.
func (k *Keeper) deferStop(ctx context.Context, row *contract.InstanceRow, at int64, res StopResult) (StopResult, error) {
	if row.Lifecycle != contract.LifecycleRunning || at <= row.IdleSince {
		return res, nil
	}
	err := k.st.Instances().DeferStop(ctx, row.Key, row.ProviderSandboxID, at)
	if err != nil && !errors.Is(err, contract.ErrConflict) {
		return StopResult{Outcome: StopFailed}, fmt.Errorf("defer stop: %w", err)
	}
	return res, nil
}

// abandonStop ends a stop its stopper left unfinished (it crashed, or lost the lock while
// the provider was stopping): the row read under the lock is stopping, and nobody else can
// be stopping it while this holder has the lock. The row is running again; the resume
// that follows starts the sandbox if the stop got that far.
func (k *Keeper) abandonStop(lctx context.Context, row *contract.InstanceRow) error {
	k.cfg.Logger.WarnContext(lctx, "keeper: a stop was left unfinished; resuming its sandbox",
		"key", row.Key, "providerSandboxId", row.ProviderSandboxID)
	err := k.st.Instances().SettleStop(lctx, row.Key, row.StopToken, contract.LifecycleRunning, k.nowMs())
	if err != nil && !errors.Is(err, contract.ErrConflict) {
		return fmt.Errorf("settle an unfinished stop: %w", err)
	}
	return nil
}

// EndOutcome is what SettleEnded did with an ended run's sandbox.
type EndOutcome string

// The outcomes of SettleEnded.
const (
	EndKept      EndOutcome = "kept"      // left to the thread: the idle stop stops it after the grace
	EndDestroyed EndOutcome = "destroyed" // reuse "none", or destroyOnCancel and the run was cancelled
	EndDeferred  EndOutcome = "deferred"  // to be destroyed, but kept for now (Reclaim's reason in Kept)
)

// EndResult is what SettleEnded did: Outcome, and for EndDeferred the reclaim's reason
// (KeptInUse: another run uses the key; KeptTouched: retried by the reaper at RetryAt).
type EndResult struct {
	Outcome EndOutcome
	Kept    string
	RetryAt int64
}

// DestroysOnEnd reports whether row's sandbox goes with the end of rec (terminal): a
// one-run sandbox (reuse "none") always; any other only when its setup asked for it
// (destroyOnCancel) and rec ended aborted by a cancel. Every other end keeps the sandbox
// for the thread (docs/design.md §5).
func DestroysOnEnd(row *contract.InstanceRow, rec contract.RunRecord) bool {
	return row.DestroyOnEnd || row.DestroyOnCancel && rec.Status == contract.StatusAborted && rec.Cancelled()
}

// SettleEnded settles the sandbox of a run whose terminal write landed (rec as written),
// after its agent was killed and its journal removed: the callers that end a run (the
// finish route's service, the ship route's end, the reaper) call it once the run is
// terminal. A sandbox DestroysOnEnd names is reclaimed now (Reclaim, the run itself
// excepted from the in-use check); a sandbox with a setup grace shorter than the
// deployment's is listed for its stop at the end + its grace (one DeferStop); any other
// is left to the idle stop. It reads the row once (consistent); an error is the failed
// write, and the reaper's sweeps (pending reclaims, the idle stop) finish what it left.
func (k *Keeper) SettleEnded(ctx context.Context, rec contract.RunRecord) (EndResult, error) {
	if !rec.Status.Terminal() || rec.SandboxKey == nil || *rec.SandboxKey == "" {
		return EndResult{Outcome: EndKept}, nil
	}
	key := *rec.SandboxKey
	row, err := k.st.Instances().GetRow(ctx, key)
	switch {
	case err != nil:
		return EndResult{Outcome: EndKept}, fmt.Errorf("keeper: settle the sandbox of ended run %q: read row: %w", rec.RunID, err)
	case row == nil || row.Reclaiming != "":
		return EndResult{Outcome: EndKept}, nil // gone, or a reclaim is under way already
	}
	if DestroysOnEnd(row, rec) {
		rr, err := k.Reclaim(ctx, row, rec.RunID)
		switch {
		case err != nil:
			return EndResult{Outcome: EndDeferred}, fmt.Errorf("keeper: settle the sandbox of ended run %q: %w", rec.RunID, err)
		case rr.Kept != "":
			return EndResult{Outcome: EndDeferred, Kept: rr.Kept, RetryAt: rr.RetryAt}, nil
		}
		return EndResult{Outcome: EndDestroyed}, nil
	}
	if err := k.ListForStop(ctx, row, rec, k.cfg.IdleStop); err != nil {
		return EndResult{Outcome: EndKept}, fmt.Errorf("keeper: settle the sandbox of ended run %q: %w", rec.RunID, err)
	}
	return EndResult{Outcome: EndKept}, nil
}

// ListForStop lists row's sandbox for its idle stop at the end of rec + the setup's grace
// when that grace is shorter than the deployment's (grace): the sweep lists a row by
// idleSince + grace, so idleSince moves back to end + setup grace - grace (one DeferStop).
// Any other row is listed early enough already; nothing is written for it.
func (k *Keeper) ListForStop(ctx context.Context, row *contract.InstanceRow, rec contract.RunRecord, grace time.Duration) error {
	gd, g := grace.Milliseconds(), row.IdleStopMs
	if g <= 0 || g >= gd || row.LatestRunID != rec.RunID || row.Lifecycle != contract.LifecycleRunning || rec.FinishedAt == nil {
		return nil
	}
	at := max(*rec.FinishedAt+g-gd, 1)
	err := k.st.Instances().DeferStop(ctx, row.Key, row.ProviderSandboxID, at)
	if err != nil && !errors.Is(err, contract.ErrConflict) {
		return fmt.Errorf("list for its stop: %w", err)
	}
	return nil
}
