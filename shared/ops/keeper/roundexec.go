package keeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// maxRoundSteps bounds one round's steps; decideRound settles in at most seven (every
// non-final step runs at most once: round_test.go proves it over every view).
const maxRoundSteps = 16

// lockRound is one round under the lock: read the row and the intent, then decide and
// execute steps (round.go) until a final step has written the row.
func (k *Keeper) lockRound(ctx, lctx context.Context, pl *startPlan) (resolved, error) {
	v, err := k.readRound(lctx, pl)
	if err != nil {
		return resolved{}, err
	}
	for range maxRoundSteps {
		res, done, err := k.execute(ctx, lctx, pl, v, decideRound(v))
		if done || err != nil {
			return res, err
		}
	}
	return resolved{}, fmt.Errorf("keeper: start %q: the start decision did not settle in %d steps", pl.runID, maxRoundSteps)
}

// readRound reads the row and the key's open intent under the lock, stamped with the time
// now (the lock wait may have been long: age and stamp with the time now).
func (k *Keeper) readRound(lctx context.Context, pl *startPlan) (*roundView, error) {
	pl.now = k.nowMs()
	row, intent, err := k.readUnderLock(lctx, pl.key)
	if err == nil && row != nil && row.Lifecycle == contract.LifecycleStopping && row.Reclaiming == "" {
		// Under the lock nobody is stopping it: its stopper is gone (docs/design.md §5).
		if err = k.abandonStop(lctx, row); err == nil {
			row, intent, err = k.readUnderLock(lctx, pl.key)
		}
	}
	if err != nil {
		if lctx.Err() != nil {
			return nil, leaseLost(lctx, "read under the lock")
		}
		return nil, fmt.Errorf("keeper: start %q: %w", pl.runID, err)
	}
	_, canLookup := pl.prov.(contract.Lookuper)
	_, canRestore := pl.prov.(contract.Restorer)
	return &roundView{
		row: row, intent: intent, now: pl.now, maxAgeMs: pl.maxAgeMs,
		idleBefore: k.idleBefore(pl.now),
		canLookup:  canLookup, canRestore: canRestore, made: pl.made, madeOutcome: pl.madeOutcome,
	}, nil
}

// execute runs one step. A step that learns or cleans up records it in v (done=false); a
// final step writes the row (done=true with what the start resolved).
func (k *Keeper) execute(ctx, lctx context.Context, pl *startPlan, v *roundView, st roundStep) (resolved, bool, error) {
	var err error
	switch st.kind {
	case stepFinishReclaim:
		err = k.finishReclaim(ctx, pl, st.psid, st.token)
		v.row = nil
	case stepLookupIntent:
		v.lookedUp, err = k.lookupKey(lctx, pl)
		v.looked = true
	case stepProbeRow:
		v.rowAlive, err = k.probe(lctx, pl, st.psid)
	case stepProbeIntent:
		v.intentAlive, err = k.probe(lctx, pl, st.psid)
	case stepDestroyOrphan:
		v.keepIntent = !k.destroyOrphan(ctx, pl, v.intent, st.psid)
		v.orphanDone = true
	case stepCheckInUse:
		v.inUse, err = k.checkInUse(ctx, lctx, pl)
	case stepReclaimExpired:
		err = k.reclaimExpired(ctx, lctx, pl, v.row, v.idleBefore)
		v.row, v.reclaimed = nil, true
	case stepAdoptIntent:
		res, err := k.adoptIntent(ctx, lctx, pl, v, st)
		return res, true, err
	case stepResumeRow:
		res, err := k.resumeRow(ctx, lctx, pl, v, st.psid)
		return res, true, err
	case stepCreate:
		res, err := k.create(ctx, lctx, pl, v, st.snapshot)
		return res, true, err
	default:
		err = fmt.Errorf("keeper: start %q: no executor for step %v", pl.runID, st.kind)
	}
	return resolved{}, false, err
}

// lookupKey asks the provider's Lookup for the key's sandbox, for an open intent that
// recorded no id ("" when the provider knows none).
func (k *Keeper) lookupKey(lctx context.Context, pl *startPlan) (string, error) {
	lk, ok := pl.prov.(contract.Lookuper)
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

// probe resumes psid: yes alive, no gone; any other failure fails the start (transient).
func (k *Keeper) probe(lctx context.Context, pl *startPlan, psid string) (answer, error) {
	switch err := k.resume(lctx, pl, psid); {
	case err == nil:
		return yes, nil
	case errors.Is(err, contract.ErrSandboxGone):
		return no, nil
	default:
		return unknown, fmt.Errorf("keeper: start %q: %w", pl.runID, err)
	}
}

// destroyOrphan destroys the sandbox of an open intent whose row names another live
// sandbox; false when the destroy failed (the reaper, or the next start, retries it).
func (k *Keeper) destroyOrphan(ctx context.Context, pl *startPlan, in *contract.Intent, id string) bool {
	k.cfg.Logger.WarnContext(ctx, "keeper: destroying the orphan of an open intent; the row names a live sandbox",
		"runId", pl.runID, "key", pl.key, "providerSandboxId", id, "intentToken", in.Token)
	if err := k.destroy(ctx, pl.prov, id); err != nil {
		k.cfg.Logger.ErrorContext(ctx, "keeper: destroy of an intent's orphan failed",
			"key", pl.key, "providerSandboxId", id, "error", err.Error())
		return false
	}
	return true
}

// record is what the row will say once it names psid (keeping the snapshot of the row read).
func (v *roundView) record(pl *startPlan, psid string) contract.InstanceRecord {
	r := contract.InstanceRecord{Key: pl.key, Provider: pl.prov.Name(), ProviderSandboxID: psid,
		ThreadID: pl.threadID, LatestRunID: pl.runID, UpdatedAt: pl.now, DestroyOnEnd: pl.destroyOnEnd,
		DestroyOnCancel: pl.destroyOnCancel, IdleStopMs: pl.idleStopMs}
	if v.row != nil {
		r.LatestSnapshotID = v.row.LatestSnapshotID
	}
	return r
}

// adoptIntent makes the row name the live sandbox of an open intent, then drops the intent.
func (k *Keeper) adoptIntent(ctx, lctx context.Context, pl *startPlan, v *roundView, st roundStep) (resolved, error) {
	k.cfg.Logger.InfoContext(ctx, "keeper: adopted the sandbox of an open intent",
		"runId", pl.runID, "key", pl.key, "providerSandboxId", st.psid, "intentToken", v.intent.Token)
	rec, err := k.commitRow(ctx, lctx, pl, v, v.record(pl, st.psid), false)
	if err != nil {
		return resolved{}, err
	}
	k.settleIntent(ctx, pl, v)
	return resolved{row: rec, outcome: st.outcome, recorded: true}, nil
}

// resumeRow touches the row whose sandbox lives (only the run and the time change), then
// drops an intent the round found and resolved.
func (k *Keeper) resumeRow(ctx, lctx context.Context, pl *startPlan, v *roundView, psid string) (resolved, error) {
	if lctx.Err() != nil {
		return resolved{}, leaseLost(lctx, "before the instance write")
	}
	err := k.st.Instances().Touch(lctx, pl.key, psid, pl.runID, pl.now)
	if errors.Is(err, contract.ErrConflict) {
		return resolved{}, errRoundLost // nothing of ours to undo: decide again
	}
	if err != nil {
		return resolved{}, k.writeFailed(lctx, pl, err)
	}
	k.settleIntent(ctx, pl, v)
	return resolved{row: v.record(pl, psid), outcome: OutcomeResumed, recorded: true}, nil
}

// create restores from snapshot (when given) or creates a sandbox, announced by an intent
// (token = the lock's fence) and recorded on it, then writes the row. The intent stays: it
// names the sandbox the row now names, so it is settled, and the next locked start of the
// key or the reaper's intent sweep drops it — dropping it here would cost the created path
// a tenth call (docs/design.md §11 allows 9).
func (k *Keeper) create(ctx, lctx context.Context, pl *startPlan, v *roundView, snapshot string) (resolved, error) {
	fence := contract.LeaseFence(lctx)
	if err := k.openIntent(lctx, pl, fence); err != nil {
		return resolved{}, err
	}
	id, restored, err := k.makeSandbox(lctx, pl, snapshot)
	if err != nil {
		return resolved{}, err
	}
	if err := k.recordIntent(ctx, pl, fence, id); err != nil {
		return resolved{}, err
	}
	rec, outcome := v.record(pl, id), OutcomeRestored // a restore keeps the snapshot it came from
	if !restored {
		outcome, rec.LatestSnapshotID = OutcomeCreated, ""
	}
	pl.made, pl.madeOutcome = id, outcome
	if rec, err = k.commitRow(ctx, lctx, pl, v, rec, true); err != nil {
		return resolved{}, err
	}
	return resolved{row: rec, outcome: outcome, recorded: true}, nil
}

// commitRow writes rec conditionally on what the round read (create-if-absent or
// replace-if-unchanged), only while the lease holds; a refused write goes to lostRow.
// putIntent: the round put an intent for rec's sandbox.
func (k *Keeper) commitRow(ctx, lctx context.Context, pl *startPlan, v *roundView, rec contract.InstanceRecord, putIntent bool) (contract.InstanceRecord, error) {
	if lctx.Err() != nil {
		// The intent (recorded) keeps a new sandbox findable; the next holder adopts it.
		return rec, leaseLost(lctx, "before the instance write")
	}
	inc, err := k.writeRow(lctx, rec, v.row)
	if errors.Is(err, contract.ErrConflict) {
		var won bool
		if rec, won, err = k.lostRow(ctx, lctx, pl, rec, inc, contract.LeaseFence(lctx), putIntent, v.intent); !won {
			return rec, err
		}
	}
	if err != nil {
		return rec, k.writeFailed(lctx, pl, err)
	}
	return rec, nil
}

// writeFailed is the error of a failed row write: the lost lease when it caused it.
func (k *Keeper) writeFailed(lctx context.Context, pl *startPlan, err error) error {
	if lctx.Err() != nil {
		return leaseLost(lctx, "instance write")
	}
	return fmt.Errorf("keeper: start %q: write instance: %w", pl.runID, err)
}

// settleIntent drops the intent the round found and resolved, unless the destroy of its
// orphan failed (the intent keeps the orphan findable for a retry).
func (k *Keeper) settleIntent(ctx context.Context, pl *startPlan, v *roundView) {
	if !v.keepIntent {
		k.dropIntent(ctx, pl, 0, false, v.intent)
	}
}
