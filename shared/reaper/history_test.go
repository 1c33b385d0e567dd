package reaper

import (
	"fmt"
	"testing"
)

func TestHistoryKeepsTheLastSweepsNewestFirst(t *testing.T) {
	h := NewHistory(3)
	for i := range 5 {
		h.Add(SweepRecord{StartedAt: int64(i)})
	}
	got, more := h.Recent(0, 2)
	if len(got) != 2 || got[0].Seq != 5 || got[1].Seq != 4 || !more {
		t.Fatalf("first page %+v more=%v", got, more)
	}
	got, more = h.Recent(got[1].Seq, 2)
	if len(got) != 1 || got[0].Seq != 3 || got[0].StartedAt != 2 || more {
		t.Fatalf("second page %+v more=%v (capacity 3: sweeps 1 and 2 dropped)", got, more)
	}
}

func TestSweepRecordForTenantKeepsOnlyItsRuns(t *testing.T) {
	rec := SweepRecord{Report: Report{Considered: 3, Probed: 2, Runs: []RunEntry{
		{Tenant: "a", RunID: "r1", Outcome: Expired},
		{Tenant: "b", RunID: "r2", Outcome: Finalized},
		{Tenant: "a", RunID: "r3", Outcome: Producing},
	}, Swept: Swept{Lapsed: 4}}}
	rec.Report.Outcomes.add(Expired)
	rec.Report.Outcomes.add(Finalized)
	rec.Report.Outcomes.add(Producing)
	got := rec.ForTenant("a")
	if fmt.Sprintln(len(got.Report.Runs), got.Report.Runs[0].RunID, got.Report.Runs[1].RunID) != "2 r1 r3\n" ||
		got.Report.Outcomes.Finalized != 0 || got.Report.Outcomes.Expired != 1 || got.Report.Outcomes.Producing != 1 ||
		got.Report.Considered != 2 || got.Report.Probed != 2 || got.Report.Swept.Lapsed != 4 {
		t.Fatalf("for tenant a: %+v", got.Report)
	}
	if len(rec.Report.Runs) != 3 {
		t.Fatal("ForTenant modified the record it was called on")
	}
	if n := len(rec.ForTenant("c").Report.Runs); n != 0 {
		t.Fatalf("tenant c sees %d runs", n)
	}
}
