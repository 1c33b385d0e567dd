package memstore

import (
	"context"
	"slices"

	"github.com/sandkeep/sandkeep/shared/contract"
)

var (
	_ contract.RunLister  = fencedRuns{}
	_ contract.RowsReader = (*Store)(nil)
)

// ListRuns returns up to limit runs of the caller's tenant matching f, newest first,
// strictly after after (contract.RunLister). The store's maps are consistent, so the page
// is exact.
func (v fencedRuns) ListRuns(ctx context.Context, f contract.RunFilter, after *contract.RunPos, limit int) (contract.RunPage, error) {
	t := v.tenant
	s := v.s
	s.mu.Lock()
	var all []contract.RunState
	for k, r := range s.runs {
		if k.tenant != t || !f.Matches(r.st.RunRecord) {
			continue
		}
		if after != nil && !contract.PosOf(r.st.RunRecord).Before(*after) {
			continue
		}
		if err := checkStored(r.st); err != nil {
			s.mu.Unlock()
			return contract.RunPage{}, err
		}
		all = append(all, r.st.Clone())
	}
	s.mu.Unlock()
	slices.SortFunc(all, func(a, b contract.RunState) int { return -byStart(a.RunRecord, b.RunRecord) })
	page := contract.RunPage{Runs: all[:min(limit, len(all))]}
	if len(all) > limit {
		pos := contract.PosOf(page.Runs[limit-1].RunRecord)
		page.Next = &pos
	}
	return page, nil
}

// GetRows returns the instance rows of keys that exist (contract.RowsReader).
func (s *Store) GetRows(ctx context.Context, keys []string) (map[string]*contract.InstanceRow, error) {
	out := map[string]*contract.InstanceRow{}
	for _, key := range keys {
		k, err := scope(ctx, "key", key)
		if err != nil {
			return nil, err
		}
		row, _ := load(s, s.instances, k)
		if row != nil {
			out[key] = row
		}
	}
	return out, nil
}
