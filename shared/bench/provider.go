package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// memProvider is the benchmark's sandbox provider: a sandbox is a map entry, so the report
// measures sandkeep and DynamoDB rather than a provider. Every Create mints a fresh id,
// even for the same name (what the contention proof counts), and every call is counted.
type memProvider struct {
	name string

	mu   sync.Mutex
	seq  int
	live map[string]string // id → name
	n    providerCounts
}

// providerCounts are the calls a memProvider saw.
type providerCounts struct{ Creates, Resumes, Destroys, Lookups int }

var (
	_ sandbox.Provider = (*memProvider)(nil)
	_ sandbox.Lookuper = (*memProvider)(nil)
)

func newMemProvider(name string) *memProvider {
	return &memProvider{name: name, live: map[string]string{}}
}

// Counts returns the calls so far.
func (p *memProvider) Counts() providerCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Name identifies the provider.
func (p *memProvider) Name() string { return p.name }

// Create mints a fresh id named in.Name.
func (p *memProvider) Create(_ context.Context, in sandbox.CreateInput) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n.Creates++
	p.seq++
	id := fmt.Sprintf("%s.%04d", in.Name, p.seq)
	p.live[id] = in.Name
	return id, nil
}

// Resume returns nil for a live id and ErrSandboxGone for any other.
func (p *memProvider) Resume(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n.Resumes++
	if _, ok := p.live[id]; !ok {
		return fmt.Errorf("bench provider: %s: %w", id, sandbox.ErrSandboxGone)
	}
	return nil
}

// Destroy removes id; already gone is nil.
func (p *memProvider) Destroy(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n.Destroys++
	delete(p.live, id)
	return nil
}

// Lookup returns the oldest live sandbox named name.
func (p *memProvider) Lookup(_ context.Context, name string) (string, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n.Lookups++
	for _, id := range slices.Sorted(maps.Keys(p.live)) {
		if p.live[id] == name && strings.HasPrefix(id, name+".") {
			return id, true, nil
		}
	}
	return "", false, nil
}

// lockCounting is a backend whose WithLock entries are counted (the contention proof
// reports how many starters took the locked path). Like any wrapper it offers only
// sandbox.Backend, so the keeper reads row and intent with two calls, not one batch.
type lockCounting struct {
	sandbox.Backend
	entries atomic.Int64
}

// Locks returns the inner lock store, counting every WithLock call.
func (b *lockCounting) Locks() sandbox.LockStore {
	return countedLocks{LockStore: b.Backend.Locks(), n: &b.entries}
}

type countedLocks struct {
	sandbox.LockStore
	n *atomic.Int64
}

// WithLock counts the call, then delegates.
func (l countedLocks) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	l.n.Add(1)
	return l.LockStore.WithLock(ctx, key, fn)
}
