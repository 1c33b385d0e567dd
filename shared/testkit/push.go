package testkit

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// RunPushStoreConformance proves the deployed push's store (contract.PushStore,
// docs/design.md §8.1): the tenant's connection bound and the connection's subscription
// bound hold under concurrent callers, subscriptions are listed per run and tenant, and a
// disconnect leaves nothing behind.
func RunPushStoreConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, pushCases())
}

const (
	psTenant = "tenant-a"
	psOther  = "tenant-b"
)

func psStore(t *testing.T, b contract.Backend) contract.PushStore {
	t.Helper()
	s, ok := b.(contract.PushStore)
	if !ok {
		t.Skip("backend lacks capability sandbox.PushStore (the deployed push)")
	}
	return s
}

// psSubs returns runID's subscriptions in tenant as "conn:next" strings.
func psSubs(t *testing.T, s contract.PushStore, tenant, runID string) string {
	t.Helper()
	subs, err := s.Subscriptions(ctxFor(t, tenant), runID)
	cfNoErr(t, err, "Subscriptions")
	out := ""
	for _, sub := range subs {
		if sub.RunID != runID {
			t.Fatalf("Subscriptions(%q) returned one of %q", runID, sub.RunID)
		}
		out += fmt.Sprintf("%s:%d ", sub.ConnID, sub.Next)
	}
	return out
}

func pushCases() []cfCase {
	return []cfCase{
		{"Connect holds the tenant's bound; a disconnect frees a slot; tenants are apart", func(t *testing.T, b contract.Backend) {
			s := psStore(t, b)
			ctx, other := ctxFor(t, psTenant), ctxFor(t, psOther)
			cfNoErr(t, s.Connect(ctx, "c1", 2), "Connect c1")
			cfNoErr(t, s.Connect(ctx, "c2", 2), "Connect c2")
			cfIs(t, s.Connect(ctx, "c3", 2), contract.ErrConflict, "Connect past the bound")
			cfNoErr(t, s.Connect(other, "o1", 2), "another tenant's Connect")
			cfNoErr(t, s.Disconnect(other, "c1"), "another tenant's Disconnect of c1")
			if tn, ok, err := s.ConnectionTenant(ctx, "c1"); err != nil || !ok || tn != psTenant {
				t.Fatalf("another tenant disconnected c1: %q %v %v", tn, ok, err)
			}
			cfNoErr(t, s.Disconnect(ctx, "c1"), "Disconnect c1")
			cfNoErr(t, s.Disconnect(ctx, "c1"), "Disconnect c1 again")
			if _, ok, err := s.ConnectionTenant(ctx, "c1"); err != nil || ok {
				t.Fatalf("c1 after Disconnect: %v %v", ok, err)
			}
			cfNoErr(t, s.Connect(ctx, "c3", 2), "Connect into the freed slot")
		}},
		{"Connect's bound holds under concurrent connects", func(t *testing.T, b contract.Backend) {
			s := psStore(t, b)
			ctx := ctxFor(t, psTenant)
			var ok atomic.Int64
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := s.Connect(ctx, fmt.Sprintf("c%d", i), 3); err == nil {
						ok.Add(1)
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 3 {
				t.Fatalf("%d of 8 concurrent connects succeeded under a bound of 3", ok.Load())
			}
		}},
		{"Connecting a connection again is idempotent: one slot, its subscriptions kept", func(t *testing.T, b contract.Backend) {
			s := psStore(t, b)
			ctx := ctxFor(t, psTenant)
			cfNoErr(t, s.Connect(ctx, "c1", 1), "Connect c1")
			cfNoErr(t, s.Subscribe(ctx, "c1", "r1", 3, 10), "Subscribe c1 r1")
			cfNoErr(t, s.Connect(ctx, "c1", 1), "Connect c1 again at the bound")
			// A push service may deliver $connect twice, concurrently.
			errs := make(chan error, 6)
			var wg sync.WaitGroup
			for range 6 {
				wg.Add(1)
				go func() { defer wg.Done(); errs <- s.Connect(ctx, "c1", 1) }()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				cfNoErr(t, err, "a concurrent Connect of c1")
			}
			cfIs(t, s.Connect(ctx, "c2", 1), contract.ErrConflict, "Connect c2 while c1 holds the one slot")
			if got := psSubs(t, s, psTenant, "r1"); got != "c1:3 " {
				t.Fatalf("r1's subscriptions after the reconnects: %q", got)
			}
			cfIs(t, s.Connect(ctxFor(t, psOther), "c1", 1), contract.ErrConflict, "another tenant's Connect of c1")
			if tn, ok, err := s.ConnectionTenant(ctx, "c1"); err != nil || !ok || tn != psTenant {
				t.Fatalf("c1 after another tenant's Connect: %q %v %v", tn, ok, err)
			}
			cfNoErr(t, s.Disconnect(ctx, "c1"), "Disconnect c1")
			if got := psSubs(t, s, psTenant, "r1"); got != "" {
				t.Fatalf("r1's subscriptions after Disconnect: %q", got)
			}
			cfNoErr(t, s.Connect(ctx, "c2", 1), "Connect c2 into the one slot, freed")
		}},
		{"Subscribe holds the connection's bound, restarts a run, refuses a connection not open in the tenant", func(t *testing.T, b contract.Backend) {
			s := psStore(t, b)
			ctx := ctxFor(t, psTenant)
			cfNoErr(t, s.Connect(ctx, "c1", 10), "Connect")
			cfNoErr(t, s.Subscribe(ctx, "c1", "r1", 0, 2), "Subscribe r1")
			cfNoErr(t, s.Subscribe(ctx, "c1", "r2", 5, 2), "Subscribe r2")
			cfIs(t, s.Subscribe(ctx, "c1", "r3", 0, 2), contract.ErrConflict, "Subscribe past the bound")
			cfNoErr(t, s.Subscribe(ctx, "c1", "r2", 9, 2), "Subscribe r2 again (a restart)")
			if got := psSubs(t, s, psTenant, "r2"); got != "c1:9 " {
				t.Fatalf("r2 after the restart: %q", got)
			}
			cfIs(t, s.Subscribe(ctx, "nope", "r1", 0, 2), contract.ErrUnknownRun, "Subscribe on no connection")
			cfIs(t, s.Subscribe(ctxFor(t, psOther), "c1", "r1", 0, 2), contract.ErrUnknownRun, "another tenant's Subscribe on c1")
			if got := psSubs(t, s, psOther, "r1"); got != "" {
				t.Fatalf("another tenant sees r1's subscriptions: %q", got)
			}
			cfNoErr(t, s.Unsubscribe(ctx, "c1", "r1"), "Unsubscribe r1")
			cfNoErr(t, s.Unsubscribe(ctx, "c1", "r1"), "Unsubscribe r1 again")
			cfNoErr(t, s.Subscribe(ctx, "c1", "r3", 0, 2), "Subscribe r3 into the freed place")
			if got := psSubs(t, s, psTenant, "r1"); got != "" {
				t.Fatalf("r1 after Unsubscribe: %q", got)
			}
		}},
		{"Subscriptions list every connection of the run, and only the run's", func(t *testing.T, b contract.Backend) {
			s := psStore(t, b)
			ctx := ctxFor(t, psTenant)
			for _, c := range []string{"c1", "c2", "c3"} {
				cfNoErr(t, s.Connect(ctx, c, 10), "Connect "+c)
				cfNoErr(t, s.Subscribe(ctx, c, "r1", 3, 10), "Subscribe "+c)
			}
			cfNoErr(t, s.Subscribe(ctx, "c1", "r2", 0, 10), "Subscribe c1 r2")
			if got := psSubs(t, s, psTenant, "r1"); got != "c1:3 c2:3 c3:3 " {
				t.Fatalf("r1's subscriptions: %q", got)
			}
		}},
		{"Disconnect removes every subscription", func(t *testing.T, b contract.Backend) {
			s := psStore(t, b)
			ctx := ctxFor(t, psTenant)
			cfNoErr(t, s.Connect(ctx, "c1", 10), "Connect c1")
			cfNoErr(t, s.Connect(ctx, "c2", 10), "Connect c2")
			cfNoErr(t, s.Subscribe(ctx, "c1", "r1", 0, 10), "Subscribe c1 r1")
			cfNoErr(t, s.Subscribe(ctx, "c1", "r2", 0, 10), "Subscribe c1 r2")
			cfNoErr(t, s.Subscribe(ctx, "c2", "r1", 0, 10), "Subscribe c2 r1")
			cfNoErr(t, s.Disconnect(ctx, "c1"), "Disconnect c1")
			if got := psSubs(t, s, psTenant, "r1") + psSubs(t, s, psTenant, "r2"); got != "c2:0 " {
				t.Fatalf("after disconnecting c1: %q", got)
			}
			cfIs(t, s.Subscribe(ctx, "c1", "r1", 0, 10), contract.ErrUnknownRun, "Subscribe on a closed connection")
		}},
	}
}
