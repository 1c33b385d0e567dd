package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/lease"
)

// Leases is the table of a Store's lock leases (docs/design.md §2.3): one item per tenant
// and key, kept after release so its fence only grows. Each method is one atomic
// single-item write, the in-memory twin of dynamostore's conditional UpdateItems; times
// are monotonic. A Store uses NewLeases unless WithLeases gives it another table — the
// seam where a test stalls renewals or defeats the acquire's condition by wrapping one.
type Leases interface {
	// Acquire gives key's lease to owner until expires when it is free, expired before
	// stale, or already owner's, and returns its new fence; ok=false: another owner holds it.
	Acquire(ctx context.Context, key LeaseKey, owner string, expires, stale time.Time) (fence int64, ok bool, err error)
	// Renew moves key's expiry to expires only while owner holds it; ok=false: it was taken.
	Renew(ctx context.Context, key LeaseKey, owner string, expires time.Time) (ok bool, err error)
	// Release frees key's lease only while owner holds it (else a no-op); the fence survives.
	Release(ctx context.Context, key LeaseKey, owner string)
}

// LeaseKey names one lease: the tenant and the lock key.
type LeaseKey struct{ Tenant, Key string }

// NewLeases returns an empty lease table, safe for concurrent use.
func NewLeases() Leases { return &leaseTable{items: map[LeaseKey]*leaseItem{}} }

// WithLeases makes the Store keep its lock leases in l (default NewLeases()).
func WithLeases(l Leases) Option {
	return func(o *options) {
		if l != nil {
			o.leases = l
		}
	}
}

// leaseItem is one lease.
type leaseItem struct {
	owner     string    // "" = free
	expiresAt time.Time // monotonic
	fence     int64
}

// leaseTable is NewLeases's table: a map under its own mutex (no other state is read or
// written with a lease).
type leaseTable struct {
	mu    sync.Mutex
	items map[LeaseKey]*leaseItem
}

func (t *leaseTable) Acquire(_ context.Context, key LeaseKey, owner string, expires, stale time.Time) (int64, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	it := t.items[key]
	if it == nil {
		it = &leaseItem{}
		t.items[key] = it
	}
	if it.owner != "" && it.owner != owner && !it.expiresAt.Before(stale) {
		return 0, false, nil
	}
	it.owner, it.expiresAt = owner, expires
	it.fence++
	return it.fence, true, nil
}

func (t *leaseTable) Renew(_ context.Context, key LeaseKey, owner string, expires time.Time) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	it := t.items[key]
	if it == nil || it.owner != owner {
		return false, nil
	}
	it.expiresAt = expires
	return true, nil
}

func (t *leaseTable) Release(_ context.Context, key LeaseKey, owner string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if it := t.items[key]; it != nil && it.owner == owner {
		it.owner, it.expiresAt = "", time.Time{}
	}
}

// lockStore is the Store's contract.LockStore and contract.LeaseLocks view.
type lockStore struct{ view }

var (
	_ contract.LockStore  = lockStore{}
	_ contract.LeaseLocks = lockStore{}
)

// WithLock runs fn while holding the lease on key (lease.Hold): acquired by one
// compare-and-set of the lease table (free, expired beyond the skew, or already mine),
// renewed by another while still mine, released only if still mine.
func (l lockStore) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	lk := l.leaseKey(key)
	owner := randomToken()
	return lease.Hold(ctx, l.s.opts.lock, lease.Primitives{
		Waiting: fmt.Sprintf("memstore: waiting for lock %q", key),
		Acquire: func(ctx context.Context, sent time.Time) (int64, bool, error) {
			return l.acquire(ctx, lk, owner, sent)
		},
		Renew: func(ctx context.Context, sent time.Time) (bool, error) {
			return l.renew(ctx, lk, owner, sent)
		},
		Release: func(ctx context.Context) { l.s.opts.leases.Release(ctx, lk, owner) },
	}, fn)
}

// leaseKey is key's lease in the view's tenant.
func (l lockStore) leaseKey(key string) LeaseKey {
	k := l.key(key)
	return LeaseKey{Tenant: k.tenant, Key: k.id}
}

// acquire is one attempt sent at sent (monotonic).
func (l lockStore) acquire(ctx context.Context, lk LeaseKey, owner string, sent time.Time) (int64, bool, error) {
	tm := l.s.opts.lock
	return l.s.opts.leases.Acquire(ctx, lk, owner, sent.Add(tm.Lease), sent.Add(-tm.Skew))
}

// renew is one renewal sent at sent (monotonic).
func (l lockStore) renew(ctx context.Context, lk LeaseKey, owner string, sent time.Time) (bool, error) {
	return l.s.opts.leases.Renew(ctx, lk, owner, sent.Add(l.s.opts.lock.Lease))
}

// TryAcquire is contract.LeaseLocks's: one attempt of WithLock's acquire.
func (l lockStore) TryAcquire(ctx context.Context, key, owner string) (int64, bool, error) {
	lk := l.leaseKey(key)
	return l.acquire(ctx, lk, owner, time.Now())
}

// Renew is contract.LeaseLocks's: one renewal of WithLock's.
func (l lockStore) Renew(ctx context.Context, key, owner string) (bool, error) {
	lk := l.leaseKey(key)
	return l.renew(ctx, lk, owner, time.Now())
}

// Release is contract.LeaseLocks's: WithLock's release.
func (l lockStore) Release(ctx context.Context, key, owner string) error {
	lk := l.leaseKey(key)
	l.s.opts.leases.Release(ctx, lk, owner)
	return nil
}

// Timing is contract.LeaseLocks's.
func (l lockStore) Timing() contract.LockTiming { return l.s.opts.lock }
