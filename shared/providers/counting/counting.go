// Package counting is an in-memory sandbox provider that counts every call: the
// operation suite's provider (shared/testkit/keepertest) and the benchmark's (cmd/sandkeep/internal/bench).
// It imports no test support, so the shipped CLI may link it for `sandkeep bench`.
package counting

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Counts are the provider calls a Provider saw.
type Counts struct {
	Creates, Restores, Resumes, Destroys, Snapshots, SnapshotDeletes, Lookups, SetEnvs int
}

// Provider is an in-memory contract.Provider (with Lookuper, Snapshotter,
// Restorer and EnvSetter) that counts every call: each Create or Restore mints a fresh id,
// even for the same name. Hooks program failures and block inside Create.
type Provider struct {
	name string

	mu        sync.Mutex
	seq       int
	live      map[string]string // id → name
	snaps     map[string]string // snapshot id → sandbox id it was taken of
	env       map[string]map[string]string
	inputs    []contract.CreateInput
	destroyed []string
	n         Counts

	beforeCreate func(ctx context.Context, n int, in contract.CreateInput)
	afterCreate  func(n int, id string)
	resumeErr    func(id string) error
	destroyErr   func(id string) error
	snapDelErr   func(id string) error
}

var (
	_ contract.Provider        = (*Provider)(nil)
	_ contract.Lookuper        = (*Provider)(nil)
	_ contract.Snapshotter     = (*Provider)(nil)
	_ contract.Restorer        = (*Provider)(nil)
	_ contract.SnapshotDeleter = (*Provider)(nil)
	_ contract.EnvSetter       = (*Provider)(nil)
)

// New returns an empty Provider called name.
func New(name string) *Provider {
	return &Provider{name: name, live: map[string]string{}, snaps: map[string]string{},
		env: map[string]map[string]string{}}
}

// BeforeCreate installs fn, called (outside the provider's lock) before the n-th Create
// (1-based) mints its id; it may block, which is how tests hold a starter inside Create.
func (p *Provider) BeforeCreate(fn func(ctx context.Context, n int, in contract.CreateInput)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.beforeCreate = fn
}

// AfterCreate installs fn, called after the n-th Create minted id and before it returns.
func (p *Provider) AfterCreate(fn func(n int, id string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.afterCreate = fn
}

// FailResume installs fn: a non-nil result is what Resume of id returns.
func (p *Provider) FailResume(fn func(id string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumeErr = fn
}

// FailDestroy installs fn: a non-nil result is what Destroy of id returns.
func (p *Provider) FailDestroy(fn func(id string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.destroyErr = fn
}

// FailDeleteSnapshot installs fn: a non-nil result is what DeleteSnapshot of id returns
// (the snapshot stays); nil removes the hook.
func (p *Provider) FailDeleteSnapshot(fn func(id string) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.snapDelErr = fn
}

// Snaps returns the ids of the snapshots that exist, sorted.
func (p *Provider) Snaps() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.snaps))
}

// Kill makes id gone, as if the provider reaped it (not counted as a Destroy).
func (p *Provider) Kill(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.live, id)
}

// Counts returns the calls so far.
func (p *Provider) Counts() Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Destroyed returns the ids Destroy removed, in order.
func (p *Provider) Destroyed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.destroyed)
}

// Alive reports whether id exists.
func (p *Provider) Alive(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.live[id]
	return ok
}

// Live returns the ids that exist, sorted.
func (p *Provider) Live() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.live))
}

// Inputs returns the inputs of every Create and Restore, in order.
func (p *Provider) Inputs() []contract.CreateInput {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.inputs)
}

// Env returns the env last set on id by SetEnv.
func (p *Provider) Env(id string) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.env[id])
}

// Name identifies the provider.
func (p *Provider) Name() string { return p.name }

// Create mints a fresh id named in.Name (after the BeforeCreate hook).
func (p *Provider) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	p.mu.Lock()
	p.n.Creates++
	n, hook := p.n.Creates, p.beforeCreate
	p.mu.Unlock()
	if hook != nil {
		hook(ctx, n, in)
	}
	id := p.mint(in)
	p.mu.Lock()
	after := p.afterCreate
	p.mu.Unlock()
	if after != nil {
		after(n, id)
	}
	return id, nil
}

func (p *Provider) mint(in contract.CreateInput) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	id := fmt.Sprintf("%s.%04d", in.Name, p.seq)
	p.live[id] = in.Name
	p.inputs = append(p.inputs, in)
	return id
}

// Resume returns nil for a live id, ErrSandboxGone for a gone one, or the programmed error.
func (p *Provider) Resume(ctx context.Context, id string) error {
	p.mu.Lock()
	p.n.Resumes++
	fail := p.resumeErr
	_, ok := p.live[id]
	p.mu.Unlock()
	if fail != nil {
		if err := fail(id); err != nil {
			return err
		}
	}
	if !ok {
		return fmt.Errorf("counting provider: %s: %w", id, contract.ErrSandboxGone)
	}
	return nil
}

// Destroy removes id; already gone is nil.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	p.mu.Lock()
	p.n.Destroys++
	fail := p.destroyErr
	p.mu.Unlock()
	if fail != nil {
		if err := fail(id); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.live, id)
	p.destroyed = append(p.destroyed, id)
	return nil
}

// Lookup returns the oldest live sandbox named name.
func (p *Provider) Lookup(ctx context.Context, name string) (string, bool, error) {
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

// Snapshot records a snapshot of a live sandbox.
func (p *Provider) Snapshot(ctx context.Context, id, label string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n.Snapshots++
	if _, ok := p.live[id]; !ok {
		return "", fmt.Errorf("counting provider: snapshot %s: %w", id, contract.ErrSandboxGone)
	}
	snap := fmt.Sprintf("snap-%d-%s", p.n.Snapshots, label)
	p.snaps[snap] = id
	return snap, nil
}

// DeleteSnapshot removes a snapshot (counted); an absent one is nil.
func (p *Provider) DeleteSnapshot(ctx context.Context, snap string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n.SnapshotDeletes++
	if p.snapDelErr != nil {
		if err := p.snapDelErr(snap); err != nil {
			return err
		}
	}
	delete(p.snaps, snap)
	return nil
}

// Restore mints a fresh sandbox from an existing snapshot; ErrSandboxGone when it is not.
func (p *Provider) Restore(ctx context.Context, in contract.CreateInput) (string, error) {
	p.mu.Lock()
	p.n.Restores++
	_, ok := p.snaps[in.SnapshotID]
	p.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("counting provider: snapshot %s: %w", in.SnapshotID, contract.ErrSandboxGone)
	}
	return p.mint(in), nil
}

// SetEnv records env for id.
func (p *Provider) SetEnv(ctx context.Context, id string, env map[string]string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n.SetEnvs++
	p.env[id] = maps.Clone(env)
	return nil
}

// Basic hides every optional capability of p (no Lookup, Snapshot, Restore, SetEnv).
func Basic(p contract.Provider) contract.Provider { return basic{p} }

type basic struct{ p contract.Provider }

// Name delegates.
func (b basic) Name() string { return b.p.Name() }

// Create delegates.
func (b basic) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	return b.p.Create(ctx, in)
}

// Resume delegates.
func (b basic) Resume(ctx context.Context, id string) error { return b.p.Resume(ctx, id) }

// Destroy delegates.
func (b basic) Destroy(ctx context.Context, id string) error { return b.p.Destroy(ctx, id) }
