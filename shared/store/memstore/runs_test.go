package memstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

func tctx(t *testing.T, tenant string) context.Context {
	return contract.WithTenant(t.Context(), tenant)
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantErr(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

func claimed(t *testing.T, runs contract.FencedRuns, ctx context.Context, id string) contract.RunState {
	t.Helper()
	st, created, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
		NewRun: contract.NewRun{RunID: id, ThreadID: "th", StartedAt: 100}, SandboxKey: "sk_1",
		LeaseUntil: 1000, Token: "create-" + id})
	must(t, err, "create claimed")
	if !created || st.Epoch() != 1 {
		t.Fatalf("create claimed: created=%v epoch=%d, want true, 1", created, st.Epoch())
	}
	return st
}

func TestCreateClaimedRecognisesItsToken(t *testing.T) {
	ctx, runs := tctx(t, "a"), memstore.New().Runs()
	claimed(t, runs, ctx, "r1")
	in := contract.CreateClaimedRun{NewRun: contract.NewRun{RunID: "r1", ThreadID: "th"}, SandboxKey: "sk_1", Token: "create-r1"}
	if _, created, err := runs.CreateClaimed(ctx, in); err != nil || !created {
		t.Fatalf("retried create with own token: created=%v err=%v, want true, nil", created, err)
	}
	in.Token = "other"
	st, created, err := runs.CreateClaimed(ctx, in)
	if err != nil || created || st.LeaseUntil != 1000 {
		t.Fatalf("create by another token: created=%v err=%v lease=%d, want false, nil, untouched", created, err, st.LeaseUntil)
	}
}

func TestClaimRefusalsAndToken(t *testing.T) {
	ctx, runs := tctx(t, "a"), memstore.New().Runs()
	_, err := runs.Claim(ctx, "nope", contract.Claim{Token: "c"})
	wantErr(t, err, contract.ErrUnknownRun, "claim unknown")

	claimed(t, runs, ctx, "r1")
	_, err = runs.Detach(ctx, "r1", 1, "sk_1", 500)
	must(t, err, "detach")
	ds := int64(500)
	c := contract.Claim{Token: "c1", LeaseUntil: 2000, ClearDetached: true, If: contract.ClaimCond{DetachedSince: &ds}}
	st, err := runs.Claim(ctx, "r1", c)
	must(t, err, "claim")
	if st.Epoch() != 2 || st.DetachedSince != nil || st.LeaseUntil != 2000 {
		t.Fatalf("after claim: %+v", st)
	}
	// The lost-response retry: the condition now fails, but the run carries c1.
	st, err = runs.Claim(ctx, "r1", c)
	if err != nil || st.Epoch() != 2 {
		t.Fatalf("retried claim: epoch %d err %v, want 2, nil", st.Epoch(), err)
	}
	c.Token = "c2"
	_, err = runs.Claim(ctx, "r1", c)
	wantErr(t, err, contract.ErrConflict, "claim by another token, condition failing")

	_, err = runs.UpdateFenced(ctx, "r1", 1, contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
	wantErr(t, err, contract.ErrSuperseded, "update by stale epoch")
	done := contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set(int64(9))}
	_, err = runs.UpdateFenced(ctx, "r1", 2, done)
	must(t, err, "finish")
	_, err = runs.UpdateFenced(ctx, "r1", 2, done)
	must(t, err, "retried finish")
	_, err = runs.UpdateFenced(ctx, "r1", 2, contract.RunPatch{Status: contract.Set(contract.StatusFailed)})
	wantErr(t, err, contract.ErrTerminalRun, "different terminal write")
	_, err = runs.Claim(ctx, "r1", contract.Claim{Token: "c3"})
	wantErr(t, err, contract.ErrTerminalRun, "claim terminal")
}

func TestHeartbeatUndoesOnlyALapse(t *testing.T) {
	ctx, runs := tctx(t, "a"), memstore.New().Runs()
	claimed(t, runs, ctx, "r1")
	wantErr(t, runs.Lapse(ctx, "r1", 1, 999), contract.ErrConflict, "lapse with wrong leaseUntil")
	must(t, runs.Lapse(ctx, "r1", 1, 1000), "lapse")
	must(t, runs.Lapse(ctx, "r1", 1, 1000), "retried lapse")
	st, err := runs.Heartbeat(ctx, "r1", 1, 3000)
	must(t, err, "heartbeat")
	if st.Lapsed || st.DetachedSince != nil || st.LeaseUntil != 3000 {
		t.Fatalf("heartbeat did not undo the lapse: %+v", st)
	}
	_, err = runs.Detach(ctx, "r1", 1, "sk_1", 4000)
	must(t, err, "detach")
	st, err = runs.Detach(ctx, "r1", 1, "sk_1", 5000)
	must(t, err, "repeated detach")
	if *st.DetachedSince != 4000 {
		t.Fatalf("repeated detach moved detachedSince to %d", *st.DetachedSince)
	}
	st, err = runs.Heartbeat(ctx, "r1", 1, 6000)
	must(t, err, "heartbeat")
	if st.DetachedSince == nil || *st.DetachedSince != 4000 {
		t.Fatalf("heartbeat removed an explicit detach: %+v", st)
	}
}

func TestReadsNeverAlias(t *testing.T) {
	ctx, runs := tctx(t, "a"), memstore.New().Runs()
	claimed(t, runs, ctx, "r1")
	must(t, refstore.Runs(runs).Update(ctx, "r1", contract.RunPatch{Usage: contract.Set(json.RawMessage(`{"n":1}`))}), "update")
	got, err := refstore.Runs(runs).Get(ctx, "r1")
	must(t, err, "get")
	*got.DriverEpoch = 99
	*got.SandboxKey = "mutated"
	got.Usage[2] = 'X'
	again, err := refstore.Runs(runs).Get(ctx, "r1")
	must(t, err, "get again")
	if again.Epoch() != 1 || *again.SandboxKey != "sk_1" || string(again.Usage) != `{"n":1}` {
		t.Fatalf("a caller's mutation reached the store: %+v usage %s", again, again.Usage)
	}
}

func TestTenantsAreIsolatedAndValidated(t *testing.T) {
	s := memstore.New()
	claimed(t, s.Runs(), tctx(t, "a"), "r1")
	if got, err := refstore.Runs(s.Runs()).Get(tctx(t, "b"), "r1"); err != nil || got != nil {
		t.Fatalf("tenant b read a's run: %v %v", got, err)
	}
	_, err := refstore.Runs(s.Runs()).Get(tctx(t, "bad#t"), "r1")
	wantErr(t, err, contract.ErrInvalid, "invalid tenant")
	_, err = refstore.Runs(s.Runs()).Get(tctx(t, "a"), "")
	wantErr(t, err, contract.ErrInvalid, "empty id")
}

func TestIndexLagDelaysAdditionsAndKeepsRemovals(t *testing.T) {
	const lag = 3
	s := memstore.New(memstore.WithIndexLag(lag))
	ctx, runs := tctx(t, "a"), s.Runs()
	claimed(t, runs, ctx, "r1")
	polls := 0
	for {
		ids, err := runs.RunsUsingKey(ctx, "sk_1")
		must(t, err, "runs using key")
		if len(ids) == 1 {
			break
		}
		if polls++; polls > lag {
			t.Fatalf("entry still invisible after %d polls", polls)
		}
	}
	if polls == 0 {
		t.Fatal("a fresh index entry was visible at once under lag")
	}
	_, err := runs.UpdateFenced(ctx, "r1", 1, contract.RunPatch{Status: contract.Set(contract.StatusAborted)})
	must(t, err, "finish")
	ids, err := runs.RunsUsingKey(ctx, "sk_1")
	must(t, err, "runs using key after finish")
	if !slices.Equal(ids, []string{"r1"}) {
		t.Fatalf("a removed entry did not linger: %v", ids)
	}
	st, err := runs.State(ctx, "r1")
	must(t, err, "state")
	if st.Status != contract.StatusAborted {
		t.Fatal("a consistent read lagged")
	}
}

func TestCancelJumpsTheReclaimQueue(t *testing.T) {
	s := memstore.New(memstore.WithDriverLease(time.Second))
	ctx, runs := tctx(t, "a"), s.Runs()
	claimed(t, runs, ctx, "r1")
	_, err := refstore.Runs(runs).CreateOrResume(tctx(t, "b"), contract.NewRun{RunID: "r0", ThreadID: "th", StartedAt: 0})
	must(t, err, "create")
	got, err := s.Reaper().ReclaimCandidates(ctx, 1_000_000, 10)
	must(t, err, "candidates")
	want := []contract.Candidate{{Tenant: "a", RunID: "r1", ReclaimAt: 1000}, {Tenant: "b", RunID: "r0", ReclaimAt: 1000}}
	if !slices.Equal(got, want) {
		t.Fatalf("candidates before cancel: %+v, want %+v (lease end; startedAt+driver lease; each a whole lease; tie by tenant)", got, want)
	}
	_, err = runs.RequestCancel(ctx, "r1")
	must(t, err, "cancel")
	got, err = s.Reaper().ReclaimCandidates(ctx, 0, 10)
	must(t, err, "candidates")
	if len(got) != 1 || got[0].RunID != "r1" || got[0].ReclaimAt != 0 {
		t.Fatalf("cancelled run not first with reclaimAt 0: %+v", got)
	}
}
