package memstore

import (
	"context"
	"slices"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

var (
	_ sandbox.RunLister  = fencedRuns{}
	_ sandbox.RowsReader = (*Store)(nil)
)

// ListRuns returns up to limit runs of the caller's tenant matching f, newest first,
// strictly after after (sandbox.RunLister). The store's maps are consistent, so the page
// is exact.
func (v fencedRuns) ListRuns(ctx context.Context, f sandbox.RunFilter, after *sandbox.RunPos, limit int) (sandbox.RunPage, error) {
	t, err := sandbox.Tenant(ctx)
	if err != nil {
		return sandbox.RunPage{}, err
	}
	if err := sandbox.CheckListing(f, after, limit); err != nil {
		return sandbox.RunPage{}, err
	}
	s := v.s
	s.mu.Lock()
	var all []sandbox.RunState
	for k, r := range s.runs {
		if k.tenant != t || !f.Matches(r.st.RunRecord) {
			continue
		}
		if after != nil && !sandbox.PosOf(r.st.RunRecord).Before(*after) {
			continue
		}
		if err := checkStored(r.st); err != nil {
			s.mu.Unlock()
			return sandbox.RunPage{}, err
		}
		all = append(all, r.st.Clone())
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b sandbox.RunState) int { return -byStart(a.RunRecord, b.RunRecord) })
	page := sandbox.RunPage{Runs: all[:min(limit, len(all))]}
	if len(all) > limit {
		pos := sandbox.PosOf(page.Runs[limit-1].RunRecord)
		page.Next = &pos
	}
	return page, nil
}

// GetRows returns the instance rows of keys that exist (sandbox.RowsReader).
func (s *Store) GetRows(ctx context.Context, keys []string) (map[string]*sandbox.InstanceRow, error) {
	out := map[string]*sandbox.InstanceRow{}
	for _, key := range keys {
		row, err := load(ctx, s, s.instances, key)
		if err != nil {
			return nil, err
		}
		if row != nil {
			out[key] = row
		}
	}
	return out, nil
}
