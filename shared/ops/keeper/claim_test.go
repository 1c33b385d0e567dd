package keeper_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// claimWorld is a keeper over a FaultBackend on memstore with one started run "r".
func claimWorld(t *testing.T) (*keeper.Keeper, *storetest.FaultBackend, keeper.StartResult) {
	t.Helper()
	fb := storetest.NewFaultBackend(memstore.New())
	k := newKeeper(t, keeper.Config{Backend: fb, Providers: []contract.Provider{counting.New(keepertest.ProviderName)}})
	ctx := contract.WithTenant(t.Context(), "acme")
	res, err := k.Start(ctx, keeper.StartInput{RunID: "r", ThreadID: "t", Sandbox: keeper.Setup{ID: "a", Provider: keepertest.ProviderName}})
	if err != nil {
		t.Fatal(err)
	}
	return k, fb, res
}

// TestClaimFencedRefusalWritesNothing: a claim whose condition fails is ErrConflict and
// neither the epoch nor the log moves.
func TestClaimFencedRefusalWritesNothing(t *testing.T) {
	k, fb, res := claimWorld(t)
	ctx := contract.WithTenant(t.Context(), "acme")
	if _, err := k.DetachWithKey(ctx, "r", res.Driver.Epoch, ""); err != nil {
		t.Fatal(err)
	}
	wrong := int64(1)
	_, _, err := k.ClaimFenced(ctx, "r", false, contract.ClaimCond{DetachedSince: &wrong})
	if !errors.Is(err, contract.ErrConflict) {
		t.Fatalf("claim on a wrong detachedSince: %v", err)
	}
	st, _ := fb.Inner().Runs().State(ctx, "r")
	if st.Epoch() != 1 || fb.Calls("Log.Fence") != 0 {
		t.Fatalf("a refused claim wrote: epoch %d, %d fences", st.Epoch(), fb.Calls("Log.Fence"))
	}
	ds := *st.DetachedSince
	st2, fence, err := k.ClaimFenced(ctx, "r", false, contract.ClaimCond{DetachedSince: &ds})
	if err != nil || st2.Epoch() != 2 || fence.Cursor.Epoch != 2 || st2.DetachedSince == nil {
		t.Fatalf("claim on the listed detachedSince: %+v %+v %v (detachedSince kept)", st2.RunRecord, fence, err)
	}
}

// TestClaimFencedRepairsAClosedLog: a run whose terminal write was lost after its close
// (log closed, status running) is repaired by the next claim: failed with log-closed, and
// the claim answers ErrTerminalRun, so no later claim is granted either.
func TestClaimFencedRepairsAClosedLog(t *testing.T) {
	k, fb, res := claimWorld(t)
	ctx := contract.WithTenant(t.Context(), "acme")
	if _, err := k.Append(ctx, "r", res.Driver.Cursor, []contract.Event{{Data: json.RawMessage(`1`)}}); err != nil {
		t.Fatal(err)
	}
	if err := fb.Inner().Log().Close(ctx, "r", contract.Cursor{Epoch: 1, Next: 2}); err != nil {
		t.Fatal(err)
	}
	_, _, err := k.ClaimFenced(ctx, "r", true, contract.ClaimCond{})
	if !errors.Is(err, contract.ErrTerminalRun) {
		t.Fatalf("claim of a run with a closed log: %v", err)
	}
	st, _ := fb.Inner().Runs().State(ctx, "r")
	if st.Status != contract.StatusFailed || st.Error == nil || st.Error.Code != "log-closed" {
		t.Fatalf("record = %+v; want failed, log-closed", st.RunRecord)
	}
	if _, err := k.Attach(ctx, "r"); !errors.Is(err, contract.ErrTerminalRun) {
		t.Fatalf("attach after the repair: %v", err)
	}
}

// TestClaimFencedRecognisesItsLostResponse: the claim's and the fence's first responses are
// lost; the retries recognise their own landed writes and the caller holds a fenced epoch.
func TestClaimFencedRecognisesItsLostResponse(t *testing.T) {
	k, fb, _ := claimWorld(t)
	ctx := contract.WithTenant(t.Context(), "acme")
	fb.LoseResponses(true)
	st, fence, err := k.ClaimFenced(ctx, "r", true, contract.ClaimCond{})
	if err != nil || fb.Lost("Runs.Claim") != 1 || fb.Lost("Log.Fence") != 1 {
		t.Fatalf("claim: %v; lost claim %d, fence %d", err, fb.Lost("Runs.Claim"), fb.Lost("Log.Fence"))
	}
	cur, _ := fb.Inner().Runs().State(ctx, "r")
	if cur.Epoch() != st.Epoch() || fence.Cursor.Epoch != st.Epoch() {
		t.Fatalf("the claim answered epoch %d, fence %d; the run is at %d", st.Epoch(), fence.Cursor.Epoch, cur.Epoch())
	}
	if _, err := k.Append(ctx, "r", fence.Cursor, []contract.Event{{Data: json.RawMessage(`1`)}}); err != nil {
		t.Fatalf("append at the claimed cursor: %v", err)
	}
}
