package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep/shared/contract"
)

const (
	// lockAttempts bounds how often a start re-acquires sandbox:<key> after losing its lease.
	lockAttempts = 3
	// lockRounds bounds how often one lock holder re-reads after a conditional write lost.
	lockRounds = 4
)

// errRoundLost: a conditional write under the lock met a writer that does not take the
// lock (the reaper, a fast-path touch); read again and decide again.
var errRoundLost = errors.New("instance row changed under the lock")

// lockedPath resolves the sandbox under WithLock("sandbox:"+key) (docs/design.md §4.1 step 3). A holder
// that loses its lease gives up what it cannot finish safely and queues for the lock again.
func (k *Keeper) lockedPath(ctx context.Context, pl *startPlan) (resolved, error) {
	for attempt := 1; ; attempt++ {
		var (
			res     resolved
			entered bool
		)
		err := k.st.Locks().WithLock(ctx, "sandbox:"+pl.key, func(lctx context.Context) error {
			entered = true
			var err error
			res, err = k.underLock(ctx, lctx, pl)
			return err
		})
		if entered && errors.Is(err, contract.ErrLeaseLost) {
			k.leaseLostSeen(ctx)
		}
		switch {
		case err == nil:
			return res, nil
		case !entered:
			return resolved{}, fmt.Errorf("keeper: start %q: lock sandbox:%s: %w: %w", pl.runID, pl.key, ErrUnavailable, err)
		case errors.Is(err, contract.ErrLeaseLost) && attempt < lockAttempts && ctx.Err() == nil:
			k.cfg.Logger.WarnContext(ctx, "keeper: lost the sandbox lock; queueing again",
				"runId", pl.runID, "key", pl.key, "attempt", attempt)
			continue
		}
		return resolved{}, err
	}
}

// leaseLost returns the error a holder reports once lctx is done: the cause (ErrLeaseLost
// or the caller's cancellation), so lockedPath can tell a lost lease from a gone caller.
func leaseLost(lctx context.Context, what string) error {
	return fmt.Errorf("keeper: %s: %w", what, context.Cause(lctx))
}

// underLock re-reads under the lock until one round decides; a round lost to a writer that
// does not take the lock is repeated (bounded).
func (k *Keeper) underLock(ctx, lctx context.Context, pl *startPlan) (resolved, error) {
	for round := 1; ; round++ {
		res, err := k.lockRound(ctx, lctx, pl)
		if !errors.Is(err, errRoundLost) {
			return res, err
		}
		if round == lockRounds {
			return resolved{}, fmt.Errorf("keeper: start %q: %w: %w", pl.runID, ErrUnavailable, err)
		}
	}
}

// lostRow handles a refused row write: the row is re-read. Carrying my incarnation, my
// write landed (a lost response); naming my sandbox, another writer recorded it for me:
// both are wins. Otherwise another writer won: my new sandbox is destroyed (nothing else
// can find it once its intent is dropped) and the round is lost, so the next one resumes
// the winner's sandbox — unless my lease is gone (lctx): a newer holder may be adopting
// that sandbox through its intent, so it is left to that holder (or the intent sweep).
func (k *Keeper) lostRow(ctx, lctx context.Context, pl *startPlan, rec contract.InstanceRecord, inc string,
	fence int64, putIntent bool, intent *contract.Intent) (contract.InstanceRecord, bool, error) {
	dctx, cancel := detached(ctx, k.cfg.DestroyTimeout)
	defer cancel()
	cur, err := k.st.Instances().GetRow(dctx, pl.key)
	if err != nil {
		// Unknown outcome: keep the sandbox; its intent (not dropped) keeps it findable.
		return rec, false, fmt.Errorf("keeper: start %q: re-read after a refused write: %w", pl.runID, err)
	}
	psid := rec.ProviderSandboxID
	switch classifyRefused(cur, inc, psid) {
	case refusedLanded:
		return rec, true, nil
	case refusedForMe:
		return cur.InstanceRecord, true, nil
	}
	if lctx.Err() != nil {
		return rec, false, leaseLost(lctx, "instance write refused")
	}
	k.cfg.Logger.WarnContext(ctx, "keeper: another writer won the instance row; destroying my sandbox",
		"runId", pl.runID, "key", pl.key, "providerSandboxId", psid)
	if err := k.destroy(ctx, pl.prov, psid); err != nil {
		// Keep the intent: the sandbox stays findable for the next holder or the reaper.
		return rec, false, fmt.Errorf("keeper: start %q: %w: %w", pl.runID, ErrUnavailable, err)
	}
	k.dropIntent(ctx, pl, fence, putIntent, intent)
	return rec, false, errRoundLost
}

// refusal is what a refused row write was, judged by the row read after it.
type refusal uint8

const (
	refusedLanded refusal = iota + 1 // the row carries my incarnation: my write landed (a lost response)
	refusedForMe                     // the row names my sandbox: another writer recorded it for me
	refusedLost                      // another writer won the row (or it is gone, or a tombstone)
)

// classifyRefused judges a refused write of a row naming psid with incarnation inc from
// cur, the row re-read after it (nil: none).
func classifyRefused(cur *contract.InstanceRow, inc, psid string) refusal {
	switch {
	case cur == nil:
		return refusedLost
	case cur.Incarnation == inc:
		return refusedLanded
	case cur.Reclaiming == "" && cur.ProviderSandboxID == psid:
		return refusedForMe
	}
	return refusedLost
}

// readUnderLock reads the row and the key's open intent (in parallel; both consistent).
func (k *Keeper) readUnderLock(lctx context.Context, key string) (*contract.InstanceRow, *contract.Intent, error) {
	if rd, ok := k.st.RowIntentReader(); ok {
		return rd.GetRowAndIntent(lctx, key)
	}
	var (
		g      errgroup.Group
		row    *contract.InstanceRow
		intent *contract.Intent
	)
	g.Go(func() (err error) {
		row, err = k.st.Instances().GetRow(lctx, key)
		return err
	})
	g.Go(func() (err error) {
		intent, err = k.st.Intents().Get(lctx, key)
		return err
	})
	err := g.Wait()
	return row, intent, err
}

// destroy destroys psid with its own timeout, independent of the caller's context (which
// may be cancelled already: a lost lease must still clean up).
func (k *Keeper) destroy(ctx context.Context, prov contract.Provider, psid string) error {
	// The destroy runs detached from ctx, so ctx's cancellation does not excuse a failure.
	if err := k.providerErr(context.WithoutCancel(ctx), prov, Destroy(ctx, prov, psid, k.cfg.DestroyTimeout)); err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	return nil
}

// Destroy destroys psid with its own timeout, detached from ctx's cancellation: a cleanup
// (after a lost lease, a cancelled request, a spent run budget) must still run.
func Destroy(ctx context.Context, prov contract.Provider, psid string, timeout time.Duration) error {
	dctx, cancel := detached(ctx, timeout)
	defer cancel()
	if err := prov.Destroy(dctx, psid); err != nil {
		return fmt.Errorf("destroy %s: %w", psid, err)
	}
	return nil
}

// openIntent announces a restore/create under the lock (token = the lock's fence). An
// intent with a higher token means a newer holder exists: this one lost its lease.
func (k *Keeper) openIntent(lctx context.Context, pl *startPlan, fence int64) error {
	if lctx.Err() != nil {
		return leaseLost(lctx, "before the intent")
	}
	err := k.st.Intents().Put(lctx, pl.key, fence, pl.now)
	switch {
	case errors.Is(err, contract.ErrConflict):
		return fmt.Errorf("keeper: start %q: a newer lock holder opened an intent: %w", pl.runID, contract.ErrLeaseLost)
	case err != nil && lctx.Err() != nil:
		return leaseLost(lctx, "put intent")
	case err != nil:
		return fmt.Errorf("keeper: start %q: put intent: %w", pl.runID, err)
	}
	return nil
}

// makeSandbox restores from snapshot (when given and the provider can) or creates; a
// vanished snapshot falls back to create. Provider failures are transient (ErrUnavailable).
func (k *Keeper) makeSandbox(lctx context.Context, pl *startPlan, snapshot string) (id string, restored bool, err error) {
	if lctx.Err() != nil {
		return "", false, leaseLost(lctx, "before create")
	}
	// Each provider call gets its own deadline (a lost lease, lctx, still ends it sooner). A
	// call cut short may still have made a sandbox: the open intent (no id recorded yet)
	// makes the next holder find it by Lookup(key).
	bounded := func() (context.Context, context.CancelFunc) { return context.WithTimeout(lctx, k.cfg.CreateTimeout) }
	in := contract.CreateInput{Name: pl.key, Workspace: pl.workspace, Env: pl.env}
	if rs, ok := pl.prov.(contract.Restorer); ok && snapshot != "" {
		in.SnapshotID = snapshot
		cctx, cancel := bounded()
		id, err := rs.Restore(cctx, in)
		cancel()
		err = k.providerErr(lctx, pl.prov, err)
		switch {
		case err == nil:
			return id, true, nil
		case lctx.Err() != nil:
			return "", false, leaseLost(lctx, "restore")
		case !errors.Is(err, contract.ErrSandboxGone):
			return "", false, fmt.Errorf("keeper: start %q: restore %s: %w: %w", pl.runID, snapshot, ErrUnavailable, err)
		}
		in.SnapshotID = "" // the snapshot is gone: create afresh
	}
	cctx, cancel := bounded()
	defer cancel()
	id, err = pl.prov.Create(cctx, in)
	err = k.providerErr(lctx, pl.prov, err)
	switch {
	case err == nil:
		return id, false, nil
	case lctx.Err() != nil:
		return "", false, leaseLost(lctx, "create")
	}
	return "", false, fmt.Errorf("keeper: start %q: create: %w: %w", pl.runID, ErrUnavailable, err)
}

// recordIntent records the new sandbox on the intent. Refused (another token holds the
// intent): a newer holder took over and nothing will ever find this sandbox, so it is
// destroyed. Any other failure is logged: the row write records the sandbox anyway.
func (k *Keeper) recordIntent(ctx context.Context, pl *startPlan, fence int64, id string) error {
	dctx, cancel := detached(ctx, k.cfg.DestroyTimeout)
	defer cancel()
	err := k.st.Intents().Record(dctx, pl.key, fence, id)
	if errors.Is(err, contract.ErrConflict) {
		k.cfg.Logger.WarnContext(ctx, "keeper: superseded while creating; destroying the new sandbox",
			"runId", pl.runID, "key", pl.key, "providerSandboxId", id)
		if derr := k.destroy(ctx, pl.prov, id); derr != nil {
			k.cfg.Logger.ErrorContext(ctx, "keeper: destroy of a superseded sandbox failed",
				"key", pl.key, "providerSandboxId", id, "error", derr.Error())
		}
		return fmt.Errorf("keeper: start %q: a newer lock holder owns the intent: %w", pl.runID, contract.ErrLeaseLost)
	}
	if err != nil {
		k.cfg.Logger.WarnContext(ctx, "keeper: could not record the new sandbox on its intent",
			"runId", pl.runID, "key", pl.key, "error", err.Error())
	}
	return nil
}

// writeRow writes rec create-if-absent (no row read) or replace-if-unchanged (against the
// row read), stamped with a fresh incarnation that every retry reuses.
func (k *Keeper) writeRow(lctx context.Context, rec contract.InstanceRecord, read *contract.InstanceRow) (inc string, err error) {
	inc = newToken()
	rows := k.st.Instances()
	if read == nil {
		return inc, rows.CreateRow(lctx, rec, inc)
	}
	return inc, rows.ReplaceRow(lctx, rec, read.Incarnation, inc)
}

// dropIntent drops the intent this round put (or, when it put none, the one it found and
// resolved). Best effort: the reaper resolves intents left behind.
func (k *Keeper) dropIntent(ctx context.Context, pl *startPlan, fence int64, put bool, found *contract.Intent) {
	var token int64
	switch {
	case put:
		token = fence
	case found != nil:
		token = found.Token
	default:
		return
	}
	dctx, cancel := detached(ctx, k.cfg.DestroyTimeout)
	defer cancel()
	err := k.st.Intents().Drop(dctx, pl.key, token)
	if err != nil && !errors.Is(err, contract.ErrConflict) {
		k.cfg.Logger.WarnContext(ctx, "keeper: could not drop the intent", "key", pl.key, "error", err.Error())
	}
}
