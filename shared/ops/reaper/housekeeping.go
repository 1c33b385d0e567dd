package reaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// errSandboxBusy: a stale intent's sandbox lock stayed held for the whole LockWait (a
// start is working on the key); the next sweep tries again.
var errSandboxBusy = errors.New("reaper: the sandbox lock is held")

// A chore is one housekeeping decision, made from reads only: what to do with a listed
// row or intent. A sweep carries it out (acting.chore); a dry run reports it as Planned
// (planning.chore).
type chore struct {
	kind        choreKind
	tenant, key string
	row         *contract.InstanceRow // as read (row chores)
}

// choreKind is what a chore does.
type choreKind int

// The chores.
const (
	deleteStaleSnapshots choreKind = iota + 1 // delete a row's superseded snapshots (a dry run skips them)
	finishTombstone                           // a tombstoned row: destroy its sandbox, delete the row
	noProvider                                // a tombstoned row no configured provider owns
	dropDeferral                              // a listed row with nothing deferred: clear the listing
	reclaimDeferred                           // a deferred reclaim now due: reclaim the row
	reclaimIdle                               // a row idle past the retention: reclaim it
	resolveStaleIntent                        // an intent older than the lock lease: resolve it
	stopIdle                                  // a row idle past the grace: stop its sandbox
)

// pendingReclaims finishes reclaims whose destroy failed or was interrupted, and retries
// the deferred ones that are due: every sweep does them first, so neither a failed destroy
// nor a deferred reclaim leaks for good.
func (r *Reaper) pendingReclaims(ctx context.Context, rep *Report, x executor) error {
	refs, err := r.st.Reaper().PendingReclaims(ctx, DefaultHousekeepingLimit)
	if err != nil {
		return fmt.Errorf("reaper: list pending reclaims: %w", err)
	}
	r.rereadRows(ctx, refs, rep, &rep.Swept.PendingReclaimsFailed, "a pending reclaim",
		func(tctx context.Context, ref contract.InstanceRef, row *contract.InstanceRow) {
			for _, c := range r.classifyPending(ref, row, rep) {
				x.chore(tctx, c, rep)
			}
		})
	return nil
}

// rereadRows re-reads each listed row under its tenant, consistently (a listing comes from
// an index that may lag), and hands fn the rows still there: a gone row is stale, a failed
// read counts in *failed and is logged as a re-read of what. It stops when ctx ends.
func (r *Reaper) rereadRows(ctx context.Context, refs []contract.InstanceRef, rep *Report, failed *int, what string,
	fn func(tctx context.Context, ref contract.InstanceRef, row *contract.InstanceRow)) {
	for _, ref := range refs {
		if ctx.Err() != nil {
			return
		}
		tctx := contract.WithTenant(ctx, ref.Tenant)
		row, err := r.st.Instances().GetRow(tctx, ref.Key)
		switch {
		case err != nil:
			*failed++
			r.kc.Logger.WarnContext(ctx, "reap: re-reading "+what+" failed", "tenant", ref.Tenant, "key", ref.Key, "err", err)
		case row == nil:
			rep.Swept.Stale++
		default:
			fn(tctx, ref, row)
		}
	}
}

// classifyPending decides what a listed pending row needs: its superseded snapshots
// deleted, then its tombstone finished, or its deferred reclaim retried once due (reclaimed,
// kept for a run that uses it, or deferred again). A row listed with nothing deferred (a
// touch cancelled it) has its listing cleared. Rows not due yet and cleared listings are
// counted here.
func (r *Reaper) classifyPending(ref contract.InstanceRef, row *contract.InstanceRow, rep *Report) []chore {
	mk := func(k choreKind) chore { return chore{kind: k, tenant: ref.Tenant, key: ref.Key, row: row} }
	var cs []chore
	if len(row.StaleSnapshots) > 0 {
		cs = append(cs, mk(deleteStaleSnapshots))
	}
	switch {
	case row.Reclaiming != "" && r.providers[row.Provider] == nil:
		return append(cs, mk(noProvider))
	case row.Reclaiming != "":
		return append(cs, mk(finishTombstone))
	case row.ReclaimDue == 0:
		rep.Swept.Stale++ // a touch cancelled it, or the listing was for stale snapshots
		return append(cs, mk(dropDeferral))
	case row.ReclaimDue > r.kc.Now().UnixMilli():
		rep.Swept.DeferredWaiting++
		return cs
	}
	return append(cs, mk(reclaimDeferred))
}

// idleInstances reclaims instance rows untouched for the retention with no non-terminal
// run stamped with their key.
func (r *Reaper) idleInstances(ctx context.Context, now int64, rep *Report, x executor) error {
	before := now - r.cfg.InstanceRetention.Milliseconds()
	refs, err := r.st.Reaper().IdleInstances(ctx, before, DefaultHousekeepingLimit)
	if err != nil {
		return fmt.Errorf("reaper: list idle instances: %w", err)
	}
	r.rereadRows(ctx, refs, rep, &rep.Swept.IdleFailed, "an idle instance",
		func(tctx context.Context, ref contract.InstanceRef, row *contract.InstanceRow) {
			if row.Reclaiming != "" || row.UpdatedAt > before {
				rep.Swept.Stale++ // pending (retried above) or touched since the listing
				return
			}
			x.chore(tctx, chore{kind: reclaimIdle, tenant: ref.Tenant, key: ref.Key, row: row}, rep)
		})
	return nil
}

// idleStops stops the sandboxes of up to IdleStopLimit rows listed idle past the grace
// (docs/design.md §5), each under its sandbox lock (keeper.StopIdle decides and acts
// there). It starts no stop once ctx's deadline less the margin is reached, so the sweep
// ends within its invocation; the rest are listed again by the next sweep.
func (r *Reaper) idleStops(ctx context.Context, now int64, rep *Report, x executor) error {
	before := now - r.cfg.IdleStop.Milliseconds()
	refs, err := r.st.Reaper().StopCandidates(ctx, before, r.cfg.IdleStopLimit)
	if err != nil {
		return fmt.Errorf("reaper: list idle sandboxes: %w", err)
	}
	for _, ref := range refs {
		if ctx.Err() != nil || r.runBudget(ctx) <= 0 {
			break
		}
		x.chore(contract.WithTenant(ctx, ref.Tenant), chore{kind: stopIdle, tenant: ref.Tenant, key: ref.Key}, rep)
	}
	return nil
}

// stopIdle stops c's idle sandbox under its sandbox lock, counting what it did.
func (r *Reaper) stopIdle(ctx context.Context, c chore, rep *Report) {
	var res keeper.StopResult
	err := r.lockWithin(ctx, "sandbox:"+c.key, errSandboxBusy, func(lctx context.Context) (err error) {
		res, err = r.k.StopIdle(lctx, c.key, r.cfg.IdleStop, r.kc.Now().UnixMilli())
		return err
	})
	lc := &rep.Lifecycle
	switch {
	case errors.Is(err, errSandboxBusy):
		lc.Busy++
		return
	case err != nil && res.Outcome == keeper.StopGone:
		// Settled gone: the error is the provider's not-found, no failure of the stop.
	case err != nil:
		res.Outcome = keeper.StopFailed
		r.kc.Logger.WarnContext(ctx, "reap: stopping an idle sandbox failed", "tenant", c.tenant, "key", c.key, "err", err)
	}
	switch res.Outcome {
	case keeper.StopStopped, keeper.StopDestroyed, keeper.StopFailed, keeper.StopUnsupported:
		lc.IdleRunning++ // running past the grace with no live run when the sweep decided (a gone one was not running)
	}
	switch res.Outcome {
	case keeper.StopStopped:
		lc.Stopped++
	case keeper.StopGone:
		lc.Gone++
	case keeper.StopArchived:
		lc.Archived++
	case keeper.StopDestroyed:
		lc.destroyedOneRun++
	case keeper.StopInUse, keeper.StopKept:
		lc.InUse++
	case keeper.StopNotDue:
		lc.NotDue++
	case keeper.StopUnsupported:
		lc.Unsupported++
	case keeper.StopStale:
		rep.Swept.Stale++
	default:
		lc.Failed++
	}
}

// staleIntents resolves intents older than the lock lease under sandbox:<key> (holding the
// lock proves their creator is gone): a row naming the sandbox → drop the intent; else
// destroy the orphan (recorded id, or Lookup by key), then drop it.
func (r *Reaper) staleIntents(ctx context.Context, now int64, rep *Report, x executor) error {
	before := now - r.cfg.LockLease.Milliseconds()
	refs, err := r.st.Reaper().StaleIntents(ctx, before, DefaultHousekeepingLimit)
	if err != nil {
		return fmt.Errorf("reaper: list stale intents: %w", err)
	}
	for _, ref := range refs {
		if ctx.Err() != nil {
			break
		}
		x.chore(contract.WithTenant(ctx, ref.Tenant), chore{kind: resolveStaleIntent, tenant: ref.Tenant, key: ref.Key}, rep)
	}
	return nil
}

// chore carries out c (a sweep's housekeeping), counting what it did.
func (a acting) chore(ctx context.Context, c chore, rep *Report) {
	switch c.kind {
	case deleteStaleSnapshots:
		a.staleSnapshots(ctx, c, rep)
	case dropDeferral:
		a.k.DropDeferredReclaim(ctx, c.key, c.row.ProviderSandboxID)
	case noProvider:
		rep.Swept.PendingReclaimsFailed++
	case finishTombstone:
		if err := a.k.FinishReclaim(ctx, c.row); err != nil {
			rep.Swept.PendingReclaimsFailed++
			a.kc.Logger.ErrorContext(ctx, "reap: retrying a pending reclaim failed", "tenant", c.tenant, "key", c.key, "err", err)
			return
		}
		rep.Swept.PendingReclaims++
	case reclaimDeferred:
		switch o, _, err := a.reclaim(ctx, c.row, ""); o {
		case SandboxKept:
			rep.Swept.DeferredKept++
		case SandboxReclaimFailed:
			rep.Swept.PendingReclaimsFailed++
			a.kc.Logger.ErrorContext(ctx, "reap: a deferred reclaim failed", "tenant", c.tenant, "key", c.key, "err", err)
		default:
			rep.Swept.DeferredReclaimed++
		}
	case reclaimIdle:
		switch o, _, err := a.reclaim(ctx, c.row, ""); o {
		case SandboxKept:
			rep.Swept.IdleInUse++
		case SandboxReclaimFailed:
			rep.Swept.IdleFailed++
			a.kc.Logger.ErrorContext(ctx, "reap: reclaiming an idle sandbox failed", "tenant", c.tenant, "key", c.key, "err", err)
		default:
			rep.Swept.IdleReclaimed++
		}
	case resolveStaleIntent:
		a.staleIntent(ctx, c, rep)
	case stopIdle:
		a.stopIdle(ctx, c, rep)
	}
}

// staleIntent resolves c's intent under its sandbox lock (deciding under the lock what to
// do: planIntent), counting what it did.
func (r *Reaper) staleIntent(ctx context.Context, c chore, rep *Report) {
	var destroyed bool
	err := r.lockWithin(ctx, "sandbox:"+c.key, errSandboxBusy, func(lctx context.Context) (err error) {
		destroyed, err = r.resolveIntent(lctx, c.key)
		return err
	})
	switch {
	case err != nil:
		rep.Swept.IntentsFailed++
		r.kc.Logger.WarnContext(ctx, "reap: resolving a stale intent failed", "tenant", c.tenant, "key", c.key, "err", err)
	case destroyed:
		rep.Swept.OrphansDestroyed++
	default:
		rep.Swept.IntentsDropped++
	}
}

// staleSnapshots deletes the snapshots newer ones superseded on row (their request's own
// delete failed or was cut short) through the row's provider, dropping each from the row
// once deleted; a provider that cannot delete snapshots has them dropped with a warning,
// so they are not listed for ever.
func (r *Reaper) staleSnapshots(ctx context.Context, ref chore, rep *Report) {
	row := ref.row
	del, ok := r.providers[row.Provider].(contract.SnapshotDeleter)
	for _, snap := range row.StaleSnapshots {
		if ctx.Err() != nil {
			return
		}
		var err error
		if ok {
			dctx, cancel := context.WithTimeout(ctx, r.kc.DestroyTimeout)
			err = del.DeleteSnapshot(dctx, snap)
			cancel()
		} else {
			r.kc.Logger.WarnContext(ctx, "reap: no configured provider can delete this superseded snapshot; forgetting it",
				"tenant", ref.tenant, "key", ref.key, "provider", row.Provider, "snapshotId", snap)
		}
		if err == nil {
			err = r.st.Instances().DropStaleSnapshot(ctx, ref.key, snap)
		}
		if err != nil {
			rep.Swept.SnapshotsFailed++
			r.kc.Logger.WarnContext(ctx, "reap: deleting a superseded snapshot failed", "tenant", ref.tenant, "key", ref.key, "snapshotId", snap, "err", err)
			continue
		}
		if ok {
			rep.Swept.SnapshotsDeleted++
		}
	}
	row.StaleSnapshots = nil
}

// intentPlan is what resolving a stale intent would do, decided from reads only.
type intentPlan struct {
	in     *contract.Intent // nil: no open intent any more
	prov   contract.Provider
	orphan string // the sandbox to destroy ("" = none: the row names it, it is gone, or none is known)
}

// planIntent reads key's open intent and row and decides: a sandbox the intent stands for
// (recorded id, or Lookup by key) that the row does not name and the provider does not
// report gone is an orphan.
func (r *Reaper) planIntent(ctx context.Context, key string) (intentPlan, error) {
	in, err := r.st.Intents().Get(ctx, key)
	if err != nil || in == nil {
		return intentPlan{}, err
	}
	row, err := r.st.Instances().GetRow(ctx, key)
	if err != nil {
		return intentPlan{}, err
	}
	p := intentPlan{in: in}
	switch {
	case row != nil:
		p.prov = r.providers[row.Provider]
	case len(r.kc.Providers) == 1:
		p.prov = r.kc.Providers[0]
	}
	orphan := in.ProviderSandboxID
	if orphan == "" && p.prov != nil {
		if lk, ok := p.prov.(contract.Lookuper); ok {
			pctx, cancel := context.WithTimeout(ctx, r.runBudget(ctx))
			id, found, err := lk.Lookup(pctx, key)
			cancel()
			if err != nil {
				return intentPlan{}, fmt.Errorf("lookup %s: %w", key, err)
			}
			if found {
				orphan = id
			}
		}
	}
	if orphan == "" || (row != nil && row.ProviderSandboxID == orphan) {
		return p, nil
	}
	if p.prov == nil {
		return intentPlan{}, errors.New("cannot tell which provider created the orphan")
	}
	if sr, ok := p.prov.(contract.StatusReader); ok {
		pctx, cancel := context.WithTimeout(ctx, r.runBudget(ctx))
		s, err := sr.Status(pctx, orphan)
		cancel()
		if err == nil && s == contract.SandboxGone {
			return p, nil // already gone (e.g. reclaimed with its row): nothing to destroy
		}
	}
	p.orphan = orphan
	return p, nil
}

// resolveIntent resolves key's open intent under its lock; destroyed reports an orphan.
func (r *Reaper) resolveIntent(ctx context.Context, key string) (destroyed bool, err error) {
	p, err := r.planIntent(ctx, key)
	if err != nil || p.in == nil {
		return false, err
	}
	if p.orphan != "" {
		// Bound by the lock's context, never detached from it: once the lease is lost a
		// starter may adopt this very sandbox through the intent.
		dctx, cancel := context.WithTimeout(ctx, r.kc.DestroyTimeout)
		err := p.prov.Destroy(dctx, p.orphan)
		cancel()
		if err != nil {
			return false, fmt.Errorf("destroy orphan %s: %w", p.orphan, err)
		}
		destroyed = true
	}
	err = r.st.Intents().Drop(ctx, key, p.in.Token)
	if err != nil && !errors.Is(err, contract.ErrConflict) {
		return destroyed, fmt.Errorf("drop intent: %w", err)
	}
	return destroyed, nil
}

// sweepJournals lists the journal directories of sandboxes this sweep kept for another run
// (bounded) and deletes the journals of terminal runs and of old orphans (SweepJournalDir).
func (r *Reaper) sweepJournals(ctx context.Context, now int64, kept []keptSandbox, rep *Report) {
	seen := map[keptSandbox]bool{}
	budget := DefaultJournalDeletes
	for _, ks := range kept {
		if seen[ks] || len(seen) >= DefaultJournalSandboxes || ctx.Err() != nil || budget <= 0 {
			continue
		}
		seen[ks] = true
		ex, ok := r.providers[ks.provider].(contract.Executor)
		if !ok {
			continue
		}
		tctx := contract.WithTenant(ctx, ks.tenant)
		js, err := SweepJournalDir(tctx, r.st.Runs(), ex, ks.psid, r.cfg.JournalDir, time.UnixMilli(now), budget)
		if err != nil {
			r.kc.Logger.WarnContext(ctx, "reap: sweeping journals failed", "providerSandboxId", ks.psid, "err", err)
		}
		rep.Swept.JournalSandboxes++
		rep.Swept.JournalsDeleted += len(js.Deleted)
		rep.Swept.JournalsKept += len(js.Kept) + len(js.Undecodable) + len(js.Foreign)
		budget -= len(js.Deleted)
	}
}

// The reasons a journal sweep keeps a run's journal.
const (
	KeptNonTerminal  = "non-terminal"      // the run is live (or paused)
	KeptOrphanRecent = "orphan-too-recent" // unknown to the store, younger than journal.OrphanAge
	KeptStoreError   = "store-error"       // the store could not say
	KeptDeleteFailed = "delete-failed"
	KeptMaxDeletes   = "max-deletes"
)

// KeptJournal is a journal a sweep left in place, and why.
type KeptJournal struct {
	RunID  string   `json:"runId"`
	Names  []string `json:"names"`
	Reason string   `json:"reason"`
}

// JournalSweep is what SweepJournalDir did.
type JournalSweep struct {
	Deleted     []string      `json:"deleted"` // run ids whose journal, sidecar and pid file were removed
	Kept        []KeptJournal `json:"kept"`
	Undecodable []string      `json:"undecodable"` // names left alone: nobody can tell whose they are
	Foreign     []string      `json:"foreign"`     // other tenants' names, never touched by this tenant's sweep
}

// SweepJournalDir sweeps one sandbox's journal directory (docs/design.md §6) in ctx's tenant: a terminal
// run's files are deleted, an unknown run's files only when all are older than
// journal.OrphanAge at now (real mtimes, self-witnessed listing); live runs, young orphans,
// store errors, undecodable names and other tenants' names are kept; at most maxDeletes runs
// are deleted. A listing failure deletes nothing. runs is the store layer's (shared/store),
// which repeats a failed call.
func SweepJournalDir(ctx context.Context, runs contract.FencedRuns, ex contract.Executor, psid, dir string, now time.Time, maxDeletes int) (JournalSweep, error) {
	js := JournalSweep{Deleted: []string{}, Kept: []KeptJournal{}, Undecodable: []string{}, Foreign: []string{}}
	l, err := journal.List(ctx, ex, psid, dir)
	if err != nil {
		return js, err
	}
	js.Undecodable = append(js.Undecodable, l.Undecodable...)
	js.Foreign = append(js.Foreign, l.Foreign...)
	cutoff := now.Add(-journal.OrphanAge)
	for _, e := range l.Runs {
		keep := func(reason string) {
			js.Kept = append(js.Kept, KeptJournal{RunID: e.RunID, Names: e.Names, Reason: reason})
		}
		if len(js.Deleted) >= maxDeletes {
			keep(KeptMaxDeletes)
			continue
		}
		rec, err := runs.State(ctx, e.RunID)
		switch {
		case err != nil:
			keep(KeptStoreError)
			continue
		case rec != nil && !rec.Status.Terminal():
			keep(KeptNonTerminal)
			continue
		case rec == nil && !e.OlderThan(cutoff):
			keep(KeptOrphanRecent)
			continue
		}
		if err := journal.Delete(ctx, ex, psid, dir, e.RunID); err != nil {
			keep(KeptDeleteFailed)
			continue
		}
		js.Deleted = append(js.Deleted, e.RunID)
	}
	return js, nil
}
