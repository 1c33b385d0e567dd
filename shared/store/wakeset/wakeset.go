// Package wakeset holds in-process waiters keyed by what they wait on (a run's log): a
// waiter's channel is closed by the next Wake of its key. memstore wakes its long polls with
// it; the keeper wakes the long polls of this process when it lands a write to a run's log.
package wakeset

import "sync"

// Set is a registry of waiters by key; the zero value is ready and safe for concurrent use.
type Set[K comparable] struct {
	mu sync.Mutex
	m  map[K]map[*waiter]struct{}
}

type waiter struct{ ch chan struct{} }

// Wait returns a channel closed at the next Wake(k) after the call; stop releases it and
// must be called.
func (s *Set[K]) Wait(k K) (<-chan struct{}, func()) {
	w := &waiter{ch: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[K]map[*waiter]struct{}{}
	}
	if s.m[k] == nil {
		s.m[k] = map[*waiter]struct{}{}
	}
	s.m[k][w] = struct{}{}
	return w.ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if set := s.m[k]; set != nil {
			delete(set, w)
			if len(set) == 0 {
				delete(s.m, k)
			}
		}
	}
}

// Wake closes the channel of every waiter on k (each at most once) and forgets them.
func (s *Set[K]) Wake(k K) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range s.m[k] {
		close(w.ch)
	}
	delete(s.m, k)
}
