package memstore

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/contract"
)

var _ contract.LogWaker = (*Store)(nil)

// LogChanged returns a channel closed at the run's next log item or terminal write.
func (s *Store) LogChanged(ctx context.Context, runID string) (<-chan struct{}, func(), error) {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return nil, nil, err
	}
	ch, stop := s.waiters.Wait(k)
	return ch, stop, nil
}

// wake closes the channel of every reader waiting on run k. Call with s.mu held (so the
// write is visible to a woken reader once s.mu is released).
func (s *Store) wake(k tkey) { s.waiters.Wake(k) }
