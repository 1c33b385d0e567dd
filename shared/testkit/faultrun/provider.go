package faultrun

import (
	"context"
	"sync"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
)

// Provider wraps a counting provider for the invariant checks: it remembers the key (name)
// of every id it created and, before each Destroy, asks beforeDestroy whether the id is
// still in use (the workload reads the runs it handed the id to).
type Provider struct {
	*counting.Provider

	mu            sync.Mutex
	keyOf         map[string]string // id → sandbox key
	beforeDestroy func(ctx context.Context, id string)
}

var (
	_ contract.Provider = (*Provider)(nil)
	_ contract.Lookuper = (*Provider)(nil)
)

// NewProvider returns a Provider over a fresh counting provider called name.
func NewProvider(name string) *Provider {
	return &Provider{Provider: counting.New(name), keyOf: map[string]string{}}
}

// Create mints a fresh id and remembers its key.
func (p *Provider) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	id, err := p.Provider.Create(ctx, in)
	if err == nil {
		p.mu.Lock()
		p.keyOf[id] = in.Name
		p.mu.Unlock()
	}
	return id, err
}

// Destroy runs the in-use check, then destroys id.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	p.mu.Lock()
	check := p.beforeDestroy
	p.mu.Unlock()
	if check != nil {
		check(ctx, id)
	}
	return p.Provider.Destroy(ctx, id)
}

// KeyOf returns the key id was created for ("" when not created here).
func (p *Provider) KeyOf(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.keyOf[id]
}

// Keys returns every key a sandbox was created for.
func (p *Provider) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, k := range p.keyOf {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

func (p *Provider) setBeforeDestroy(fn func(ctx context.Context, id string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.beforeDestroy = fn
}
