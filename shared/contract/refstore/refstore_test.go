package refstore_test

import (
	"errors"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// bareRuns is a run store offering the contract alone: no RunWriter, no RunLister.
type bareRuns struct{ contract.FencedRuns }

// TestContractAloneAnswersUnsupported: over a backend with nothing but the contract, the
// reads refstore derives from it work, and the methods that need an optional capability
// answer errors.ErrUnsupported naming it instead of failing some other way.
func TestContractAloneAnswersUnsupported(t *testing.T) {
	s := memstore.New()
	ctx := contract.WithTenant(t.Context(), "t")
	st, _, err := s.Runs().CreateClaimed(ctx, contract.CreateClaimedRun{
		NewRun: contract.NewRun{RunID: "r", ThreadID: "th", StartedAt: 5}, SandboxKey: "k", Token: "c"})
	if err != nil {
		t.Fatal(err)
	}
	runs := refstore.Runs(bareRuns{s.Runs()})
	got, err := runs.Get(ctx, "r")
	if err != nil || got == nil || got.RunID != "r" || got.Epoch() != st.Epoch() {
		t.Fatalf("Get = %+v, %v; want the created run", got, err)
	}
	if active, err := runs.FindActiveRun(ctx, "th"); err != nil || active == nil || active.RunID != "r" {
		t.Fatalf("FindActiveRun = %+v, %v", active, err)
	}
	for name, call := range map[string]func() error{
		"Update": func() error { return runs.Update(ctx, "r", contract.RunPatch{}) },
		"CreateOrResume": func() error {
			_, err := runs.CreateOrResume(ctx, contract.NewRun{RunID: "x", ThreadID: "th"})
			return err
		},
		"ListByThread":    func() error { _, err := runs.ListByThread(ctx, "th"); return err },
		"ListReclaimable": func() error { _, err := runs.ListReclaimable(ctx, 10, 0); return err },
	} {
		if err := call(); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s over the bare contract: %v, want errors.ErrUnsupported", name, err)
		}
	}
}

// TestInstancesOverTheRowPrimitives: Upsert over a tombstoned row forgets the pending
// reclaim (a full replace), and Delete of a live row leaves nothing, not a tombstone.
func TestInstancesOverTheRowPrimitives(t *testing.T) {
	s := memstore.New()
	ctx := contract.WithTenant(t.Context(), "t")
	rows, inst := s.Instances(), refstore.Instances(s.Instances())
	rec := contract.InstanceRecord{Key: "k", Provider: "p", ProviderSandboxID: "s1", ThreadID: "th", UpdatedAt: 10}
	if err := inst.Upsert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := rows.MarkReclaiming(ctx, "k", "s1", 10, 10, "tok"); err != nil {
		t.Fatal(err)
	}
	rec.ProviderSandboxID = "s2"
	if err := inst.Upsert(ctx, rec); err != nil {
		t.Fatalf("Upsert over a tombstone: %v", err)
	}
	row, err := rows.GetRow(ctx, "k")
	if err != nil || row == nil || row.Reclaiming != "" || row.ProviderSandboxID != "s2" {
		t.Fatalf("row after Upsert over a tombstone = %+v, %v; want s2, no reclaim", row, err)
	}
	if err := inst.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if row, err := rows.GetRow(ctx, "k"); err != nil || row != nil {
		t.Fatalf("row after Delete = %+v, %v; want none", row, err)
	}
	if err := inst.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete of a missing key: %v", err)
	}
}
