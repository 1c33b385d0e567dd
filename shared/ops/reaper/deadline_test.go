package reaper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// deadlineProvider is a fastProvider that records, for every Destroy and Status, how much
// time its context had left (0 = no deadline at all).
type deadlineProvider struct {
	fastProvider
	mu      sync.Mutex
	destroy []time.Duration
	status  []time.Duration
}

func remaining(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return time.Until(dl)
}

func (p *deadlineProvider) Destroy(ctx context.Context, id string) error {
	p.mu.Lock()
	p.destroy = append(p.destroy, remaining(ctx))
	p.mu.Unlock()
	return p.fastProvider.Destroy(ctx, id)
}

func (p *deadlineProvider) Status(ctx context.Context, id string) (contract.SandboxStatus, error) {
	p.mu.Lock()
	p.status = append(p.status, remaining(ctx))
	p.mu.Unlock()
	return p.fastProvider.Status(ctx, id)
}

// TestStaleIntentDestroyGetsItsOwnTimeout: resolving a stale intent waits at most LockWait
// for the sandbox lock, but the orphan's Destroy under it gets DestroyTimeout, not what is
// left of the lock wait (a slow provider would otherwise never get an orphan destroyed).
func TestStaleIntentDestroyGetsItsOwnTimeout(t *testing.T) {
	prov := &deadlineProvider{fastProvider: fastProvider{live: map[string]bool{}}}
	w := newWorld(t, memstore.New(), prov)
	orphan, err := prov.Create(w.ctx, contract.CreateInput{Name: "sk_orphan"})
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour).UnixMilli()
	must(t, w.b.Intents().Put(w.ctx, "sk_orphan", 7, past))
	must(t, w.b.Intents().Record(w.ctx, "sk_orphan", 7, orphan))
	const lockWait, destroyTimeout = time.Second, time.Hour
	rep, err := w.reaper(0, nil, func(c *reapCfg) {
		c.LockWait, c.K.DestroyTimeout = lockWait, destroyTimeout
	}).Sweep(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Swept.OrphansDestroyed != 1 || w.alive(orphan) {
		t.Fatalf("orphan not destroyed: swept %+v", rep.Swept)
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if len(prov.destroy) != 1 || prov.destroy[0] <= lockWait {
		t.Fatalf("orphan destroy deadlines %v; want one above the lock wait %v (DestroyTimeout %v)", prov.destroy, lockWait, destroyTimeout)
	}
}

// TestProbeStatusHasADeadline: the probe's provider calls are bounded by the run budget,
// so a hanging provider cannot hold the sweep (and its lock) until the invocation dies.
func TestProbeStatusHasADeadline(t *testing.T) {
	prov := &deadlineProvider{fastProvider: fastProvider{live: map[string]bool{}}}
	w := newWorld(t, memstore.New(), prov)
	runID := w.id("probed")
	res := w.start(runID, runID)
	w.detach(res, runID)
	const budget = time.Hour
	rep, err := w.reaper(10*time.Minute, nil, func(c *reapCfg) { c.RunBudget = budget }).Sweep(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Probed != 1 {
		t.Fatalf("probed %d runs; want 1", rep.Probed)
	}
	prov.mu.Lock()
	defer prov.mu.Unlock()
	if len(prov.status) == 0 {
		t.Fatal("the probe never asked the provider's Status")
	}
	for _, left := range prov.status {
		if left <= 0 || left > budget {
			t.Fatalf("probe Status deadlines %v; want each within the run budget %v", prov.status, budget)
		}
	}
}
