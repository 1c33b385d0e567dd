// Package stalltest holds calls back per key for the seams of the lease-loss tests (a
// wrapped DynamoDB client, a wrapped memstore lease table): a held call never reaches the
// store, as over a partition, and fails once its context ends or the stall is lifted. No
// store knows of it; the stores' lock renewals are stalled from outside.
package stalltest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Set is the stalls in force, counted per key; the zero value is ready and safe for
// concurrent use.
type Set struct {
	held atomic.Int64 // calls held back so far

	mu     sync.Mutex
	stalls map[string]int // key → stalls in force
	lifted chan struct{}  // closed (and replaced) whenever a stall is lifted
}

// Stall holds back key's calls (Hold) from its return until resume is called; stalls
// nest and resume is idempotent.
func (s *Set) Stall(key string) (resume func()) {
	s.mu.Lock()
	if s.stalls == nil {
		s.stalls = map[string]int{}
	}
	s.stalls[key]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.stalls[key]--; s.stalls[key] <= 0 {
				delete(s.stalls, key)
			}
			if s.lifted != nil {
				close(s.lifted)
				s.lifted = nil
			}
		})
	}
}

// Hold returns nil at once when key is not stalled (the call may proceed); else it holds
// the caller until ctx ends or the stall is lifted and returns the error the call fails
// with — it never reaches the store.
func (s *Set) Hold(ctx context.Context, key string) error {
	s.mu.Lock()
	if s.stalls[key] == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.lifted == nil {
		s.lifted = make(chan struct{})
	}
	lifted := s.lifted
	s.mu.Unlock()
	s.held.Add(1)
	select {
	case <-ctx.Done():
		return fmt.Errorf("stalltest: call on %q held until its context ended: %w", key, ctx.Err())
	case <-lifted:
		return fmt.Errorf("stalltest: call on %q held until the stall was lifted, then lost", key)
	}
}

// Held returns how many calls were held back so far: a stall test proves with it that the
// stall path was taken.
func (s *Set) Held() int64 { return s.held.Load() }
