package memstore

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

var _ sandbox.LogWaker = (*Store)(nil)

// waiter is one reader waiting for a run's log to change.
type waiter struct{ ch chan struct{} }

// LogChanged returns a channel closed at the run's next log item or terminal write.
func (s *Store) LogChanged(ctx context.Context, runID string) (<-chan struct{}, func(), error) {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return nil, nil, err
	}
	w := &waiter{ch: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters[k] == nil {
		s.waiters[k] = map[*waiter]struct{}{}
	}
	s.waiters[k][w] = struct{}{}
	stop := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if set := s.waiters[k]; set != nil {
			delete(set, w)
			if len(set) == 0 {
				delete(s.waiters, k)
			}
		}
	}
	return w.ch, stop, nil
}

// wake closes the channel of every reader waiting on run k. Call with s.mu held.
func (s *Store) wake(k tkey) {
	for w := range s.waiters[k] {
		close(w.ch)
	}
	delete(s.waiters, k)
}
