package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// The idle stop lives here alone (docs/design.md §5): a sandbox whose key has no live run
// and whose latest run ended more than the grace ago is stopped (its files kept), a
// one-run sandbox (reuse "none") destroyed. It runs under the key's lock, sandbox:<key>,
// the lock a start's locked path holds, and marks the row stopping before it asks the
// provider, conditioned on the updatedAt it read: a fast-path start that touched the row
// first makes the mark refuse, and one that touches it after finds the row stopping,
// queues for the lock and resumes the stopped sandbox once the stop is done.

// DefaultIdleStop is the idle grace when none is configured.
const DefaultIdleStop = 10 * time.Minute

// StopOutcome is what StopIdle did with a row.
type StopOutcome string

// The outcomes of StopIdle.
const (
	StopStopped     StopOutcome = "stopped"     // the provider stopped the sandbox
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
	rows := k.cfg.Backend.Instances()
	row, err := retry(ctx, func() (*sandbox.InstanceRow, error) { return rows.GetRow(ctx, key) })
	switch {
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("read row: %w", err)
	case row == nil || row.Reclaiming != "" || row.IdleSince == 0 ||
		row.Lifecycle != sandbox.LifecycleRunning && row.Lifecycle != sandbox.LifecycleStopping:
		return StopResult{Outcome: StopStale}, nil
	}
	g := grace.Milliseconds()
	psid := row.ProviderSandboxID
	if row.IdleSince > now-g {
		return StopResult{Outcome: StopNotDue, DueAt: row.IdleSince + g}, nil
	}
	// The latest run first (one read): a live one keeps the sandbox, one that ended within
	// the grace defers the stop to its end + grace.
	if last := row.LatestRunID; last != "" {
		st, err := retry(ctx, func() (*sandbox.RunState, error) { return k.cfg.Backend.Runs().State(ctx, last) })
		switch {
		case err != nil:
			return StopResult{Outcome: StopFailed}, fmt.Errorf("read latest run: %w", err)
		case st != nil && !st.Status.Terminal():
			return k.deferStop(ctx, row, now, StopResult{Outcome: StopInUse, UsedBy: last, DueAt: now + g})
		case st != nil && st.FinishedAt != nil && *st.FinishedAt > now-g:
			return k.deferStop(ctx, row, *st.FinishedAt, StopResult{Outcome: StopNotDue, DueAt: *st.FinishedAt + g})
		}
	}
	user, err := KeyUser(ctx, k.cfg.Backend.Runs(), key, "")
	switch {
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("in-use check: %w", err)
	case user != "":
		return k.deferStop(ctx, row, now, StopResult{Outcome: StopInUse, UsedBy: user, DueAt: now + g})
	}
	prov := k.providers[row.Provider]
	if prov == nil {
		return StopResult{Outcome: StopFailed}, fmt.Errorf("no provider named %q configured", row.Provider)
	}
	if row.DestroyOnEnd && row.Lifecycle == sandbox.LifecycleRunning {
		rr, err := k.Reclaim(ctx, row, "")
		switch {
		case err != nil:
			return StopResult{Outcome: StopFailed}, err
		case rr.Kept != "":
			return StopResult{Outcome: StopKept, UsedBy: rr.UsedBy, DueAt: rr.RetryAt}, nil
		}
		return StopResult{Outcome: StopDestroyed}, nil
	}
	stopper, ok := prov.(sandbox.Stopper)
	if !ok {
		return k.deferStop(ctx, row, now, StopResult{Outcome: StopUnsupported, DueAt: now + g})
	}
	tok := newToken()
	err = retry0(ctx, func() error { return rows.MarkStopping(ctx, key, psid, row.UpdatedAt, tok, now) })
	switch {
	case errors.Is(err, sandbox.ErrConflict):
		return StopResult{Outcome: StopStale}, nil // a start touched it since the read
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("mark stopping: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, k.cfg.DestroyTimeout)
	serr := k.providerErr(ctx, prov, stopper.Stop(sctx, psid))
	cancel()
	res, next := StopResult{Outcome: StopStopped}, sandbox.LifecycleStopped
	switch {
	case errors.Is(serr, sandbox.ErrSandboxGone):
		res, next = StopResult{Outcome: StopGone}, sandbox.LifecycleGone
	case serr != nil:
		res, next = StopResult{Outcome: StopFailed, DueAt: k.nowMs() + g}, sandbox.LifecycleRunning
	}
	// Settled even when the lock's context is done: the mark is this stop's, and only its
	// token can end it (a start that took the lock meanwhile has settled it already).
	dctx, dcancel := detached(ctx, k.cfg.DestroyTimeout)
	defer dcancel()
	err = retry0(dctx, func() error { return rows.SettleStop(dctx, key, tok, next, k.nowMs()) })
	switch {
	case serr != nil:
		return res, fmt.Errorf("stop %s: %w", psid, serr)
	case errors.Is(err, sandbox.ErrConflict):
		return StopResult{Outcome: StopStale}, nil
	case err != nil:
		return StopResult{Outcome: StopFailed}, fmt.Errorf("settle stop: %w", err)
	}
	k.cfg.Logger.DebugContext(ctx, "keeper: stopped an idle sandbox", "key", key, "providerSandboxId", psid, "outcome", res.Outcome)
	return res, nil
}

// deferStop moves the row's idleSince to at (the sandbox served a run until then) and
// answers res; a refusal (the row moved on) is no failure: the start that moved it decides.
func (k *Keeper) deferStop(ctx context.Context, row *sandbox.InstanceRow, at int64, res StopResult) (StopResult, error) {
	if row.Lifecycle != sandbox.LifecycleRunning || at <= row.IdleSince {
		return res, nil
	}
	err := retry0(ctx, func() error { return k.cfg.Backend.Instances().DeferStop(ctx, row.Key, row.ProviderSandboxID, at) })
	if err != nil && !errors.Is(err, sandbox.ErrConflict) {
		return StopResult{Outcome: StopFailed}, fmt.Errorf("defer stop: %w", err)
	}
	return res, nil
}

// abandonStop ends a stop its stopper left unfinished (it crashed, or lost the lock while
// the provider was stopping): the row read under the lock is stopping, and nobody else can
// be stopping it while this holder has the lock. The row is running again; the resume
// that follows starts the sandbox if the stop got that far.
func (k *Keeper) abandonStop(lctx context.Context, row *sandbox.InstanceRow) error {
	k.cfg.Logger.WarnContext(lctx, "keeper: a stop was left unfinished; resuming its sandbox",
		"key", row.Key, "providerSandboxId", row.ProviderSandboxID)
	err := retry0(lctx, func() error {
		return k.cfg.Backend.Instances().SettleStop(lctx, row.Key, row.StopToken, sandbox.LifecycleRunning, k.nowMs())
	})
	if err != nil && !errors.Is(err, sandbox.ErrConflict) {
		return fmt.Errorf("settle an unfinished stop: %w", err)
	}
	return nil
}
