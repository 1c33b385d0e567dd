package bench

import (
	"context"
	"sync/atomic"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
)

// memProvider is the benchmark's sandbox provider: the in-memory counting provider
// (shared/providers/counting), so the report measures sandkeep and DynamoDB rather than a
// provider. Every Create mints a fresh id, even for the same name (what the contention
// proof counts), and every call is counted. It offers Lookup and no other optional
// capability (no snapshots, restores or env), the paths the benchmark has always measured.
type memProvider struct{ p *counting.Provider }

var (
	_ contract.Provider = memProvider{}
	_ contract.Lookuper = memProvider{}
)

func newMemProvider(name string) memProvider { return memProvider{p: counting.New(name)} }

// Counts returns the calls so far.
func (m memProvider) Counts() counting.Counts { return m.p.Counts() }

// Name identifies the provider.
func (m memProvider) Name() string { return m.p.Name() }

// Create mints a fresh id named in.Name.
func (m memProvider) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	return m.p.Create(ctx, in)
}

// Resume returns nil for a live id and ErrSandboxGone for any other.
func (m memProvider) Resume(ctx context.Context, id string) error { return m.p.Resume(ctx, id) }

// Destroy removes id; already gone is nil.
func (m memProvider) Destroy(ctx context.Context, id string) error { return m.p.Destroy(ctx, id) }

// Lookup returns the oldest live sandbox named name.
func (m memProvider) Lookup(ctx context.Context, name string) (string, bool, error) {
	return m.p.Lookup(ctx, name)
}

// lockCounting is a backend whose WithLock entries are counted (the contention proof
// reports how many starters took the locked path). Like any wrapper it offers only
// contract.Backend, so the keeper reads row and intent with two calls, not one batch.
type lockCounting struct {
	contract.Backend
	entries atomic.Int64
}

// Locks returns the inner lock store, counting every WithLock call.
func (b *lockCounting) Locks() contract.LockStore {
	return countedLocks{LockStore: b.Backend.Locks(), n: &b.entries}
}

type countedLocks struct {
	contract.LockStore
	n *atomic.Int64
}

// WithLock counts the call, then delegates.
func (l countedLocks) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	l.n.Add(1)
	return l.LockStore.WithLock(ctx, key, fn)
}
