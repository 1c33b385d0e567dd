package testkit

import (
	"context"
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// brokenLister is memstore's lister with one defect.
type brokenLister struct {
	contract.RunLister
	defect string
}

func (b brokenLister) ListRuns(ctx context.Context, f contract.RunFilter, after *contract.RunPos, limit int) (contract.RunPage, error) {
	switch b.defect {
	case "ignores-after": // every page starts over from the newest
		after = nil
	case "drops-tenant": // lists the runs of tenant-b too
		page, err := b.RunLister.ListRuns(ctx, f, after, limit)
		other, _ := b.RunLister.ListRuns(contract.WithTenant(ctx, "tenant-b"), f, nil, contract.MaxListLimit)
		page.Runs = append(page.Runs, other.Runs...)
		return page, err
	case "skips-one": // the page's last run is cut, its position still returned
		page, err := b.RunLister.ListRuns(ctx, f, after, limit)
		if page.Next != nil && len(page.Runs) > 0 {
			page.Runs = page.Runs[:len(page.Runs)-1]
		}
		return page, err
	case "stale-status": // a filter applied to what the index held, not re-read
		page, err := b.RunLister.ListRuns(ctx, contract.RunFilter{ThreadID: f.ThreadID}, after, limit)
		return page, err
	}
	return b.RunLister.ListRuns(ctx, f, after, limit)
}

// TestRunListerWalkCatchesBrokenListers is the negative control of RunRunListerConformance:
// the walk and comparison its cases use fail against each broken lister and pass against
// the real one.
func TestRunListerWalkCatchesBrokenListers(t *testing.T) {
	s := memstore.New()
	for _, r := range []struct {
		id     string
		at     int64
		tenant string
	}{{"r1", 100, rsTenant}, {"r2", 200, rsTenant}, {"r3", 300, rsTenant}, {"x1", 400, "tenant-b"}} {
		rsCreate(t, refstore.Runs(s.Runs()), r.tenant, r.id, "t", r.at)
	}
	rsUpdate(t, refstore.Runs(s.Runs()), rsTenant, "r2", contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
	want := map[contract.RunStatus][]string{"": {"r3", "r2", "r1"}, contract.StatusRunning: {"r3", "r1"}}
	walk := func(l contract.RunLister, st contract.RunStatus) ([]string, error) {
		return rlWalk(t, l, rsTenant, contract.RunFilter{Status: st}, 1)
	}
	real := s.Runs().(contract.RunLister)
	for st, w := range want {
		if got, err := walk(real, st); err != nil || !slices.Equal(got, w) {
			t.Fatalf("the real lister, status %q: %v %v", st, got, err)
		}
	}
	for _, defect := range []string{"ignores-after", "drops-tenant", "skips-one", "stale-status"} {
		caught := false
		for st, w := range want {
			got, err := walk(brokenLister{real, defect}, st)
			caught = caught || err != nil || !slices.Equal(got, w)
		}
		if !caught {
			t.Errorf("a lister that %s passes the walk", defect)
		}
	}
}
