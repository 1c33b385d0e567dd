package memstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// leaseItem is a lock's lease (§2.3). It survives release, so its fence only ever grows.
type leaseItem struct {
	owner     string    // "" = free
	expiresAt time.Time // monotonic
	fence     int64
}

// Acquire backoff: jittered, doubling from minBackoff, capped at maxBackoff so a waiter
// gets in within one step of the lease becoming free.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = 250 * time.Millisecond
)

// lockStore is the Store's sandbox.LockStore view.
type lockStore struct{ s *Store }

var _ sandbox.LockStore = lockStore{}

// WithLock runs fn while holding the lease on key: acquired by one compare-and-set (free,
// expired beyond the skew, or already mine), renewed every Renew, and fn's ctx cancelled
// with cause ErrLeaseLost at (send time of the last successful acquire/renew)+Lease−Skew
// unless renewed before. Released (only if still mine) when fn returns or panics.
func (l lockStore) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	k, err := scope(ctx, "key", key)
	if err != nil {
		return err
	}
	if fn == nil {
		return sandbox.Invalid("fn", "nil")
	}
	owner := randomToken()
	fence, sent, err := l.acquire(ctx, k, owner)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancelCause(ctx)
	done, stopped := make(chan struct{}), make(chan struct{})
	go l.keep(k, owner, sent, cancel, done, stopped)
	defer func() { // runs on return and on panic, which then continues unwinding
		close(done)
		<-stopped
		cancel(nil)
		l.release(k, owner)
	}()
	return fn(sandbox.WithLeaseFence(lctx, fence))
}

// acquire tries until it holds the lease or ctx is done, returning the new fence and the
// send time of the successful attempt.
func (l lockStore) acquire(ctx context.Context, k tkey, owner string) (int64, time.Time, error) {
	backoff := minBackoff
	for {
		if err := ctx.Err(); err != nil {
			if cause := context.Cause(ctx); cause != nil && cause != err {
				return 0, time.Time{}, fmt.Errorf("memstore: waiting for lock %q: %w: %w", k.id, err, cause)
			}
			return 0, time.Time{}, fmt.Errorf("memstore: waiting for lock %q: %w", k.id, err)
		}
		sent := time.Now()
		if fence, ok := l.try(k, owner, sent); ok {
			return fence, sent, nil
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, maxBackoff)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// try is the acquire compare-and-set.
func (l lockStore) try(k tkey, owner string, sent time.Time) (int64, bool) {
	s, tm := l.s, l.s.opts.lock
	s.mu.Lock()
	defer s.mu.Unlock()
	it := s.locks[k]
	if it == nil {
		it = &leaseItem{}
		s.locks[k] = it
	}
	free := it.owner == "" || it.owner == owner || sent.After(it.expiresAt.Add(tm.Skew))
	if !free && !s.broke.unconditionalLease {
		return 0, false
	}
	it.owner, it.expiresAt = owner, sent.Add(tm.Lease)
	it.fence++
	return it.fence, true
}

// keep renews the lease every Renew and cancels the holder's ctx with ErrLeaseLost once
// the lease can no longer be guaranteed; it exits when done closes.
func (l lockStore) keep(k tkey, owner string, sent time.Time, cancel context.CancelCauseFunc, done <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	tm := l.s.opts.lock
	deadline := time.NewTimer(time.Until(sent.Add(tm.Lease - tm.Skew)))
	defer deadline.Stop()
	renew := time.NewTicker(tm.Renew)
	defer renew.Stop()
	for {
		select {
		case <-done:
			return
		case <-deadline.C:
			cancel(sandbox.ErrLeaseLost)
			return
		case <-renew.C:
			if hook := l.s.opts.renewHook; hook != nil && !hook(k.id) {
				continue // test hook: this renewal is stalled
			}
			sent := time.Now()
			switch l.renew(k, owner, sent) {
			case renewStalled:
				continue
			case renewLost:
				cancel(sandbox.ErrLeaseLost)
				return
			}
			deadline.Reset(time.Until(sent.Add(tm.Lease - tm.Skew)))
		}
	}
}

type renewResult uint8

const (
	renewed renewResult = iota
	renewLost
	renewStalled // a test stalled this key's renewals (StallRenewals)
)

// renew extends the lease only while owner still holds it.
func (l lockStore) renew(k tkey, owner string, sent time.Time) renewResult {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalls[k.id] > 0 {
		return renewStalled
	}
	it := s.locks[k]
	if it == nil || it.owner != owner {
		return renewLost
	}
	it.expiresAt = sent.Add(s.opts.lock.Lease)
	return renewed
}

// StallRenewals is a TEST CAPABILITY (testkit.RenewStaller): every renewal of key's lease,
// in any tenant, fails to reach the store from now until resume is called, so a suite can
// watch a holder lose its lease. resume is idempotent.
func (l lockStore) StallRenewals(key string) (resume func()) {
	s := l.s
	s.mu.Lock()
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
		})
	}
}

// release frees the lease only while owner holds it; a stale release is a no-op. The
// fence survives.
func (l lockStore) release(k tkey, owner string) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if it := s.locks[k]; it != nil && it.owner == owner {
		it.owner, it.expiresAt = "", time.Time{}
	}
}
