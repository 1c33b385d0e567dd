package reaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/journal"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// pendingReclaims finishes reclaims whose destroy failed or was interrupted: every sweep
// retries them first, so a failed destroy never leaks for good.
func (r *Reaper) pendingReclaims(ctx context.Context, rep *Report) error {
	refs, err := retry(ctx, func() ([]sandbox.InstanceRef, error) {
		return r.cfg.Backend.Reaper().PendingReclaims(ctx, DefaultHousekeepingLimit)
	})
	if err != nil {
		return fmt.Errorf("reaper: list pending reclaims: %w", err)
	}
	for _, ref := range refs {
		if ctx.Err() != nil {
			break
		}
		tctx := sandbox.WithTenant(ctx, ref.Tenant)
		row, err := retry(tctx, func() (*sandbox.InstanceRow, error) { return r.cfg.Backend.Instances().GetRow(tctx, ref.Key) })
		if err != nil || row == nil || row.Reclaiming == "" {
			if err != nil {
				rep.Swept.PendingReclaimsFailed++
			} else {
				rep.Swept.Stale++
			}
			continue
		}
		prov := r.providers[row.Provider]
		if prov == nil {
			rep.Swept.PendingReclaimsFailed++
			continue
		}
		if o, err := r.finishReclaim(tctx, prov, ref.Key, row.ProviderSandboxID, row.Reclaiming); o == ReclaimFailed {
			rep.Swept.PendingReclaimsFailed++
			r.cfg.Logger.ErrorContext(ctx, "reap: retrying a pending reclaim failed", "tenant", ref.Tenant, "key", ref.Key, "err", err)
			continue
		}
		rep.Swept.PendingReclaims++
	}
	return nil
}

// idleInstances reclaims instance rows untouched for the retention with no non-terminal
// run stamped with their key.
func (r *Reaper) idleInstances(ctx context.Context, now int64, rep *Report) error {
	before := now - r.cfg.InstanceRetention.Milliseconds()
	refs, err := retry(ctx, func() ([]sandbox.InstanceRef, error) {
		return r.cfg.Backend.Reaper().IdleInstances(ctx, before, DefaultHousekeepingLimit)
	})
	if err != nil {
		return fmt.Errorf("reaper: list idle instances: %w", err)
	}
	for _, ref := range refs {
		if ctx.Err() != nil {
			break
		}
		tctx := sandbox.WithTenant(ctx, ref.Tenant)
		row, err := retry(tctx, func() (*sandbox.InstanceRow, error) { return r.cfg.Backend.Instances().GetRow(tctx, ref.Key) })
		switch {
		case err != nil:
			rep.Swept.IdleFailed++
			continue
		case row == nil || row.Reclaiming != "" || row.UpdatedAt > before:
			rep.Swept.Stale++ // gone, pending (retried above) or touched since the listing
			continue
		}
		switch o, err := r.reclaim(tctx, ref.Key, row.ProviderSandboxID, ""); o {
		case InUse:
			rep.Swept.IdleInUse++
		case ReclaimFailed:
			rep.Swept.IdleFailed++
			r.cfg.Logger.ErrorContext(ctx, "reap: reclaiming an idle sandbox failed", "tenant", ref.Tenant, "key", ref.Key, "err", err)
		default:
			rep.Swept.IdleReclaimed++
		}
	}
	return nil
}

// staleIntents resolves intents older than the lock lease under sandbox:<key> (holding the
// lock proves their creator is gone): a row naming the sandbox → drop the intent; else
// destroy the orphan (recorded id, or Lookup by key), then drop it.
func (r *Reaper) staleIntents(ctx context.Context, now int64, rep *Report) error {
	before := now - r.cfg.LockLease.Milliseconds()
	refs, err := retry(ctx, func() ([]sandbox.IntentRef, error) {
		return r.cfg.Backend.Reaper().StaleIntents(ctx, before, DefaultHousekeepingLimit)
	})
	if err != nil {
		return fmt.Errorf("reaper: list stale intents: %w", err)
	}
	for _, ref := range refs {
		if ctx.Err() != nil {
			break
		}
		tctx := sandbox.WithTenant(ctx, ref.Tenant)
		wctx, cancel := context.WithTimeout(tctx, r.cfg.LockWait)
		var destroyed bool
		err := r.cfg.Backend.Locks().WithLock(wctx, "sandbox:"+ref.Key, func(lctx context.Context) (err error) {
			destroyed, err = r.resolveIntent(lctx, ref.Key)
			return err
		})
		cancel()
		switch {
		case err != nil:
			rep.Swept.IntentsFailed++
			r.cfg.Logger.WarnContext(ctx, "reap: resolving a stale intent failed", "tenant", ref.Tenant, "key", ref.Key, "err", err)
		case destroyed:
			rep.Swept.OrphansDestroyed++
		default:
			rep.Swept.IntentsDropped++
		}
	}
	return nil
}

// resolveIntent resolves key's open intent under its lock; destroyed reports an orphan.
func (r *Reaper) resolveIntent(ctx context.Context, key string) (destroyed bool, err error) {
	in, err := retry(ctx, func() (*sandbox.Intent, error) { return r.cfg.Backend.Intents().Get(ctx, key) })
	if err != nil || in == nil {
		return false, err
	}
	row, err := retry(ctx, func() (*sandbox.InstanceRow, error) { return r.cfg.Backend.Instances().GetRow(ctx, key) })
	if err != nil {
		return false, err
	}
	var prov sandbox.Provider
	switch {
	case row != nil:
		prov = r.providers[row.Provider]
	case len(r.cfg.Providers) == 1:
		prov = r.cfg.Providers[0]
	}
	orphan := in.ProviderSandboxID
	if orphan == "" && prov != nil {
		if lk, ok := prov.(sandbox.Lookuper); ok {
			id, found, err := lk.Lookup(ctx, key)
			if err != nil {
				return false, fmt.Errorf("lookup %s: %w", key, err)
			}
			if found {
				orphan = id
			}
		}
	}
	if orphan != "" && (row == nil || row.ProviderSandboxID != orphan) {
		if prov == nil {
			return false, errors.New("cannot tell which provider created the orphan")
		}
		if sr, ok := prov.(sandbox.StatusReader); ok {
			if s, err := sr.Status(ctx, orphan); err == nil && s == sandbox.SandboxGone {
				orphan = "" // already gone (e.g. reclaimed with its row): nothing to destroy
			}
		}
	}
	if orphan != "" && (row == nil || row.ProviderSandboxID != orphan) {
		dctx, cancel := context.WithTimeout(ctx, r.cfg.DestroyTimeout)
		err := prov.Destroy(dctx, orphan)
		cancel()
		if err != nil {
			return false, fmt.Errorf("destroy orphan %s: %w", orphan, err)
		}
		destroyed = true
	}
	err = retry0(ctx, func() error { return r.cfg.Backend.Intents().Drop(ctx, key, in.Token) })
	if err != nil && !errors.Is(err, sandbox.ErrConflict) {
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
		ex, ok := r.providers[ks.provider].(sandbox.Executor)
		if !ok {
			continue
		}
		tctx := sandbox.WithTenant(ctx, ks.tenant)
		js, err := SweepJournalDir(tctx, r.cfg.Backend.Runs(), ex, ks.psid, r.cfg.JournalDir, time.UnixMilli(now), budget)
		if err != nil {
			r.cfg.Logger.WarnContext(ctx, "reap: sweeping journals failed", "providerSandboxId", ks.psid, "err", err)
		}
		rep.Swept.JournalSandboxes++
		rep.Swept.JournalsDeleted += len(js.Deleted)
		rep.Swept.JournalsKept += len(js.Kept) + len(js.Undecodable)
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
}

// SweepJournalDir sweeps one sandbox's journal directory (§6) in ctx's tenant: a terminal
// run's files are deleted, an unknown run's files only when all are older than
// journal.OrphanAge at now (real mtimes, self-witnessed listing); live runs, young orphans,
// store errors and undecodable names are kept; at most maxDeletes runs are deleted. A
// listing failure deletes nothing.
func SweepJournalDir(ctx context.Context, runs sandbox.RunStore, ex sandbox.Executor, psid, dir string, now time.Time, maxDeletes int) (JournalSweep, error) {
	js := JournalSweep{Deleted: []string{}, Kept: []KeptJournal{}, Undecodable: []string{}}
	l, err := journal.List(ctx, ex, psid, dir)
	if err != nil {
		return js, err
	}
	js.Undecodable = append(js.Undecodable, l.Undecodable...)
	cutoff := now.Add(-journal.OrphanAge)
	for _, e := range l.Runs {
		keep := func(reason string) {
			js.Kept = append(js.Kept, KeptJournal{RunID: e.RunID, Names: e.Names, Reason: reason})
		}
		if len(js.Deleted) >= maxDeletes {
			keep(KeptMaxDeletes)
			continue
		}
		rec, err := retry(ctx, func() (*sandbox.RunRecord, error) { return runs.Get(ctx, e.RunID) })
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
