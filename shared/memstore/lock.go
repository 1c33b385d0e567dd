package memstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/lease"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// leaseItem is a lock's lease (docs/design.md §2.3). It survives release, so its fence only ever grows.
type leaseItem struct {
	owner     string    // "" = free
	expiresAt time.Time // monotonic
	fence     int64
}

// lockStore is the Store's sandbox.LockStore view.
type lockStore struct{ s *Store }

var _ sandbox.LockStore = lockStore{}

// WithLock runs fn while holding the lease on key (lease.Hold): acquired by one
// compare-and-set under the store's mutex (free, expired beyond the skew, or already mine),
// renewed by another while still mine, released only if still mine.
func (l lockStore) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	k, err := scope(ctx, "key", key)
	if err != nil {
		return err
	}
	if fn == nil {
		return sandbox.Invalid("fn", "nil")
	}
	owner := randomToken()
	return lease.Hold(ctx, l.s.opts.lock, lease.Primitives{
		Waiting: fmt.Sprintf("memstore: waiting for lock %q", k.id),
		Acquire: func(_ context.Context, sent time.Time) (int64, bool, error) {
			fence, ok := l.try(k, owner, sent)
			return fence, ok, nil
		},
		Renew: func(_ context.Context, sent time.Time) (bool, error) {
			if hook := l.s.opts.renewHook; hook != nil && !hook(k.id) {
				return false, lease.ErrStalled // test hook: this renewal is stalled
			}
			return l.renew(k, owner, sent)
		},
		Release: func(context.Context) { l.release(k, owner) },
	}, fn)
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

// renew extends the lease only while owner still holds it; a stalled key's renewal never
// reaches the lease (checked under the mutex, so none lands once StallRenewals returned).
func (l lockStore) renew(k tkey, owner string, sent time.Time) (bool, error) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stalls.Stalled(k.id) {
		return false, lease.ErrStalled
	}
	it := s.locks[k]
	if it == nil || it.owner != owner {
		return false, nil
	}
	it.expiresAt = sent.Add(s.opts.lock.Lease)
	return true, nil
}

// StallRenewals is a TEST CAPABILITY (testkit.RenewStaller): every renewal of key's lease,
// in any tenant, fails to reach the store from now until resume is called, so a suite can
// watch a holder lose its lease. resume is idempotent.
func (l lockStore) StallRenewals(key string) (resume func()) {
	l.s.mu.Lock() // no renewal is between its stall check and its write while we stall
	defer l.s.mu.Unlock()
	return l.s.stalls.Stall(key)
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
