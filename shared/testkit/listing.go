package testkit

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// RunRunListerConformance proves the run listing (contract.RunLister): a tenant's runs
// newest first (ties by runId), walked page by page without a duplicate or a gap, filtered
// by thread and status (re-read: a run is listed under its current status only), tenants
// isolated, inputs validated. Listings are polled with a deadline: the index may lag.
func RunRunListerConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, rlCases())
}

// rlLister returns the backend's lister, skipping the case (by name) when it has none.
func rlLister(t *testing.T, b contract.Backend) contract.RunLister {
	t.Helper()
	l, ok := b.Runs().(contract.RunLister)
	if !ok {
		t.Skip("backend lacks capability sandbox.RunLister (run listing)")
	}
	return l
}

// rlWalk lists every page of f with page size limit and returns the ids in order; it fails
// on a page over limit or a walk longer than the runs could need.
func rlWalk(t *testing.T, l contract.RunLister, tenant string, f contract.RunFilter, limit int) ([]string, error) {
	t.Helper()
	var ids []string
	var after *contract.RunPos
	for pages := 0; ; pages++ {
		if pages > 100 {
			return ids, errors.New("more than 100 pages")
		}
		page, err := l.ListRuns(ctxFor(t, tenant), f, after, limit)
		if err != nil {
			return ids, err
		}
		if len(page.Runs) > limit {
			return ids, fmt.Errorf("page of %d runs, limit %d", len(page.Runs), limit)
		}
		for _, r := range page.Runs {
			if !f.Matches(r.RunRecord) {
				return ids, fmt.Errorf("run %s (%s, thread %s) does not match the filter %+v", r.RunID, r.Status, r.ThreadID, f)
			}
			ids = append(ids, r.RunID)
		}
		if page.Next == nil {
			return ids, nil
		}
		if after != nil && !page.Next.Before(*after) {
			return ids, fmt.Errorf("next %+v does not move past %+v", *page.Next, *after)
		}
		after = page.Next
	}
}

// rlEventually polls a walk of f until it yields exactly want.
func rlEventually(t *testing.T, b contract.Backend, tenant string, f contract.RunFilter, limit int, want []string, what string) {
	t.Helper()
	l := rlLister(t, b)
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := rlWalk(t, l, tenant, f, limit)
		if err != nil {
			return false, "", fmt.Errorf("walk %+v limit %d: %w", f, limit, err)
		}
		return cfSameStrings(got, want), cfStrings(got), nil
	})
}

func rlCases() []cfCase {
	// Seven runs over two threads; startedAt ties at 200 and 300 order by runId.
	seed := func(t *testing.T, b contract.Backend) {
		for _, r := range []struct {
			id, thread string
			at         int64
		}{
			{"r1", "ta", 100}, {"r2", "tb", 200}, {"r3", "ta", 200}, {"r4", "tb", 300},
			{"r5", "ta", 300}, {"r6", "ta", 400}, {"r7", "tb", 500},
		} {
			rsCreate(t, refstore.Runs(b.Runs()), rsTenant, r.id, r.thread, r.at)
		}
	}
	newestFirst := []string{"r7", "r6", "r5", "r4", "r3", "r2", "r1"}
	return []cfCase{
		{"ListRuns lists the tenant's runs newest first, ties by runId, every page size", func(t *testing.T, b contract.Backend) {
			seed(t, b)
			for _, limit := range []int{1, 2, 3, 7, contract.MaxListLimit} {
				rlEventually(t, b, rsTenant, contract.RunFilter{}, limit, newestFirst, fmt.Sprintf("walk with limit %d", limit))
			}
		}},
		{"ListRuns by thread and by status, the status as it is now", func(t *testing.T, b contract.Backend) {
			seed(t, b)
			rlEventually(t, b, rsTenant, contract.RunFilter{ThreadID: "ta"}, 2, []string{"r6", "r5", "r3", "r1"}, "thread ta")
			rlEventually(t, b, rsTenant, contract.RunFilter{ThreadID: "none"}, 2, nil, "thread without runs")
			rsUpdate(t, refstore.Runs(b.Runs()), rsTenant, "r5", contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set[int64](350)})
			rsUpdate(t, refstore.Runs(b.Runs()), rsTenant, "r2", contract.RunPatch{Status: contract.Set(contract.StatusAborted), FinishedAt: contract.Set[int64](250)})
			rlEventually(t, b, rsTenant, contract.RunFilter{Status: contract.StatusRunning}, 2, []string{"r7", "r6", "r4", "r3", "r1"}, "running")
			rlEventually(t, b, rsTenant, contract.RunFilter{Status: contract.StatusCompleted}, 2, []string{"r5"}, "completed")
			rlEventually(t, b, rsTenant, contract.RunFilter{ThreadID: "tb", Status: contract.StatusAborted}, 1, []string{"r2"}, "tb aborted")
			rlEventually(t, b, rsTenant, contract.RunFilter{ThreadID: "ta", Status: contract.StatusRunning}, 1, []string{"r6", "r3", "r1"}, "ta running")
			rlEventually(t, b, rsTenant, contract.RunFilter{Status: contract.StatusFailed}, 3, nil, "failed: none")
		}},
		{"ListRuns never crosses tenants", func(t *testing.T, b contract.Backend) {
			seed(t, b)
			rsCreate(t, refstore.Runs(b.Runs()), "tenant-b", "r9", "ta", 900)
			rsCreate(t, refstore.Runs(b.Runs()), "", "r8", "ta", 800)
			rlEventually(t, b, rsTenant, contract.RunFilter{}, 3, newestFirst, "tenant-a")
			rlEventually(t, b, rsTenant, contract.RunFilter{ThreadID: "ta"}, 3, []string{"r6", "r5", "r3", "r1"}, "tenant-a thread ta")
			rlEventually(t, b, "tenant-b", contract.RunFilter{}, 3, []string{"r9"}, "tenant-b")
			rlEventually(t, b, "", contract.RunFilter{}, 3, []string{"r8"}, "the empty tenant")
			rlEventually(t, b, "tenant-c", contract.RunFilter{}, 3, nil, "a tenant without runs")
		}},
		{"ListRuns refuses bad input with ErrInvalid", func(t *testing.T, b contract.Backend) {
			l := rlLister(t, b)
			ctx := ctxFor(t, rsTenant)
			for name, call := range map[string]func() error{
				"limit 0": func() error { _, err := l.ListRuns(ctx, contract.RunFilter{}, nil, 0); return err },
				"limit > max": func() error {
					_, err := l.ListRuns(ctx, contract.RunFilter{}, nil, contract.MaxListLimit+1)
					return err
				},
				"bad status": func() error { _, err := l.ListRuns(ctx, contract.RunFilter{Status: "Running"}, nil, 5); return err },
				"empty after": func() error {
					_, err := l.ListRuns(ctx, contract.RunFilter{}, &contract.RunPos{StartedAt: 1}, 5)
					return err
				},
				"bad tenant": func() error {
					_, err := l.ListRuns(ctxFor(t, "bad#tenant"), contract.RunFilter{}, nil, 5)
					return err
				},
			} {
				cfIs(t, call(), contract.ErrInvalid, name)
			}
		}},
	}
}
