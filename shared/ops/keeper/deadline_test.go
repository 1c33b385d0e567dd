package keeper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
)

// TestCreateHasItsOwnDeadline: a provider Create under the sandbox lock is bounded by
// CreateTimeout even when the caller's context has no deadline; otherwise a hanging
// provider holds the lock (renewed for ever) as long as the caller waits.
func TestCreateHasItsOwnDeadline(t *testing.T) {
	prov := counting.New(keepertest.ProviderName)
	var (
		mu   sync.Mutex
		left []time.Duration // remaining time of each Create's ctx; -1 = no deadline
	)
	prov.BeforeCreate(func(ctx context.Context, _ int, _ contract.CreateInput) {
		mu.Lock()
		defer mu.Unlock()
		if dl, ok := ctx.Deadline(); ok {
			left = append(left, time.Until(dl))
		} else {
			left = append(left, -1)
		}
	})
	const createTimeout = time.Hour
	k := newKeeper(t, keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{prov},
		CreateTimeout: createTimeout, Logger: quiet()})
	ctx := contract.WithTenant(context.Background(), "t") // no deadline
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

// deadlineSnapshotter records the deadline of every Snapshot call.
type deadlineSnapshotter struct {
	*counting.Provider
	left []time.Duration // -1 = no deadline
}

func (d *deadlineSnapshotter) Snapshot(ctx context.Context, psid, label string) (string, error) {
	if dl, ok := ctx.Deadline(); ok {
		d.left = append(d.left, time.Until(dl))
	} else {
		d.left = append(d.left, -1)
	}
	return d.Provider.Snapshot(ctx, psid, label)
}

// TestSnapshotHasItsOwnDeadline: the provider's Snapshot is bounded by CreateTimeout even
// when the caller's context has no deadline.
func TestSnapshotHasItsOwnDeadline(t *testing.T) {
	prov := &deadlineSnapshotter{Provider: counting.New(keepertest.ProviderName)}
	const createTimeout = time.Hour
	k := newKeeper(t, keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{prov},
		CreateTimeout: createTimeout, Logger: quiet()})
	ctx := contract.WithTenant(context.Background(), "t") // no deadline
	res, err := k.Start(ctx, keeper.StartInput{RunID: "r", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Snapshot(ctx, "r", res.Driver.Cursor, "l"); err != nil {
		t.Fatal(err)
	}
	if len(prov.left) != 1 || prov.left[0] <= 0 || prov.left[0] > createTimeout {
		t.Fatalf("Snapshot deadlines %v; want one within CreateTimeout %v", prov.left, createTimeout)
	}
}
