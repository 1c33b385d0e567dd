// Package memstoretest wraps memstore at its lease-table seam (memstore.Leases) for the
// lease-loss proofs and the lock tests' negative controls: renewals stalled per key, and
// an acquire that ignores the holder. memstore itself carries no test switch.
package memstoretest

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/stalltest"
)

// StallingLeases is a memstore.Leases whose renewals can be stalled per lock key (any
// tenant): a stalled renewal is held back — it never reaches the table — until its
// context ends or the stall is lifted, and then fails. Acquires and releases pass through.
type StallingLeases struct {
	memstore.Leases
	stalls stalltest.Set
}

// NewStallingLeases wraps inner with no stall in force.
func NewStallingLeases(inner memstore.Leases) *StallingLeases {
	return &StallingLeases{Leases: inner}
}

// StallRenewals holds back every renewal of key's lease from its return until resume is
// called; stalls nest and resume is idempotent (the shape of testkit.RenewStaller).
func (l *StallingLeases) StallRenewals(key string) (resume func()) { return l.stalls.Stall(key) }

// Held returns how many renewals were held back so far (proof the stall path was taken).
func (l *StallingLeases) Held() int64 { return l.stalls.Held() }

// Renew holds back a stalled key's renewal; else it is the inner table's.
func (l *StallingLeases) Renew(ctx context.Context, key memstore.LeaseKey, owner string, expires time.Time) (bool, error) {
	if err := l.stalls.Hold(ctx, key.Key); err != nil {
		return false, err
	}
	return l.Leases.Renew(ctx, key, owner, expires)
}

// UnconditionalLeases returns inner with the acquire's condition defeated: every acquire
// takes the lease, held or not (fences still grow) — the deliberate defect the lock
// tests' negative controls must detect.
func UnconditionalLeases(inner memstore.Leases) memstore.Leases { return unconditional{inner} }

type unconditional struct{ memstore.Leases }

// never is a staleness bound no lease expiry reaches: every held lease counts as expired.
var never = time.Now().Add(100 * 365 * 24 * time.Hour)

func (u unconditional) Acquire(ctx context.Context, key memstore.LeaseKey, owner string, expires, _ time.Time) (int64, bool, error) {
	return u.Leases.Acquire(ctx, key, owner, expires, never)
}

// Store is a memstore.Store whose lock renewals a test can stall: its Locks() also has
// StallRenewals (testkit.RenewStaller, keepertest.RenewStaller). Every other method,
// the optional capabilities included, is the memstore's own.
type Store struct {
	*memstore.Store
	Leases *StallingLeases
}

// New returns a Store over a fresh memstore built with opts and a stalling lease table.
func New(opts ...memstore.Option) *Store { return NewOver(memstore.NewLeases(), opts...) }

// NewOver is New with the stalling table wrapped around leases (e.g. UnconditionalLeases).
func NewOver(leases memstore.Leases, opts ...memstore.Option) *Store {
	l := NewStallingLeases(leases)
	return &Store{Store: memstore.New(append(opts, memstore.WithLeases(l))...), Leases: l}
}

// Locks returns the memstore's lock store with StallRenewals attached.
func (s *Store) Locks() contract.LockStore {
	return stallableLocks{s.Store.Locks().(leaseLockStore), s.Leases}
}

// leaseLockStore is the store's lock view with its step-by-step lease (contract.LeaseLocks),
// which the wrapper keeps.
type leaseLockStore interface {
	contract.LockStore
	contract.LeaseLocks
}

type stallableLocks struct {
	leaseLockStore
	leases *StallingLeases
}

// StallRenewals stalls key's renewals in the store's lease table until resume is called.
func (l stallableLocks) StallRenewals(key string) (resume func()) { return l.leases.StallRenewals(key) }
