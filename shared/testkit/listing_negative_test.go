package testkit

import (
	"context"
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/sandbox/refstore"
)

// brokenLister is memstore's lister with one defect.
type brokenLister struct {
	sandbox.RunLister
	defect string
}

func (b brokenLister) ListRuns(ctx context.Context, f sandbox.RunFilter, after *sandbox.RunPos, limit int) (sandbox.RunPage, error) {
	switch b.defect {
	case "ignores-after": // every page starts over from the newest
		after = nil
	case "drops-tenant": // lists the runs of tenant-b too
		page, err := b.RunLister.ListRuns(ctx, f, after, limit)
		other, _ := b.RunLister.ListRuns(sandbox.WithTenant(ctx, "tenant-b"), f, nil, sandbox.MaxListLimit)
		page.Runs = append(page.Runs, other.Runs...)
		return page, err
	case "skips-one": // the page's last run is cut, its position still returned
		page, err := b.RunLister.ListRuns(ctx, f, after, limit)
		if page.Next != nil && len(page.Runs) > 0 {
			page.Runs = page.Runs[:len(page.Runs)-1]
		}
		return page, err
	case "stale-status": // a filter applied to what the index held, not re-read
		page, err := b.RunLister.ListRuns(ctx, sandbox.RunFilter{ThreadID: f.ThreadID}, after, limit)
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
	rsUpdate(t, refstore.Runs(s.Runs()), rsTenant, "r2", sandbox.RunPatch{Status: sandbox.Set(sandbox.StatusCompleted)})
	want := map[sandbox.RunStatus][]string{"": {"r3", "r2", "r1"}, sandbox.StatusRunning: {"r3", "r1"}}
	walk := func(l sandbox.RunLister, st sandbox.RunStatus) ([]string, error) {
		return rlWalk(t, l, rsTenant, sandbox.RunFilter{Status: st}, 1)
	}
	real := s.Runs().(sandbox.RunLister)
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
