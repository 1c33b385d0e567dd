package reaper

import (
	"encoding/json"
	"fmt"
	"strings"
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

// TestSweepRecordForTenantShowsNothingOfOtherTenants: a tenant's view of a sweep holds its
// runs and counts made from them alone; the sweep-wide probe and housekeeping counts, the
// sweep's duration and its error text (all derived from every tenant) are absent.
func TestSweepRecordForTenantShowsNothingOfOtherTenants(t *testing.T) {
	rec := SweepRecord{Seq: 7, StartedAt: 1000, FinishedAt: 4321, Error: "reaper: list candidates: secret-key-of-b",
		Report: Report{Probed: 5, Swept: Swept{Lapsed: 4, IdleReclaimed: 2}}}
	for _, e := range []RunEntry{
		{Tenant: "a", RunID: "r1", Outcome: Expired, Sandbox: SandboxReclaimed},
		{Tenant: "b", RunID: "b-secret", Outcome: Finalized, Sandbox: SandboxKept},
		{Tenant: "a", RunID: "r3", Outcome: Finalized, Sandbox: SandboxKept},
		{Tenant: "b", RunID: "b-other", Outcome: Producing},
	} {
		rec.Report.add(e)
	}
	got := rec.ForTenant("a")
	o, s := got.Report.Outcomes, got.Report.Sandboxes
	if fmt.Sprintln(len(got.Report.Runs), got.Report.Runs[0].RunID, got.Report.Runs[1].RunID) != "2 r1 r3\n" ||
		o.Finalized != 1 || o.Expired != 1 || o.Producing != 0 || s.Kept != 1 || s.Reclaimed != 1 ||
		got.Report.Considered != 2 || got.Seq != 7 || got.StartedAt != 1000 {
		t.Fatalf("for tenant a: %+v", got)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{"b-secret", "b-other", `"b"`, "probed", "swept", "lapsed", "error", "finishedAt", "4321"} {
		if strings.Contains(string(b), leak) {
			t.Errorf("tenant a's view holds %s: %s", leak, b)
		}
	}
	if len(rec.Report.Runs) != 4 {
		t.Fatal("ForTenant modified the record it was called on")
	}
	if c := rec.ForTenant("c"); len(c.Report.Runs) != 0 || c.Report.Considered != 0 || c.Report.Runs == nil {
		t.Fatalf("tenant c sees %+v", c.Report)
	}
}
