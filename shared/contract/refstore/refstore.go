// Package refstore builds the reference's store interfaces (contract.InstanceStore,
// contract.RunStore, contract.ThreadLister, contract.ReclaimableLister) on top of a
// contract.Backend, for parity with the reference: no operation calls them, so the backend
// contract does not ask for them (docs/design.md §2). Where a backend offers one of the
// reference interfaces itself (a type assertion on its Instances() or Runs()), the helper
// calls it; otherwise it derives the method from the contract and its optional
// capabilities, as gocloud's portable layer does above a driver.
package refstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

// maxRounds bounds the read-then-write rounds of a derived write that keeps losing to
// other writers; past it the last ErrConflict is returned.
const maxRounds = 64

// Instances returns the reference instance map over a backend's conditional instance rows.
func Instances(rows contract.InstanceRows) contract.InstanceStore {
	if own, ok := rows.(contract.InstanceStore); ok {
		return own
	}
	return instances{rows: rows}
}

type instances struct{ rows contract.InstanceRows }

// Get returns the record of key (its row without the version metadata); missing, or a
// tombstone (a pending reclaim, never resumed: docs/design.md §2.1): (nil, nil).
func (v instances) Get(ctx context.Context, key string) (*contract.InstanceRecord, error) {
	row, err := v.rows.GetRow(ctx, key)
	if err != nil || row == nil || row.Reclaiming != "" {
		return nil, err
	}
	rec := row.InstanceRecord
	return &rec, nil
}

// Upsert fully replaces the row at rec.Key with a fresh incarnation: CreateRow when absent,
// ReplaceRow over the incarnation read, and a pending reclaim is forgotten (its tombstone
// deleted first), like a DynamoDB PutItem. A lost race is read again.
func (v instances) Upsert(ctx context.Context, rec contract.InstanceRecord) error {
	var err error
	for range maxRounds {
		var row *contract.InstanceRow
		if row, err = v.rows.GetRow(ctx, rec.Key); err != nil {
			return err
		}
		switch {
		case row == nil:
			err = v.rows.CreateRow(ctx, rec, storecall.Token())
		case row.Reclaiming != "":
			err = v.rows.DeleteReclaimed(ctx, rec.Key, row.Reclaiming)
			if err == nil {
				err = contract.ErrConflict // the row is gone: create it next round
			}
		default:
			err = v.rows.ReplaceRow(ctx, rec, row.Incarnation, storecall.Token())
		}
		if !errors.Is(err, contract.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("refstore: upsert %q: %w", rec.Key, err)
}

// Delete removes key through the two-phase reclaim (MarkReclaiming at the row as read,
// then DeleteReclaimed; a pending reclaim is completed with its own token); a missing key
// is a no-op. A crash between the phases leaves a pending reclaim the reaper finishes.
func (v instances) Delete(ctx context.Context, key string) error {
	var err error
	for range maxRounds {
		var row *contract.InstanceRow
		if row, err = v.rows.GetRow(ctx, key); err != nil || row == nil {
			return err
		}
		token := row.Reclaiming
		if token == "" {
			token = storecall.Token()
			err = v.rows.MarkReclaiming(ctx, key, row.ProviderSandboxID, row.UpdatedAt, row.UpdatedAt, token)
		}
		if err == nil {
			err = v.rows.DeleteReclaimed(ctx, key, token)
		}
		if !errors.Is(err, contract.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("refstore: delete %q: %w", key, err)
}

// RunStore is the reference run store with its two listings.
type RunStore interface {
	contract.RunStore
	contract.ThreadLister
	contract.ReclaimableLister
}

// Runs returns the reference run store over a backend's fenced runs. Get reads State; FindActiveRun is the
// contract's; CreateOrResume and Update need contract.RunWriter (errors.ErrUnsupported
// without it); the listings walk contract.RunLister (errors.ErrUnsupported without it).
func Runs(fenced contract.FencedRuns) RunStore {
	return runs{runs: fenced}
}

type runs struct{ runs contract.FencedRuns }

// Get returns the run's record; unknown: (nil, nil).
func (v runs) Get(ctx context.Context, runID string) (*contract.RunRecord, error) {
	st, err := v.runs.State(ctx, runID)
	if err != nil || st == nil {
		return nil, err
	}
	return &st.RunRecord, nil
}

// FindActiveRun is the contract's.
func (v runs) FindActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	return v.runs.FindActiveRun(ctx, threadID)
}

// writer returns the backend's unfenced writes.
func (v runs) writer() (contract.RunWriter, error) {
	w, ok := v.runs.(contract.RunWriter)
	if !ok {
		return nil, fmt.Errorf("refstore: the backend's runs lack sandbox.RunWriter: %w", errors.ErrUnsupported)
	}
	return w, nil
}

// CreateOrResume is the backend's contract.RunWriter's.
func (v runs) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	w, err := v.writer()
	if err != nil {
		return contract.RunRecord{}, err
	}
	return w.CreateOrResume(ctx, in)
}

// Update is the backend's contract.RunWriter's.
func (v runs) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	w, err := v.writer()
	if err != nil {
		return err
	}
	return w.Update(ctx, runID, p)
}

// ListByThread returns every run of the thread, ascending startedAt (ties: runId): the
// backend's own when it has one, else the thread's RunLister pages, reversed.
func (v runs) ListByThread(ctx context.Context, threadID string) ([]contract.RunRecord, error) {
	if own, ok := v.runs.(contract.ThreadLister); ok {
		return own.ListByThread(ctx, threadID)
	}
	if err := contract.CheckStoreID("threadId", threadID); err != nil {
		return nil, err
	}
	out, err := v.walk(ctx, contract.RunFilter{ThreadID: threadID}, func(contract.RunState) bool { return true })
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b contract.RunRecord) int {
		return cmp.Or(cmp.Compare(a.StartedAt, b.StartedAt), cmp.Compare(a.RunID, b.RunID))
	})
	return out, nil
}

// ListReclaimable returns running runs with detachedSince <= now-ttlMs, oldest detachment
// first (ties: runId): the backend's own when it has one, else the tenant's running runs
// from RunLister, filtered.
func (v runs) ListReclaimable(ctx context.Context, now, ttlMs int64) ([]contract.RunRecord, error) {
	if own, ok := v.runs.(contract.ReclaimableLister); ok {
		return own.ListReclaimable(ctx, now, ttlMs)
	}
	cutoff := now - ttlMs
	out, err := v.walk(ctx, contract.RunFilter{Status: contract.StatusRunning}, func(st contract.RunState) bool {
		return st.DetachedSince != nil && *st.DetachedSince <= cutoff
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b contract.RunRecord) int {
		return cmp.Or(cmp.Compare(*a.DetachedSince, *b.DetachedSince), cmp.Compare(a.RunID, b.RunID))
	})
	return out, nil
}

// walk collects every run of the listing f that keep accepts, page by page.
func (v runs) walk(ctx context.Context, f contract.RunFilter, keep func(contract.RunState) bool) ([]contract.RunRecord, error) {
	l, ok := v.runs.(contract.RunLister)
	if !ok {
		return nil, fmt.Errorf("refstore: the backend's runs lack sandbox.RunLister: %w", errors.ErrUnsupported)
	}
	out := []contract.RunRecord{}
	var after *contract.RunPos
	for {
		page, err := l.ListRuns(ctx, f, after, contract.MaxListLimit)
		if err != nil {
			return nil, err
		}
		for _, st := range page.Runs {
			if keep(st) {
				out = append(out, st.RunRecord)
			}
		}
		if page.Next == nil {
			return out, nil
		}
		after = page.Next
	}
}
