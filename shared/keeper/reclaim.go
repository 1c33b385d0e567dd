package keeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// idleBefore is the newest touch a row past max age may carry and be reclaimed at now: a
// row touched within the driver lease (+ margin) may serve a run the lagging index does
// not show yet (docs/design.md §2.1 mark-reclaiming).
func (k *Keeper) idleBefore(now int64) int64 { return now - k.leaseMs() - reclaimMarginMs }

// checkInUse asks whether another non-terminal run uses the key of a row past max age:
// yes keeps the row (it is resumed anyway).
func (k *Keeper) checkInUse(ctx, lctx context.Context, pl *startPlan) (answer, error) {
	inUse, err := KeyInUse(lctx, k.cfg.Backend.Runs(), pl.key, pl.runID)
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
func (k *Keeper) reclaimExpired(ctx, lctx context.Context, pl *startPlan, row *sandbox.InstanceRow, idleBefore int64) error {
	tok := newToken()
	err := retry0(lctx, func() error {
		return k.cfg.Backend.Instances().MarkReclaiming(lctx, pl.key, row.ProviderSandboxID, row.UpdatedAt, idleBefore, tok)
	})
	if errors.Is(err, sandbox.ErrConflict) {
		return errRoundLost
	}
	if err != nil {
		return fmt.Errorf("keeper: start %q: mark reclaiming: %w", pl.runID, err)
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
// max-age reclaim and the reaper's reclaims share it.
func KeyInUse(ctx context.Context, runs sandbox.FencedRuns, key, except string) (bool, error) {
	user, err := KeyUser(ctx, runs, key, except)
	return user != "", err
}

// KeyUser is KeyInUse naming the run: the id of a non-terminal run other than except
// stamped with key, "" when there is none.
func KeyUser(ctx context.Context, runs sandbox.FencedRuns, key, except string) (string, error) {
	ids, err := retry(ctx, func() ([]string, error) { return runs.RunsUsingKey(ctx, key) })
	if err != nil {
		return "", err
	}
	for _, id := range ids {
		if id == except {
			continue
		}
		st, err := retry(ctx, func() (*sandbox.RunState, error) { return runs.State(ctx, id) })
		if err != nil {
			return "", err
		}
		if st != nil && !st.Status.Terminal() && st.SandboxKey != nil && *st.SandboxKey == key {
			return id, nil
		}
	}
	return "", nil
}

// finishReclaim completes a reclaim: destroy (its own timeout), then delete the tombstone.
// A failed destroy keeps the tombstone (retried later) and fails the start as unavailable.
func (k *Keeper) finishReclaim(ctx context.Context, pl *startPlan, psid, token string) error {
	key := pl.key
	if err := k.destroy(ctx, pl.prov, psid); err != nil {
		return fmt.Errorf("keeper: reclaim %s: %w: %w", key, ErrUnavailable, err)
	}
	dctx, cancel := detached(ctx, k.cfg.DestroyTimeout)
	defer cancel()
	if err := DeleteRowSnapshots(dctx, k.cfg.Backend.Instances(), pl.prov, key, token, k.cfg.DestroyTimeout); err != nil {
		// The start goes on: a leftover snapshot is not worth failing it for.
		k.cfg.Logger.WarnContext(ctx, "keeper: deleting a reclaimed row's snapshots failed", "key", key, "err", err)
	}
	err := retry0(dctx, func() error { return k.cfg.Backend.Instances().DeleteReclaimed(dctx, key, token) })
	if errors.Is(err, sandbox.ErrConflict) {
		return errRoundLost
	}
	if err != nil {
		return fmt.Errorf("keeper: reclaim %s: delete row: %w", key, err)
	}
	return nil
}
