package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/lease"
	"github.com/sandkeep/sandkeep/shared/sandbox"
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

// lockStore is the Store's sandbox.LockStore view.
type lockStore struct{ s *Store }

var _ sandbox.LockStore = lockStore{}

// WithLock runs fn while holding the lease on key (lease.Hold): acquired by one
// compare-and-set of the lease table (free, expired beyond the skew, or already mine),
// renewed by another while still mine, released only if still mine.
func (l lockStore) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	k, err := scope(ctx, "key", key)
	if err != nil {
		return err
	}
	if fn == nil {
		return sandbox.Invalid("fn", "nil")
	}
	owner, lk := randomToken(), LeaseKey{Tenant: k.tenant, Key: k.id}
	leases, tm := l.s.opts.leases, l.s.opts.lock
	return lease.Hold(ctx, tm, lease.Primitives{
		Waiting: fmt.Sprintf("memstore: waiting for lock %q", k.id),
		Acquire: func(ctx context.Context, sent time.Time) (int64, bool, error) {
			return leases.Acquire(ctx, lk, owner, sent.Add(tm.Lease), sent.Add(-tm.Skew))
		},
		Renew: func(ctx context.Context, sent time.Time) (bool, error) {
			return leases.Renew(ctx, lk, owner, sent.Add(tm.Lease))
		},
		Release: func(ctx context.Context) { leases.Release(ctx, lk, owner) },
	}, fn)
}
