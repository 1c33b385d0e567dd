package memstore

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// reaperSource is the Store's cross-tenant sandbox.ReaperSource view, served by the
// (possibly lagging) global indexes: every hit must be re-read under its tenant.
type reaperSource struct{ s *Store }

var _ sandbox.ReaperSource = reaperSource{}

func checkLimit(limit int) error {
	if limit <= 0 {
		return sandbox.Invalid("limit", "%d is not positive", limit)
	}
	return nil
}

// ReclaimCandidates returns up to limit running runs with reclaimAt <= now, ascending
// reclaimAt (cancelled runs have 0, so they come first); ties by tenant, then run id.
func (v reaperSource) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]sandbox.Candidate, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	hits := s.idx.query(ixReclaim, func(_ tkey, e ixEntry) bool { return e.sort <= now }, limit)
	out := make([]sandbox.Candidate, 0, len(hits))
	for _, h := range hits {
		out = append(out, sandbox.Candidate{Tenant: h.item.tenant, RunID: h.item.id, ReclaimAt: h.e.sort})
	}
	return out, nil
}

// PendingReclaims returns up to limit instance rows carrying a reclaim token, oldest
// updatedAt first.
func (v reaperSource) PendingReclaims(ctx context.Context, limit int) ([]sandbox.InstanceRef, error) {
	return v.instances(ixPending, func(ixEntry) bool { return true }, limit)
}

// IdleInstances returns up to limit instance rows with updatedAt <= before, oldest first.
func (v reaperSource) IdleInstances(ctx context.Context, before int64, limit int) ([]sandbox.InstanceRef, error) {
	return v.instances(ixIdle, func(e ixEntry) bool { return e.sort <= before }, limit)
}

func (v reaperSource) instances(name ixName, keep func(ixEntry) bool, limit int) ([]sandbox.InstanceRef, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	hits := s.idx.query(name, func(_ tkey, e ixEntry) bool { return keep(e) }, limit)
	out := make([]sandbox.InstanceRef, 0, len(hits))
	for _, h := range hits {
		out = append(out, sandbox.InstanceRef{Tenant: h.item.tenant, Key: h.item.id, UpdatedAt: h.e.sort})
	}
	return out, nil
}

// StaleIntents returns up to limit open intents with createdAt <= before, oldest first.
func (v reaperSource) StaleIntents(ctx context.Context, before int64, limit int) ([]sandbox.IntentRef, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	hits := s.idx.query(ixIntent, func(_ tkey, e ixEntry) bool { return e.sort <= before }, limit)
	out := make([]sandbox.IntentRef, 0, len(hits))
	for _, h := range hits {
		out = append(out, sandbox.IntentRef{Tenant: h.item.tenant, Key: h.item.id, CreatedAt: h.e.sort})
	}
	return out, nil
}
