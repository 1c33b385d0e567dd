package keeper_test

import (
	"context"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// losableLocks is a lock store whose current holder's lease a test can take away.
type losableLocks struct {
	mu    sync.Mutex
	fence int64
	lose  context.CancelCauseFunc
}

func (l *losableLocks) WithLock(ctx context.Context, _ string, fn func(context.Context) error) error {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l.mu.Lock()
	l.fence++
	fence := l.fence
	l.lose = cancel
	l.mu.Unlock()
	return fn(contract.WithLeaseFence(lctx, fence))
}

func (l *losableLocks) loseLease() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lose(contract.ErrLeaseLost)
}

// TestRefusedRowWriteAfterALostLeaseKeepsTheSandbox: a starter whose row write is refused
// while its lease is being lost does not destroy its new sandbox (a newer holder may be
// adopting it through the intent); the next holder adopts it: one create, no destroy.
func TestRefusedRowWriteAfterALostLeaseKeepsTheSandbox(t *testing.T) {
	prov := counting.New(keepertest.ProviderName)
	fb := storetest.NewFaultBackend(memstore.New())
	locks := &losableLocks{}
	fb.SetLocks(locks)
	k := newKeeper(t, keeper.Config{Backend: fb, Providers: []contract.Provider{prov}, Logger: quiet()})
	ctx := contract.WithTenant(t.Context(), "t")
	key, err := contract.SandboxKey(contract.KeyInput{ThreadID: "th", SetupID: "s", Provider: keepertest.ProviderName, Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	hit := 0
	fb.Hook("Instances.CreateRow", func(context.Context, int) {
		if hit > 0 {
			return
		}
		hit++
		// A stale holder puts a row naming a sandbox that is gone, and this holder's lease
		// is lost while its own write is in flight: the write is refused.
		must(t, fb.Inner().Instances().CreateRow(ctx, contract.InstanceRecord{Key: key, Provider: prov.Name(),
			ProviderSandboxID: "stale-gone", ThreadID: "th"}, "stale-inc"))
		locks.loseLease()
	})
	res, err := k.Start(ctx, keeper.StartInput{RunID: "r", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}})
	if hit != 1 {
		t.Fatalf("the refused row write happened %d times; want 1", hit)
	}
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	c := prov.Counts()
	if c.Creates != 1 || c.Destroys != 0 || res.Sandbox.ProviderSandboxID == "stale-gone" || !prov.Alive(res.Sandbox.ProviderSandboxID) {
		t.Fatalf("creates %d destroys %d, sandbox %q; want the one created sandbox kept and adopted", c.Creates, c.Destroys, res.Sandbox.ProviderSandboxID)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
