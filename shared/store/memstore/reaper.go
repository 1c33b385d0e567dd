package memstore

import (
	"context"
	"math"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// reaperSource is the Store's cross-tenant contract.ReaperSource view, served by the
// (possibly lagging) global indexes: every hit must be re-read under its tenant.
type reaperSource struct{ s *Store }

var _ contract.ReaperSource = reaperSource{}

// ReclaimCandidates returns up to limit running runs with reclaimAt <= now, ascending
// reclaimAt (cancelled runs have 0, so they come first); ties by tenant, then run id.
func (v reaperSource) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]contract.Candidate, error) {
	return list(v.s, ixReclaim, now, limit, func(k tkey, at int64) contract.Candidate {
		return contract.Candidate{Tenant: k.tenant, RunID: k.id, ReclaimAt: at}
	})
}

// PendingReclaims returns up to limit instance rows carrying a reclaim token, oldest
// updatedAt first.
func (v reaperSource) PendingReclaims(ctx context.Context, limit int) ([]contract.InstanceRef, error) {
	return list(v.s, ixPending, math.MaxInt64, limit, instanceRef)
}

// IdleInstances returns up to limit instance rows with updatedAt <= before, oldest first.
func (v reaperSource) IdleInstances(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return list(v.s, ixIdle, before, limit, instanceRef)
}

// StopCandidates returns up to limit running or stopping instance rows with idleSince <=
// before, oldest first.
func (v reaperSource) StopCandidates(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return list(v.s, ixStop, before, limit, instanceRef)
}

func instanceRef(k tkey, updatedAt int64) contract.InstanceRef {
	return contract.InstanceRef{Tenant: k.tenant, Key: k.id, UpdatedAt: updatedAt}
}

// StaleIntents returns up to limit open intents with createdAt <= before, oldest first.
func (v reaperSource) StaleIntents(ctx context.Context, before int64, limit int) ([]contract.IntentRef, error) {
	return list(v.s, ixIntent, before, limit, func(k tkey, at int64) contract.IntentRef {
		return contract.IntentRef{Tenant: k.tenant, Key: k.id, CreatedAt: at}
	})
}

// list answers one cross-tenant listing: up to limit entries of index name with sort value
// <= upTo, in query order, each projected by ref.
func list[T any](s *Store, name ixName, upTo int64, limit int, ref func(item tkey, sort int64) T) ([]T, error) {
	if limit <= 0 {
		return nil, contract.Invalid("limit", "%d is not positive", limit)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	hits := s.idx.query(name, func(_ tkey, e ixEntry) bool { return e.sort <= upTo }, limit)
	out := make([]T, 0, len(hits))
	for _, h := range hits {
		out = append(out, ref(h.item, h.e.sort))
	}
	return out, nil
}
