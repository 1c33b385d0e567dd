package bench

import (
	"context"
	"maps"
	"sync"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// countedLocal is the local-process provider with its calls counted by method: it embeds
// the provider, so every optional capability stays (Executor, EnvStarter, JournalDirer,
// Lookuper, …), and the calls a hosted provider bills (its API's) are the ones overridden.
type countedLocal struct {
	*localprocess.Provider
	mu sync.Mutex
	n  map[string]int
}

func newCountedLocal(dir string) *countedLocal {
	return &countedLocal{Provider: localprocess.New(dir), n: map[string]int{}}
}

func (c *countedLocal) count(op string) {
	c.mu.Lock()
	c.n[op]++
	c.mu.Unlock()
}

// Counts returns the calls so far by method.
func (c *countedLocal) Counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *countedLocal) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	c.count("Create")
	return c.Provider.Create(ctx, in)
}

func (c *countedLocal) Resume(ctx context.Context, id string) error {
	c.count("Resume")
	return c.Provider.Resume(ctx, id)
}

func (c *countedLocal) Destroy(ctx context.Context, id string) error {
	c.count("Destroy")
	return c.Provider.Destroy(ctx, id)
}

func (c *countedLocal) Lookup(ctx context.Context, name string) (string, bool, error) {
	c.count("Lookup")
	return c.Provider.Lookup(ctx, name)
}

func (c *countedLocal) Status(ctx context.Context, id string) (contract.SandboxStatus, error) {
	c.count("Status")
	return c.Provider.Status(ctx, id)
}

func (c *countedLocal) Stop(ctx context.Context, id string) error {
	c.count("Stop")
	return c.Provider.Stop(ctx, id)
}

func (c *countedLocal) Exec(ctx context.Context, id, command string) (contract.ExecResult, error) {
	c.count("Exec")
	return c.Provider.Exec(ctx, id, command)
}

func (c *countedLocal) Start(ctx context.Context, id, command string) (int, error) {
	c.count("Start")
	return c.Provider.Start(ctx, id, command)
}

func (c *countedLocal) StartEnv(ctx context.Context, id, command string, env map[string]string) (int, error) {
	c.count("StartEnv")
	return c.Provider.StartEnv(ctx, id, command, env)
}

func (c *countedLocal) Kill(ctx context.Context, id string, pgid int) error {
	c.count("Kill")
	return c.Provider.Kill(ctx, id, pgid)
}

func (c *countedLocal) SetEnv(ctx context.Context, id string, env map[string]string) error {
	c.count("SetEnv")
	return c.Provider.SetEnv(ctx, id, env)
}

// diffCounts is now − before, by key, leaving out zeros; and the total.
func diffCounts(before, now map[string]int) (int, map[string]int) {
	by := map[string]int{}
	total := 0
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			by[k] = d
			total += d
		}
	}
	return total, by
}
