package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep/shared/sandbox"
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
		err := k.cfg.Backend.Locks().WithLock(ctx, "sandbox:"+pl.key, func(lctx context.Context) error {
			entered = true
			var err error
			res, err = k.underLock(ctx, lctx, pl)
			return err
		})
		if entered && errors.Is(err, sandbox.ErrLeaseLost) {
			k.leaseLostSeen(ctx)
		}
		switch {
		case err == nil:
			return res, nil
		case !entered:
			return resolved{}, fmt.Errorf("keeper: start %q: lock sandbox:%s: %w: %w", pl.runID, pl.key, ErrUnavailable, err)
		case errors.Is(err, sandbox.ErrLeaseLost) && attempt < lockAttempts && ctx.Err() == nil:
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

// lockRound is one decision under the lock: finish a pending reclaim; adopt an open
// intent's sandbox; resume the row's sandbox (or reclaim it past max age); restore; create.
// Then write the row conditionally against what this round read, and drop the intent.
func (k *Keeper) lockRound(ctx, lctx context.Context, pl *startPlan) (resolved, error) {
	pl.now = k.nowMs() // the lock wait may have been long: age and stamp with the time now
	row, intent, err := k.readUnderLock(lctx, pl.key)
	if err != nil {
		if lctx.Err() != nil {
			return resolved{}, leaseLost(lctx, "read under the lock")
		}
		return resolved{}, fmt.Errorf("keeper: start %q: %w", pl.runID, err)
	}
	if row != nil && row.Reclaiming != "" {
		if err := k.finishReclaim(ctx, pl, row.ProviderSandboxID, row.Reclaiming); err != nil {
			return resolved{}, err
		}
		row = nil
	}

	var (
		rec     sandbox.InstanceRecord // what the row will say
		outcome Outcome
		touch   bool // only the row's own sandbox was resumed: Touch instead of a full write
		found   bool
	)
	base := func(psid string) sandbox.InstanceRecord {
		r := sandbox.InstanceRecord{Key: pl.key, Provider: pl.prov.Name(), ProviderSandboxID: psid,
			ThreadID: pl.threadID, LatestRunID: pl.runID, UpdatedAt: pl.now}
		if row != nil {
			r.LatestSnapshotID = row.LatestSnapshotID
		}
		return r
	}

	// An open intent: a starter created (or was creating) a sandbox and never wrote the
	// row. Its sandbox is resumed before anything is created, so a crash cannot orphan it —
	// unless the row names another sandbox that is alive: then the row won after the intent
	// was opened (a stale holder lost), and the intent's sandbox is the orphan.
	rowAlive, keepIntent := false, false
	if intent != nil {
		id, err := k.intentSandbox(lctx, pl, intent)
		if err != nil {
			return resolved{}, err
		}
		if id != "" && (row == nil || row.ProviderSandboxID != id) {
			if row != nil {
				switch err := k.resume(lctx, pl, row.ProviderSandboxID); {
				case err == nil:
					rowAlive = true
				case !errors.Is(err, sandbox.ErrSandboxGone):
					return resolved{}, fmt.Errorf("keeper: start %q: %w", pl.runID, err)
				}
			}
			if rowAlive {
				k.cfg.Logger.WarnContext(ctx, "keeper: destroying the orphan of an open intent; the row names a live sandbox",
					"runId", pl.runID, "key", pl.key, "providerSandboxId", id, "intentToken", intent.Token)
				if err := k.destroy(ctx, pl.prov, id); err != nil {
					keepIntent = true // the reaper (or the next start) retries the destroy
					k.cfg.Logger.ErrorContext(ctx, "keeper: destroy of an intent's orphan failed",
						"key", pl.key, "providerSandboxId", id, "error", err.Error())
				}
			} else {
				switch err := k.resume(lctx, pl, id); {
				case err == nil:
					rec, outcome, found = base(id), OutcomeResumed, true
					if id == pl.made {
						outcome = pl.madeOutcome // our own sandbox, from before a lost lease
					}
					k.cfg.Logger.InfoContext(ctx, "keeper: adopted the sandbox of an open intent",
						"runId", pl.runID, "key", pl.key, "providerSandboxId", id, "intentToken", intent.Token)
				case !errors.Is(err, sandbox.ErrSandboxGone):
					return resolved{}, fmt.Errorf("keeper: start %q: %w", pl.runID, err)
				}
			}
		}
	}

	restoreFrom := ""
	if !found && row != nil && pl.tooOld(row.InstanceRecord) {
		reclaimed, err := k.expire(ctx, lctx, pl, row)
		if err != nil {
			return resolved{}, err
		}
		if reclaimed {
			row = nil // create afresh: an expired row is neither resumed nor restored
		}
	}
	if !found && row != nil {
		err := error(nil)
		if !rowAlive {
			err = k.resume(lctx, pl, row.ProviderSandboxID)
		}
		switch {
		case err == nil:
			rec, outcome, found, touch = base(row.ProviderSandboxID), OutcomeResumed, true, true
		case errors.Is(err, sandbox.ErrSandboxGone):
			if _, ok := pl.prov.(sandbox.Restorer); ok {
				restoreFrom = row.LatestSnapshotID
			}
		default:
			return resolved{}, fmt.Errorf("keeper: start %q: %w", pl.runID, err)
		}
	}

	// Restore or create: a new sandbox, announced by an intent first.
	fence := sandbox.LeaseFence(lctx)
	putIntent := false
	if !found {
		if err := k.openIntent(lctx, pl, fence); err != nil {
			return resolved{}, err
		}
		putIntent = true
		id, restored, err := k.makeSandbox(lctx, pl, restoreFrom)
		if err != nil {
			return resolved{}, err
		}
		if err := k.recordIntent(ctx, pl, fence, id); err != nil {
			return resolved{}, err
		}
		rec = base(id)
		if restored {
			outcome = OutcomeRestored // the row keeps the snapshot it was restored from
		} else {
			outcome, rec.LatestSnapshotID = OutcomeCreated, ""
		}
		pl.made, pl.madeOutcome = id, outcome
	}

	// The row write: conditional on what this round read, and only while the lease holds.
	if lctx.Err() != nil {
		// The intent (recorded) keeps the new sandbox findable; the next holder adopts it.
		return resolved{}, leaseLost(lctx, "before the instance write")
	}
	if touch {
		err = retry0(lctx, func() error {
			return k.cfg.Backend.Instances().Touch(lctx, pl.key, rec.ProviderSandboxID, pl.runID, pl.now)
		})
		if errors.Is(err, sandbox.ErrConflict) {
			return resolved{}, errRoundLost // nothing of ours to undo: decide again
		}
	} else {
		var inc string
		inc, err = k.writeRow(lctx, rec, row)
		if errors.Is(err, sandbox.ErrConflict) {
			var won bool
			if rec, won, err = k.lostRow(ctx, lctx, pl, rec, inc, fence, putIntent, intent); !won {
				return resolved{}, err
			}
		}
	}
	if err != nil {
		if lctx.Err() != nil {
			return resolved{}, leaseLost(lctx, "instance write")
		}
		return resolved{}, fmt.Errorf("keeper: start %q: write instance: %w", pl.runID, err)
	}
	// The intent this round put stays: it records the sandbox the row now names, so it is
	// settled, and the next locked start of the key or the reaper's intent sweep drops it.
	// Dropping it here would cost the created path a tenth call (docs/design.md §11 allows 9). An
	// intent found and resolved by this round is dropped now.
	if !keepIntent && !putIntent {
		k.dropIntent(ctx, pl, fence, false, intent)
	}
	return resolved{row: rec, outcome: outcome, recorded: true}, nil
}

// lostRow handles a refused row write: the row is re-read. Carrying my incarnation, my
// write landed (a lost response); naming my sandbox, another writer recorded it for me:
// both are wins. Otherwise another writer won: my new sandbox is destroyed (nothing else
// can find it once its intent is dropped) and the round is lost, so the next one resumes
// the winner's sandbox — unless my lease is gone (lctx): a newer holder may be adopting
// that sandbox through its intent, so it is left to that holder (or the intent sweep).
func (k *Keeper) lostRow(ctx, lctx context.Context, pl *startPlan, rec sandbox.InstanceRecord, inc string,
	fence int64, putIntent bool, intent *sandbox.Intent) (sandbox.InstanceRecord, bool, error) {
	dctx, cancel := detached(ctx, k.cfg.DestroyTimeout)
	defer cancel()
	cur, err := retry(dctx, func() (*sandbox.InstanceRow, error) { return k.cfg.Backend.Instances().GetRow(dctx, pl.key) })
	if err != nil {
		// Unknown outcome: keep the sandbox; its intent (not dropped) keeps it findable.
		return rec, false, fmt.Errorf("keeper: start %q: re-read after a refused write: %w", pl.runID, err)
	}
	psid := rec.ProviderSandboxID
	switch {
	case cur != nil && cur.Incarnation == inc:
		return rec, true, nil
	case cur != nil && cur.Reclaiming == "" && cur.ProviderSandboxID == psid:
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

// readUnderLock reads the row and the key's open intent (in parallel; both consistent).
func (k *Keeper) readUnderLock(lctx context.Context, key string) (*sandbox.InstanceRow, *sandbox.Intent, error) {
	if rd, ok := k.cfg.Backend.(sandbox.RowIntentReader); ok {
		type both struct {
			row    *sandbox.InstanceRow
			intent *sandbox.Intent
		}
		b, err := retry(lctx, func() (both, error) {
			row, intent, err := rd.GetRowAndIntent(lctx, key)
			return both{row, intent}, err
		})
		return b.row, b.intent, err
	}
	var (
		g      errgroup.Group
		row    *sandbox.InstanceRow
		intent *sandbox.Intent
	)
	g.Go(func() (err error) {
		row, err = retry(lctx, func() (*sandbox.InstanceRow, error) { return k.cfg.Backend.Instances().GetRow(lctx, key) })
		return err
	})
	g.Go(func() (err error) {
		intent, err = retry(lctx, func() (*sandbox.Intent, error) { return k.cfg.Backend.Intents().Get(lctx, key) })
		return err
	})
	err := g.Wait()
	return row, intent, err
}

// intentSandbox returns the sandbox an open intent stands for: its recorded id, else the
// provider's Lookup of the key ("" when neither knows one).
func (k *Keeper) intentSandbox(lctx context.Context, pl *startPlan, in *sandbox.Intent) (string, error) {
	if in.ProviderSandboxID != "" {
		return in.ProviderSandboxID, nil
	}
	lk, ok := pl.prov.(sandbox.Lookuper)
	if !ok {
		return "", nil
	}
	rctx, cancel := context.WithTimeout(lctx, k.cfg.ResumeTimeout)
	defer cancel()
	id, found, err := lk.Lookup(rctx, pl.key)
	err = k.providerErr(lctx, pl.prov, err)
	if err != nil {
		return "", fmt.Errorf("keeper: start %q: lookup %s: %w: %w", pl.runID, pl.key, ErrUnavailable, err)
	}
	if !found {
		return "", nil
	}
	return id, nil
}

// destroy destroys psid with its own timeout, independent of the caller's context (which
// may be cancelled already: a lost lease must still clean up).
func (k *Keeper) destroy(ctx context.Context, prov sandbox.Provider, psid string) error {
	// The destroy runs detached from ctx, so ctx's cancellation does not excuse a failure.
	if err := k.providerErr(context.WithoutCancel(ctx), prov, Destroy(ctx, prov, psid, k.cfg.DestroyTimeout)); err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	return nil
}

// Destroy destroys psid with its own timeout, detached from ctx's cancellation: a cleanup
// (after a lost lease, a cancelled request, a spent run budget) must still run.
func Destroy(ctx context.Context, prov sandbox.Provider, psid string, timeout time.Duration) error {
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
	err := retry0(lctx, func() error { return k.cfg.Backend.Intents().Put(lctx, pl.key, fence, pl.now) })
	switch {
	case errors.Is(err, sandbox.ErrConflict):
		return fmt.Errorf("keeper: start %q: a newer lock holder opened an intent: %w", pl.runID, sandbox.ErrLeaseLost)
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
	in := sandbox.CreateInput{Name: pl.key, Workspace: pl.workspace, Env: pl.env}
	if rs, ok := pl.prov.(sandbox.Restorer); ok && snapshot != "" {
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
		case !errors.Is(err, sandbox.ErrSandboxGone):
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
	err := retry0(dctx, func() error { return k.cfg.Backend.Intents().Record(dctx, pl.key, fence, id) })
	if errors.Is(err, sandbox.ErrConflict) {
		k.cfg.Logger.WarnContext(ctx, "keeper: superseded while creating; destroying the new sandbox",
			"runId", pl.runID, "key", pl.key, "providerSandboxId", id)
		if derr := k.destroy(ctx, pl.prov, id); derr != nil {
			k.cfg.Logger.ErrorContext(ctx, "keeper: destroy of a superseded sandbox failed",
				"key", pl.key, "providerSandboxId", id, "error", derr.Error())
		}
		return fmt.Errorf("keeper: start %q: a newer lock holder owns the intent: %w", pl.runID, sandbox.ErrLeaseLost)
	}
	if err != nil {
		k.cfg.Logger.WarnContext(ctx, "keeper: could not record the new sandbox on its intent",
			"runId", pl.runID, "key", pl.key, "error", err.Error())
	}
	return nil
}

// writeRow writes rec create-if-absent (no row read) or replace-if-unchanged (against the
// row read), stamped with a fresh incarnation that every retry reuses.
func (k *Keeper) writeRow(lctx context.Context, rec sandbox.InstanceRecord, read *sandbox.InstanceRow) (inc string, err error) {
	inc = newToken()
	rows := k.cfg.Backend.Instances()
	return inc, retry0(lctx, func() error {
		if read == nil {
			return rows.CreateRow(lctx, rec, inc)
		}
		return rows.ReplaceRow(lctx, rec, read.Incarnation, inc)
	})
}

// dropIntent drops the intent this round put (or, when it put none, the one it found and
// resolved). Best effort: the reaper resolves intents left behind.
func (k *Keeper) dropIntent(ctx context.Context, pl *startPlan, fence int64, put bool, found *sandbox.Intent) {
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
	err := retry0(dctx, func() error { return k.cfg.Backend.Intents().Drop(dctx, pl.key, token) })
	if err != nil && !errors.Is(err, sandbox.ErrConflict) {
		k.cfg.Logger.WarnContext(ctx, "keeper: could not drop the intent", "key", pl.key, "error", err.Error())
	}
}
