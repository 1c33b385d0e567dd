package keeper_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// recordingObserver records what the keeper reported.
type recordingObserver struct {
	mu        sync.Mutex
	leaseLost int
	provider  []string // "<provider>: <error>"
}

func (o *recordingObserver) LeaseLost(context.Context) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.leaseLost++
}

func (o *recordingObserver) ProviderError(_ context.Context, provider string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.provider = append(o.provider, provider+": "+err.Error())
}

func (o *recordingObserver) counts() (leaseLost, provider int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.leaseLost, len(o.provider)
}

// TestObserverProviderErrors: a failed provider call is reported once with the provider's
// name; a sentinel answer (gone) and a failure after the caller left are not.
func TestObserverProviderErrors(t *testing.T) {
	obs := &recordingObserver{}
	prov := counting.New(keepertest.ProviderName)
	k := newKeeper(t, keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{prov}, Observer: obs, Logger: quiet()})
	ctx := contract.WithTenant(t.Context(), "t")
	start := func(ctx context.Context, run string) (keeper.StartResult, error) {
		return k.Start(ctx, keeper.StartInput{RunID: run, ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}})
	}
	if _, err := start(ctx, "r0"); err != nil {
		t.Fatal(err)
	}
	// Gone: the start creates afresh; a sentinel is the provider's answer, not a failure.
	prov.FailResume(func(string) error { return contract.ErrSandboxGone })
	if res, err := start(ctx, "r1"); err != nil || res.Outcome != keeper.OutcomeCreated {
		t.Fatalf("start after gone: %v %v", res.Outcome, err)
	}
	if _, n := obs.counts(); n != 0 || prov.Counts().Resumes < 2 {
		t.Fatalf("gone reported as %d provider errors after %d resumes", n, prov.Counts().Resumes)
	}
	// A failing provider: reported once, and the start answers unavailable.
	prov.FailResume(func(string) error { return errors.New("upstream 503") })
	if _, err := start(ctx, "r2"); !errors.Is(err, keeper.ErrUnavailable) {
		t.Fatalf("start with a failing provider: %v", err)
	}
	obs.mu.Lock()
	got := append([]string(nil), obs.provider...)
	obs.mu.Unlock()
	if len(got) != 1 || got[0] != keepertest.ProviderName+": upstream 503" {
		t.Fatalf("provider errors %q, want one from %s", got, keepertest.ProviderName)
	}
	// The caller left while the provider was failing: its cancellation, not the provider's.
	cctx, cancel := context.WithCancel(ctx)
	var hit atomic.Int64
	prov.FailResume(func(string) error { hit.Add(1); cancel(); return errors.New("upstream 503") })
	if _, err := start(cctx, "r3"); err == nil {
		t.Fatal("start whose caller left succeeded")
	}
	if _, n := obs.counts(); hit.Load() == 0 || n != 1 {
		t.Fatalf("after a cancelled caller (hit %d): %d provider errors, want still 1", hit.Load(), n)
	}
}

// leaseLosingLocks loses the lease of the first `lose` acquisitions (fn's context is
// cancelled with cause ErrLeaseLost at once), then behaves like the wrapped store.
type leaseLosingLocks struct {
	contract.LockStore
	lose atomic.Int64
}

func (l *leaseLosingLocks) WithLock(ctx context.Context, key string, fn func(context.Context) error) error {
	return l.LockStore.WithLock(ctx, key, func(lctx context.Context) error {
		if l.lose.Add(-1) < 0 {
			return fn(lctx)
		}
		c, cancel := context.WithCancelCause(lctx)
		cancel(contract.ErrLeaseLost)
		return fn(c)
	})
}

// TestObserverLeaseLost: a start that loses its sandbox lock lease reports it once per
// loss, queues again and succeeds; a start that never loses one reports nothing.
func TestObserverLeaseLost(t *testing.T) {
	obs := &recordingObserver{}
	fb := storetest.NewFaultBackend(memstore.New())
	locks := &leaseLosingLocks{LockStore: fb.Inner().Locks()}
	fb.SetLocks(locks)
	prov := counting.New(keepertest.ProviderName)
	k := newKeeper(t, keeper.Config{Backend: fb, Providers: []contract.Provider{prov}, Observer: obs, Logger: quiet()})
	ctx := contract.WithTenant(t.Context(), "t")
	in := func(run, thread string) keeper.StartInput {
		return keeper.StartInput{RunID: run, ThreadID: thread, Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}}
	}
	if _, err := k.Start(ctx, in("r0", "th0")); err != nil {
		t.Fatal(err)
	}
	if ll, _ := obs.counts(); ll != 0 {
		t.Fatalf("lease lost reported %d times without a loss", ll)
	}
	locks.lose.Store(2)
	res, err := k.Start(ctx, in("r1", "th1"))
	if err != nil || res.Outcome != keeper.OutcomeCreated {
		t.Fatalf("start after two lost leases: %v %v", res.Outcome, err)
	}
	if ll, pe := obs.counts(); ll != 2 || pe != 0 || fb.Calls("Locks.WithLock") != 4 {
		t.Fatalf("lease lost %d, provider errors %d, lock acquisitions %d; want 2, 0, 4", ll, pe, fb.Calls("Locks.WithLock"))
	}
	// A nil observer (the default) is fine on the same path.
	k2 := newKeeper(t, keeper.Config{Backend: fb, Providers: []contract.Provider{prov}, Logger: quiet()})
	locks.lose.Store(1)
	if _, err := k2.Start(ctx, in("r2", "th2")); err != nil {
		t.Fatalf("start with a nil observer: %v", err)
	}
	if locks.lose.Load() >= 0 {
		t.Fatal("the lease was never lost on the nil-observer path")
	}
}

// quiet discards the keeper's log lines (the failures above are on purpose).
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }
