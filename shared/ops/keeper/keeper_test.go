package keeper_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// batchStore is memstore with the optional batch reads, counting their use.
type batchStore struct {
	*memstore.Store
	rowIntent, stateRow atomic.Int64
}

// GetRowAndIntent reads both, counting the batch.
func (b *batchStore) GetRowAndIntent(ctx context.Context, key string) (*contract.InstanceRow, *contract.Intent, error) {
	b.rowIntent.Add(1)
	row, err := b.Instances().GetRow(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	in, err := b.Intents().Get(ctx, key)
	return row, in, err
}

// GetStateAndRow reads both, counting the batch.
func (b *batchStore) GetStateAndRow(ctx context.Context, runID, key string) (*contract.RunState, *contract.InstanceRow, error) {
	b.stateRow.Add(1)
	st, err := b.Runs().State(ctx, runID)
	if err != nil {
		return nil, nil, err
	}
	row, err := b.Instances().GetRow(ctx, key)
	return st, row, err
}

// TestBatchReadsUsed proves the keeper uses a backend's optional batch reads.
func TestBatchReadsUsed(t *testing.T) {
	b := &batchStore{Store: memstore.New()}
	prov := counting.New(keepertest.ProviderName)
	k := newKeeper(t, keeper.Config{Backend: b, Providers: []contract.Provider{prov}})
	ctx := contract.WithTenant(t.Context(), "t")
	in := keeper.StartInput{RunID: "r1", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}}
	res, err := k.Start(ctx, in)
	if err != nil || res.Outcome != keeper.OutcomeCreated {
		t.Fatalf("start: %v %v", res.Outcome, err)
	}
	if got := b.rowIntent.Load(); got != 1 {
		t.Fatalf("row+intent batch reads under the lock: %d, want 1", got)
	}
	ar, err := k.Attach(ctx, "r1")
	if err != nil || ar.Sandbox.ProviderSandboxID != res.Sandbox.ProviderSandboxID || ar.Driver.Epoch != 2 {
		t.Fatalf("attach: %+v %v", ar, err)
	}
	if got := b.stateRow.Load(); got != 1 {
		t.Fatalf("state+row batch reads of attach: %d, want 1", got)
	}
}

// TestRetriedCreateAfterAClaimTakesOver: Start's create-claimed lands, its response is
// lost, and another driver claims the run before the retry; the retry recognises its token
// but must not answer epoch 1 (already superseded): the start takes the run over.
func TestRetriedCreateAfterAClaimTakesOver(t *testing.T) {
	fb := storetest.NewFaultBackend(memstore.New())
	ctx := contract.WithTenant(t.Context(), "t")
	fb.Hook("Runs.CreateClaimed", func(hctx context.Context, call int) {
		if call == 3 { // r1's retry (r0 made call 1, r1's first attempt call 2): someone attaches in between
			if _, err := fb.Inner().Runs().Claim(ctx, "r1", contract.Claim{Token: "other", LeaseUntil: 1 << 50}); err != nil {
				t.Errorf("interleaved claim: %v", err)
			}
		}
	})
	prov := counting.New(keepertest.ProviderName)
	k := newKeeper(t, keeper.Config{Backend: fb, Providers: []contract.Provider{prov}})
	setup := keeper.Setup{ID: "s", Provider: keepertest.ProviderName}
	// r0 first gives the thread its sandbox row, so the take-over finds the sandbox alive.
	if _, err := k.Start(ctx, keeper.StartInput{RunID: "r0", ThreadID: "th", Sandbox: setup}); err != nil {
		t.Fatal(err)
	}
	fb.LoseResponses(true)
	res, err := k.Start(ctx, keeper.StartInput{RunID: "r1", ThreadID: "th", Sandbox: setup})
	if err != nil {
		t.Fatal(err)
	}
	st, err := fb.Inner().Runs().State(ctx, "r1")
	if err != nil || st == nil {
		t.Fatalf("state: %v %v", st, err)
	}
	if fb.Lost("Runs.CreateClaimed") != 1 || res.Outcome != keeper.OutcomeTakenOver ||
		res.Driver.Epoch != st.Epoch() || res.Driver.Epoch < 3 {
		t.Fatalf("outcome %s epoch %d, run epoch %d, lost %d: want a take-over at the run's current epoch",
			res.Outcome, res.Driver.Epoch, st.Epoch(), fb.Lost("Runs.CreateClaimed"))
	}
}

// newKeeper is keeper.New(cfg), failing the test on an error.
func newKeeper(t *testing.T, cfg keeper.Config) *keeper.Keeper {
	t.Helper()
	k, err := keeper.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
