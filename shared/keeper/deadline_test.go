package keeper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/keeper/keepertest"
	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// TestCreateHasItsOwnDeadline: a provider Create under the sandbox lock is bounded by
// CreateTimeout even when the caller's context has no deadline; otherwise a hanging
// provider holds the lock (renewed for ever) as long as the caller waits.
func TestCreateHasItsOwnDeadline(t *testing.T) {
	prov := keepertest.NewCountingProvider(keepertest.ProviderName)
	var (
		mu   sync.Mutex
		left []time.Duration // remaining time of each Create's ctx; -1 = no deadline
	)
	prov.BeforeCreate(func(ctx context.Context, _ int, _ sandbox.CreateInput) {
		mu.Lock()
		defer mu.Unlock()
		if dl, ok := ctx.Deadline(); ok {
			left = append(left, time.Until(dl))
		} else {
			left = append(left, -1)
		}
	})
	const createTimeout = time.Hour
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []sandbox.Provider{prov},
		CreateTimeout: createTimeout, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := sandbox.WithTenant(context.Background(), "t") // no deadline
	res, err := k.Start(ctx, keeper.StartInput{RunID: "r", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}})
	if err != nil || res.Outcome != keeper.OutcomeCreated {
		t.Fatalf("start: %+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(left) != 1 || left[0] <= 0 || left[0] > createTimeout {
		t.Fatalf("Create deadlines %v; want one within CreateTimeout %v", left, createTimeout)
	}
}
