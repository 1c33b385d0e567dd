package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Reclaim is two-phase and lives here alone (docs/design.md §2.1 mark-reclaiming): a row
// is tombstoned (MarkReclaiming, conditioned on the updatedAt it was read with and on
// being idle past the touch guard), its sandbox destroyed with its own timeout, its
// snapshots deleted, then the tombstone deleted (DeleteReclaimed). A tombstone whose finish
// failed stays, so the reaper's pending-reclaim sweep (or the next start of the key)
// finishes it; nothing is destroyed that a non-terminal run is stamped with.

// DefaultReclaimMargin is Config.ReclaimMargin's default.
const DefaultReclaimMargin = 5 * time.Second

// Why a reclaim kept a sandbox (ReclaimResult.Kept).
const (
	KeptInUse   = "in-use"           // a non-terminal run is stamped with its key
	KeptTouched = "touched-recently" // its row was touched too recently to tombstone; retried
)

// reclaimAttempts bounds how often one reclaim re-reads a row that changed under its
// tombstone write before it defers to a later sweep.
const reclaimAttempts = 3

// ReclaimResult is what Reclaim did: Kept "" (reclaimed, or nothing left to reclaim), or
// why the sandbox stays: KeptInUse (UsedBy names the run) or KeptTouched (RetryAt, epoch
// ms, is when the deferred reclaim is due; 0 when it could not be recorded).
type ReclaimResult struct {
	Kept    string
	UsedBy  string
	RetryAt int64
}

// ReclaimPlan is what Reclaim would do with a row, decided from reads only (PlanReclaim):
// Kept as in ReclaimResult, or Err when nothing can be done (a failed read, no provider);
// neither means tombstone the row, destroy its sandbox and delete the row.
type ReclaimPlan struct {
	Kept   string
	UsedBy string // the run stamped with the key (Kept == KeptInUse)
	Err    error

	idleBefore int64 // the touch guard the tombstone is conditioned on
}

// PlanReclaim decides from reads only what reclaiming row (tombstoned or not) would do now:
// keep the sandbox when a non-terminal run other than except is stamped with its key or
// the row was touched after the touch guard (touchGuard); fail when no provider of this
// keeper is the row's; else destroy it and delete the row. It writes nothing: a dry run is
// this alone, and Reclaim acts on exactly this decision.
func (k *Keeper) PlanReclaim(ctx context.Context, row *contract.InstanceRow, except string) ReclaimPlan {
	user, err := KeyUser(ctx, k.st.Runs(), row.Key, except)
	switch {
	case err != nil:
		return ReclaimPlan{Err: fmt.Errorf("in-use check: %w", err)}
	case user != "":
		return ReclaimPlan{Kept: KeptInUse, UsedBy: user}
	}
	return k.planIdle(ctx, row, except)
}

// planIdle is PlanReclaim past the in-use check: the provider and the touch guard.
func (k *Keeper) planIdle(ctx context.Context, row *contract.InstanceRow, except string) ReclaimPlan {
	if k.providers[row.Provider] == nil {
		return ReclaimPlan{Err: fmt.Errorf("no provider named %q configured", row.Provider)}
	}
	if row.Reclaiming != "" {
		return ReclaimPlan{} // tombstoned already: only the finish is left
	}
	idleBefore, err := k.touchGuard(ctx, row, except)
	switch {
	case err != nil:
		return ReclaimPlan{Err: fmt.Errorf("touch check: %w", err)}
	case row.UpdatedAt > idleBefore:
		return ReclaimPlan{Kept: KeptTouched, idleBefore: idleBefore}
	}
	return ReclaimPlan{idleBefore: idleBefore}
}

// Reclaim tears down the sandbox of row (as the caller read it; the tombstone's condition
// on its updatedAt makes an earlier read as safe as a fresh one) in two phases, acting on
// PlanReclaim's decision: in use by a non-terminal run other than except → KeptInUse (a
// deferred reclaim on the row is dropped: that run's own end decides); touched too
// recently → the reclaim is deferred on the row (DeferReclaim) for a later sweep,
// KeptTouched; else tombstone and finish (FinishReclaim). A tombstone refused because the
// row changed is decided again on the row as it is now (bounded, then deferred); a row
// gone or naming another sandbox by then leaves nothing to do. An error means the reclaim
// failed; a tombstone it wrote stays for a retry.
func (k *Keeper) Reclaim(ctx context.Context, row *contract.InstanceRow, except string) (ReclaimResult, error) {
	key, psid := row.Key, row.ProviderSandboxID
	p := k.PlanReclaim(ctx, row, except)
	for attempt := 1; ; attempt++ {
		switch {
		case p.Err != nil:
			return ReclaimResult{}, p.Err
		case p.Kept == KeptInUse:
			if row.ReclaimDue != 0 {
				k.deferReclaim(ctx, key, psid, 0)
			}
			return ReclaimResult{Kept: KeptInUse, UsedBy: p.UsedBy}, nil
		case row.Reclaiming == "" && (p.Kept == KeptTouched || attempt > reclaimAttempts):
			// Touched too recently: a run the index does not show yet may use it. Retry
			// once the touch is old enough (or, after rows changing under every attempt,
			// at the next sweep).
			now := k.nowMs()
			due := max(row.UpdatedAt-p.idleBefore+now, now) + 1
			if !k.deferReclaim(ctx, key, psid, due) {
				due = 0
			}
			return ReclaimResult{Kept: KeptTouched, RetryAt: due}, nil
		}
		tok := row.Reclaiming
		if tok == "" {
			tok = newToken()
			err := k.tombstone(ctx, row, p.idleBefore, tok)
			if errors.Is(err, contract.ErrConflict) {
				// Changed since it was read (a touch, a snapshot, another reclaim): decide
				// again on the row as it is now.
				cur, err := k.st.Instances().GetRow(ctx, key)
				if err != nil {
					return ReclaimResult{}, fmt.Errorf("read row: %w", err)
				}
				if cur == nil || cur.ProviderSandboxID != psid {
					return ReclaimResult{}, nil
				}
				row, p = cur, k.planIdle(ctx, cur, except)
				continue
			}
			if err != nil {
				return ReclaimResult{}, err
			}
		}
		done := *row
		done.Reclaiming = tok
		return ReclaimResult{}, k.FinishReclaim(ctx, &done)
	}
}

// FinishReclaim finishes the reclaim row is tombstoned with (row.Reclaiming): destroy its
// sandbox through the row's provider, delete its snapshots (nothing can restore from them
// once the row is gone), delete the row. Any failure keeps the tombstone, so a later
// sweep retries it; a row a starter already finished (and replaced) is no failure.
func (k *Keeper) FinishReclaim(ctx context.Context, row *contract.InstanceRow) error {
	prov := k.providers[row.Provider]
	if prov == nil {
		return fmt.Errorf("no provider named %q configured", row.Provider)
	}
	err := k.completeReclaim(ctx, prov, row.Key, row.ProviderSandboxID, row.Reclaiming, true)
	if errors.Is(err, contract.ErrConflict) {
		return nil
	}
	return err
}

// tombstone marks row reclaiming with tok, conditioned on the updatedAt it was read with
// and on being idle before idleBefore; ErrConflict (wrapped) when the row changed.
func (k *Keeper) tombstone(ctx context.Context, row *contract.InstanceRow, idleBefore int64, tok string) error {
	err := k.st.Instances().MarkReclaiming(ctx, row.Key, row.ProviderSandboxID, row.UpdatedAt, idleBefore, tok)
	if err != nil {
		return fmt.Errorf("mark reclaiming: %w", err)
	}
	return nil
}

// idleBefore is the full touch guard at now: a row touched after it (within the driver
// lease + margin) may serve a run the lagging index does not show yet.
func (k *Keeper) idleBefore(now int64) int64 {
	return now - k.leaseMs() - k.cfg.ReclaimMargin.Milliseconds()
}

// touchGuard returns idleBefore for tombstoning row: a row touched after it is kept,
// because a run the index does not show yet may be using it. The guard is the driver lease
// + margin, except when the row's last touch was by except (the run being ended) or by a
// run that has ended: then only the margin, since every other run that touched the row
// before that touch was stamped with the key earlier still (a start stamps its run first),
// and the index has had the margin to show it.
func (k *Keeper) touchGuard(ctx context.Context, row *contract.InstanceRow, except string) (int64, error) {
	now := k.nowMs()
	full := k.idleBefore(now)
	short := now - k.cfg.ReclaimMargin.Milliseconds()
	last := row.LatestRunID
	switch {
	case row.UpdatedAt <= full || last == "":
		return full, nil
	case last == except:
		return short, nil
	}
	st, err := k.st.Runs().State(ctx, last)
	if err != nil {
		return 0, err
	}
	if st == nil || st.Status.Terminal() {
		return short, nil
	}
	return full, nil
}

// deferReclaim records (due > 0) or drops (due 0) a deferred reclaim on the row; a refusal
// (the row moved on, or is tombstoned) or a failure is logged, never fatal: it reports
// whether the row now says what was asked.
func (k *Keeper) deferReclaim(ctx context.Context, key, psid string, due int64) bool {
	err := k.st.Instances().DeferReclaim(ctx, key, psid, due)
	if err != nil && !errors.Is(err, contract.ErrConflict) {
		k.cfg.Logger.WarnContext(ctx, "keeper: recording a deferred reclaim failed", "key", key, "due", due, "err", err)
	}
	return err == nil
}

// DropDeferredReclaim drops a deferred reclaim from the row at key naming psid (a touch
// cancelled it, or the row was listed for its stale snapshots); best effort, logged.
func (k *Keeper) DropDeferredReclaim(ctx context.Context, key, psid string) {
	k.deferReclaim(ctx, key, psid, 0)
}

// checkInUse asks whether another non-terminal run uses the key of a row past max age:
// yes keeps the row (it is resumed anyway).
func (k *Keeper) checkInUse(ctx, lctx context.Context, pl *startPlan) (answer, error) {
	inUse, err := KeyInUse(lctx, k.st.Runs(), pl.key, pl.runID)
	if err != nil {
		return unknown, fmt.Errorf("keeper: start %q: in-use check: %w", pl.runID, err)
	}
	if inUse {
		k.cfg.Logger.InfoContext(ctx, "keeper: sandbox past max age is in use; resuming it",
			"runId", pl.runID, "key", pl.key)
		return yes, nil
	}
	return no, nil
}

// reclaimExpired reclaims a row past max age: tombstone it (conditional on the row being
// unchanged and idle), destroy its sandbox, delete it. A refused tombstone loses the round.
func (k *Keeper) reclaimExpired(ctx, lctx context.Context, pl *startPlan, row *contract.InstanceRow, idleBefore int64) error {
	tok := newToken()
	err := k.tombstone(lctx, row, idleBefore, tok)
	if errors.Is(err, contract.ErrConflict) {
		return errRoundLost
	}
	if err != nil {
		return fmt.Errorf("keeper: start %q: %w", pl.runID, err)
	}
	if err := k.finishReclaim(ctx, pl, row.ProviderSandboxID, tok); err != nil {
		return err
	}
	k.cfg.Logger.InfoContext(ctx, "keeper: reclaimed a sandbox past max age",
		"runId", pl.runID, "key", pl.key, "providerSandboxId", row.ProviderSandboxID)
	return nil
}

// KeyInUse reports whether a non-terminal run other than except is stamped with sandbox
// key; every index hit is re-read consistently, since the index may lag. The keeper's
// max-age reclaim and the reaper's reclaims share it. runs is the store layer's
// (shared/store), which repeats a failed call.
func KeyInUse(ctx context.Context, runs contract.FencedRuns, key, except string) (bool, error) {
	user, err := KeyUser(ctx, runs, key, except)
	return user != "", err
}

// KeyUser is KeyInUse naming the run: the id of a non-terminal run other than except
// stamped with key, "" when there is none.
func KeyUser(ctx context.Context, runs contract.FencedRuns, key, except string) (string, error) {
	ids, err := runs.RunsUsingKey(ctx, key)
	if err != nil {
		return "", err
	}
	for _, id := range ids {
		if id == except {
			continue
		}
		st, err := runs.State(ctx, id)
		if err != nil {
			return "", err
		}
		if st != nil && !st.Status.Terminal() && st.SandboxKey != nil && *st.SandboxKey == key {
			return id, nil
		}
	}
	return "", nil
}

// finishReclaim completes a start's reclaim: destroy (its own timeout), then delete the
// tombstone. A failed destroy keeps the tombstone (retried later) and fails the start as
// unavailable; a failed snapshot delete does not fail it (a leftover snapshot is not worth
// it). The tombstone deleted by another (ErrConflict) makes the round decide again.
func (k *Keeper) finishReclaim(ctx context.Context, pl *startPlan, psid, token string) error {
	err := k.completeReclaim(ctx, pl.prov, pl.key, psid, token, false)
	if errors.Is(err, contract.ErrConflict) {
		return errRoundLost
	}
	if err != nil {
		return fmt.Errorf("keeper: reclaim %s: %w", pl.key, err)
	}
	return nil
}

// completeReclaim destroys psid through prov, deletes the snapshots of the row at key
// tombstoned with tok and deletes the row. A failed destroy keeps the tombstone
// (ErrUnavailable); so does a failed snapshot delete when strict (the reaper: every later
// sweep retries it), which otherwise is only logged. ErrConflict (wrapped): the tombstone
// was deleted by another (a starter finished the reclaim and may have written a new row).
func (k *Keeper) completeReclaim(ctx context.Context, prov contract.Provider, key, psid, tok string, strict bool) error {
	if err := Destroy(ctx, prov, psid, k.cfg.DestroyTimeout); err != nil {
		k.providerErr(context.WithoutCancel(ctx), prov, err)
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	dctx, cancel := detached(ctx, k.cfg.DestroyTimeout)
	defer cancel()
	if err := DeleteRowSnapshots(dctx, k.st.Instances(), prov, key, tok, k.cfg.DestroyTimeout); err != nil {
		if strict {
			return err
		}
		k.cfg.Logger.WarnContext(ctx, "keeper: deleting a reclaimed row's snapshots failed", "key", key, "err", err)
	}
	err := k.st.Instances().DeleteReclaimed(dctx, key, tok)
	if err != nil {
		return fmt.Errorf("delete row: %w", err)
	}
	return nil
}
