package testkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// RunRunStoreConformance proves the reference run store (docs/design.md §2.2; the reference runs block
// R1–R5 and the core unit cases U7–U13) plus ordering ties, status validation and tenancy.
// Index-backed listings are polled with a deadline: a backend's indexes may lag.
func RunRunStoreConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, rsCases())
}

// RunDurableRunFieldsConformance proves the four durable run fields (reference
// durable-run-fields-conformance D1, split so each rule fails on its own): nil when fresh,
// explicit false kept, each set and cleared independently, all cleared at once.
func RunDurableRunFieldsConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, rsDurableCases())
}

const rsTenant = "tenant-a"

// rsCreate creates a run in tenant, failing on an error.
func rsCreate(t *testing.T, runs contract.RunStore, tenant, id, thread string, startedAt int64) contract.RunRecord {
	t.Helper()
	rec, err := runs.CreateOrResume(ctxFor(t, tenant), contract.NewRun{RunID: id, ThreadID: thread, StartedAt: startedAt})
	rsSkipUnsupported(t, err)
	cfNoErr(t, err, "CreateOrResume "+id)
	return rec
}

// rsSkipUnsupported skips the case, naming the capability, when a reference write found
// the backend without contract.RunWriter (refstore answers errors.ErrUnsupported).
func rsSkipUnsupported(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("backend lacks capability sandbox.RunWriter (the reference's unfenced run writes): %v", err)
	}
}

// rsUpdate applies p to run id in tenant, failing on an error.
func rsUpdate(t *testing.T, runs contract.RunStore, tenant, id string, p contract.RunPatch) {
	t.Helper()
	err := runs.Update(ctxFor(t, tenant), id, p)
	rsSkipUnsupported(t, err)
	cfNoErr(t, err, "Update "+id)
}

// rsGet reads run id in tenant, failing on an error.
func rsGet(t *testing.T, runs contract.RunStore, tenant, id string) *contract.RunRecord {
	t.Helper()
	got, err := runs.Get(ctxFor(t, tenant), id)
	cfNoErr(t, err, "Get "+id)
	return got
}

// rsNorm returns r with its usage re-encoded canonically, so records compare by content.
func rsNorm(r contract.RunRecord) contract.RunRecord {
	if len(r.Usage) == 0 {
		r.Usage = nil
		return r
	}
	var v any
	if json.Unmarshal(r.Usage, &v) == nil {
		if enc, err := json.Marshal(v); err == nil {
			r.Usage = enc
		}
	}
	return r
}

// rsEqual reports whether two run records are deep-equal (usage compared as decoded JSON).
func rsEqual(a, b contract.RunRecord) bool {
	return reflect.DeepEqual(rsNorm(a), rsNorm(b))
}

// rsWant fails unless run id reads exactly want (nil = absent).
func rsWant(t *testing.T, runs contract.RunStore, tenant, id string, want *contract.RunRecord, what string) {
	t.Helper()
	cfWantRead(t, "Get", id, rsGet(t, runs, tenant, id), want, rsEqual, what)
}

// rsIDs returns the run ids of recs in order.
func rsIDs(recs []contract.RunRecord) []string {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.RunID
	}
	return ids
}

// rsActiveEventually polls FindActiveRun until it returns want (nil = none).
func rsActiveEventually(t *testing.T, b contract.Backend, tenant, thread string, want *contract.RunRecord, what string) {
	t.Helper()
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := refstore.Runs(b.Runs()).FindActiveRun(ctxFor(t, tenant), thread)
		if err != nil {
			return false, "", fmt.Errorf("FindActiveRun %q: %w", thread, err)
		}
		if want == nil {
			return got == nil, cfJSON(got), nil
		}
		return got != nil && rsEqual(*got, *want), cfJSON(got), nil
	})
}

// rsByThreadEventually polls ListByThread until it returns exactly the ids want, in order.
func rsByThreadEventually(t *testing.T, b contract.Backend, tenant, thread string, want []string, what string) []contract.RunRecord {
	t.Helper()
	var last []contract.RunRecord
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := refstore.Runs(b.Runs()).ListByThread(ctxFor(t, tenant), thread)
		if err != nil {
			return false, "", fmt.Errorf("ListByThread %q: %w", thread, err)
		}
		last = got
		return cfSameStrings(rsIDs(got), want), cfStrings(rsIDs(got)), nil
	})
	return last
}

// rsReclaimableEventually polls ListReclaimable until it returns exactly the ids want, in order.
func rsReclaimableEventually(t *testing.T, b contract.Backend, tenant string, now, ttl int64, want []string, what string) []contract.RunRecord {
	t.Helper()
	var last []contract.RunRecord
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := refstore.Runs(b.Runs()).ListReclaimable(ctxFor(t, tenant), now, ttl)
		if err != nil {
			return false, "", fmt.Errorf("ListReclaimable(%d, %d): %w", now, ttl, err)
		}
		last = got
		return cfSameStrings(rsIDs(got), want), cfStrings(rsIDs(got)), nil
	})
	return last
}

// rsUsage is the reference usage document plus nesting, arrays, null, bool and a float.
const rsUsage = `{"promptTokens":3,"completionTokens":4,"totalTokens":7,` +
	`"billed":{"quantity":1.5,"unit":"credits"},"providerUsageDetails":{"cached":[1,2,{"x":null}],"beta":true,"note":"ünïcødé \"q\""}}`

func rsCases() []cfCase {
	return []cfCase{
		{"Get of an unknown run returns nil without error", func(t *testing.T, b contract.Backend) {
			got, err := refstore.Runs(b.Runs()).Get(ctxFor(t, rsTenant), "run-missing")
			if err != nil || got != nil {
				t.Fatalf("Get run-missing = (%s, %v), want (nil, nil)", cfJSON(got), err)
			}
		}},
		{"CreateOrResume inserts a running run when absent", func(t *testing.T, b contract.Backend) {
			got := rsCreate(t, refstore.Runs(b.Runs()), rsTenant, "run-1", "thread-1", 1000)
			want := contract.RunRecord{RunID: "run-1", ThreadID: "thread-1", Status: contract.StatusRunning, StartedAt: 1000}
			if !rsEqual(got, want) {
				t.Fatalf("CreateOrResume = %s, want %s", cfJSON(got), cfJSON(want))
			}
			rsWant(t, refstore.Runs(b.Runs()), rsTenant, "run-1", &want, "after create")
		}},
		{"CreateOrResume keeps an explicit initial status", func(t *testing.T, b contract.Backend) {
			got, err := refstore.Runs(b.Runs()).CreateOrResume(ctxFor(t, rsTenant), contract.NewRun{RunID: "r", ThreadID: "t", StartedAt: 5, Status: contract.StatusInterrupted})
			cfNoErr(t, err, "CreateOrResume interrupted")
			want := contract.RunRecord{RunID: "r", ThreadID: "t", Status: contract.StatusInterrupted, StartedAt: 5}
			if !rsEqual(got, want) {
				t.Fatalf("CreateOrResume = %s, want %s", cfJSON(got), cfJSON(want))
			}
			rsWant(t, refstore.Runs(b.Runs()), rsTenant, "r", &want, "after create")
		}},
		{"CreateOrResume returns the stored record unchanged", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			ctx := ctxFor(t, rsTenant)
			rsCreate(t, runs, rsTenant, "run-1", "thread-1", 1000)
			again, err := runs.CreateOrResume(ctx, contract.NewRun{RunID: "run-1", ThreadID: "thread-different", StartedAt: 9999})
			cfNoErr(t, err, "second CreateOrResume")
			want := contract.RunRecord{RunID: "run-1", ThreadID: "thread-1", Status: contract.StatusRunning, StartedAt: 1000}
			if !rsEqual(again, want) {
				t.Fatalf("resumed = %s, want the original %s", cfJSON(again), cfJSON(want))
			}
			rsUpdate(t, runs, rsTenant, "run-1", contract.RunPatch{
				FinishedAt: contract.Set[int64](2000), Usage: contract.Set(json.RawMessage(rsUsage)),
				SandboxKey: contract.Set("sk_1"), DetachedSince: contract.Set[int64](1500),
				CancelRequested: contract.Set(false), DriverEpoch: contract.Set[int64](4),
			})
			stored := rsGet(t, runs, rsTenant, "run-1")
			if stored == nil {
				t.Fatal("run-1 vanished")
			}
			again, err = runs.CreateOrResume(ctx, contract.NewRun{RunID: "run-1", ThreadID: "thread-x", StartedAt: 1, Status: contract.StatusInterrupted})
			cfNoErr(t, err, "third CreateOrResume")
			if !rsEqual(again, *stored) {
				t.Fatalf("resumed =\n  %s\nwant the stored record\n  %s", cfJSON(again), cfJSON(stored))
			}
			rsWant(t, runs, rsTenant, "run-1", stored, "stored record after resuming")
		}},
		{"CreateOrResume never revives a finished run", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			for _, st := range []contract.RunStatus{contract.StatusCompleted, contract.StatusFailed, contract.StatusAborted, contract.StatusInterrupted} {
				id := "nc-" + string(st)
				rsCreate(t, runs, rsTenant, id, "nc-t", 10)
				p := contract.RunPatch{Status: contract.Set(st)}
				if st.Terminal() {
					p.FinishedAt = contract.Set[int64](20)
				}
				rsUpdate(t, runs, rsTenant, id, p)
				want := rsGet(t, runs, rsTenant, id)
				got, err := runs.CreateOrResume(ctxFor(t, rsTenant), contract.NewRun{RunID: id, ThreadID: "nc-t", StartedAt: 999, Status: contract.StatusRunning})
				cfNoErr(t, err, "CreateOrResume of a "+string(st)+" run")
				if got.Status != st || got.StartedAt != 10 || !rsEqual(got, *want) {
					t.Fatalf("CreateOrResume of a %s run = %s, want it unchanged: %s", st, cfJSON(got), cfJSON(want))
				}
				rsWant(t, runs, rsTenant, id, want, "stored "+string(st)+" run after CreateOrResume")
			}
			rsActiveEventually(t, b, rsTenant, "nc-t", nil, "no run of nc-t was revived")
		}},
		{"Update of an unknown run is a silent no-op that creates nothing", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			cfNoErr(t, runs.Update(ctxFor(t, rsTenant), "run-absent", contract.RunPatch{Status: contract.Set(contract.StatusCompleted)}), "Update run-absent")
			cfNoErr(t, runs.Update(ctxFor(t, rsTenant), "run-absent", contract.RunPatch{
				Status: contract.Set(contract.StatusRunning), SandboxKey: contract.Set("sk"), DetachedSince: contract.Set[int64](1),
				CancelRequested: contract.Set(true), DriverEpoch: contract.Set[int64](1),
			}), "Update run-absent with durable fields")
			rsWant(t, runs, rsTenant, "run-absent", nil, "after the updates")
			// An upserting Update would also surface through the indexes.
			rsCreate(t, runs, rsTenant, "sentinel", "t", 1)
			rsReclaimableEventually(t, b, rsTenant, 10, 0, nil, "ListReclaimable holds no phantom run")
		}},
		{"an empty patch changes nothing", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "r", "t", 1)
			rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{
				FinishedAt: contract.Set[int64](2), Error: contract.Set(contract.RunError{Message: "m", Code: "c"}),
				Usage: contract.Set(json.RawMessage(rsUsage)), SandboxKey: contract.Set("sk"),
				DetachedSince: contract.Set[int64](3), CancelRequested: contract.Set(true), DriverEpoch: contract.Set[int64](2),
			})
			before := rsGet(t, runs, rsTenant, "r")
			rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{})
			rsWant(t, runs, rsTenant, "r", before, "after an empty patch")
			cfNoErr(t, runs.Update(ctxFor(t, rsTenant), "absent", contract.RunPatch{}), "empty patch of an unknown run")
			rsWant(t, runs, rsTenant, "absent", nil, "unknown run after an empty patch")
		}},
		{"Set overwrites, Clear removes, untouched fields stay", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "r", "t", 1)
			rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{
				Status: contract.Set(contract.StatusFailed), FinishedAt: contract.Set[int64](20),
				Error: contract.Set(contract.RunError{Message: "boom", Code: "provider_overloaded"}),
				Usage: contract.Set(json.RawMessage(`{"totalTokens":7}`)),
			})
			want := contract.RunRecord{RunID: "r", ThreadID: "t", Status: contract.StatusFailed, StartedAt: 1, FinishedAt: cfPtr[int64](20),
				Error: &contract.RunError{Message: "boom", Code: "provider_overloaded"}, Usage: json.RawMessage(`{"totalTokens":7}`)}
			rsWant(t, runs, rsTenant, "r", &want, "after the first patch")
			rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{FinishedAt: contract.Set[int64](30), Error: contract.Clear[contract.RunError]()})
			want.FinishedAt, want.Error = cfPtr[int64](30), nil
			rsWant(t, runs, rsTenant, "r", &want, "after Set finishedAt, Clear error")
			rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{Usage: contract.Clear[json.RawMessage](), FinishedAt: contract.Clear[int64]()})
			want.Usage, want.FinishedAt = nil, nil
			rsWant(t, runs, rsTenant, "r", &want, "after Clear usage and finishedAt")
		}},
		{"Error is replaced whole", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "r1", "t", 1)
			rsUpdate(t, runs, rsTenant, "r1", contract.RunPatch{Status: contract.Set(contract.StatusFailed), FinishedAt: contract.Set[int64](2),
				Error: contract.Set(contract.RunError{Message: "the model refused the request", Code: "content_filter"})})
			got := rsGet(t, runs, rsTenant, "r1")
			if got == nil || got.Error == nil || *got.Error != (contract.RunError{Message: "the model refused the request", Code: "content_filter"}) {
				t.Fatalf("error after the first write = %s", cfJSON(got))
			}
			rsUpdate(t, runs, rsTenant, "r1", contract.RunPatch{Error: contract.Set(contract.RunError{Message: "boom"})})
			got = rsGet(t, runs, rsTenant, "r1")
			if got == nil || got.Error == nil || *got.Error != (contract.RunError{Message: "boom"}) {
				t.Fatalf("error after the replacement = %s, want exactly {message: boom} (the code gone)", cfJSON(got))
			}
		}},
		{"Usage round-trips deep-equal and is replaced whole", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "r", "t", 1)
			for _, doc := range []string{`{"promptTokens":3,"completionTokens":4,"totalTokens":7}`, rsUsage, `[1,"two",{"3":[]}]`, `{}`, `42`} {
				rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{Usage: contract.Set(json.RawMessage(doc))})
				got := rsGet(t, runs, rsTenant, "r")
				if got == nil || !cfJSONEqual(got.Usage, json.RawMessage(doc)) {
					t.Fatalf("usage after writing %s = %s", doc, cfJSON(got))
				}
				// The resumed record carries the same document.
				res, err := runs.CreateOrResume(ctxFor(t, rsTenant), contract.NewRun{RunID: "r", ThreadID: "t", StartedAt: 1})
				cfNoErr(t, err, "CreateOrResume")
				if !cfJSONEqual(res.Usage, json.RawMessage(doc)) {
					t.Fatalf("resumed usage = %s, want %s", res.Usage, doc)
				}
			}
			rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{Usage: contract.Set(json.RawMessage(rsUsage))})
			rsUpdate(t, runs, rsTenant, "r", contract.RunPatch{Usage: contract.Set(json.RawMessage(`{"totalTokens":1}`))})
			if got := rsGet(t, runs, rsTenant, "r"); got == nil || !cfJSONEqual(got.Usage, json.RawMessage(`{"totalTokens":1}`)) {
				t.Fatalf("usage after a replacing write = %s, want exactly {\"totalTokens\":1} (no merge)", cfJSON(got))
			}
		}},
		{"Update rejects an invalid patch and changes nothing", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "r", "t", 1)
			before := rsGet(t, runs, rsTenant, "r")
			for name, p := range map[string]contract.RunPatch{
				"Clear status":       {Status: contract.Clear[contract.RunStatus]()},
				"status RUNNING":     {Status: contract.Set(contract.RunStatus("RUNNING"))},
				"status empty":       {Status: contract.Set(contract.RunStatus(""))},
				"status toString":    {Status: contract.Set(contract.RunStatus("toString")), DetachedSince: contract.Set[int64](1)},
				"usage not JSON":     {Usage: contract.Set(json.RawMessage(`{"a":`))},
				"bad status + epoch": {Status: contract.Set(contract.RunStatus("done")), DriverEpoch: contract.Set[int64](9)},
			} {
				cfIs(t, runs.Update(ctxFor(t, rsTenant), "r", p), contract.ErrInvalid, "Update with "+name)
				rsWant(t, runs, rsTenant, "r", before, "after the refused "+name)
			}
		}},
		{"CreateOrResume rejects an unknown status and malformed ids", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			ctx := ctxFor(t, rsTenant)
			for name, in := range map[string]contract.NewRun{
				"status bogus":    {RunID: "r", ThreadID: "t", StartedAt: 1, Status: "bogus"},
				"status RUNNING":  {RunID: "r", ThreadID: "t", StartedAt: 1, Status: "RUNNING"},
				"empty run id":    {RunID: "", ThreadID: "t", StartedAt: 1},
				"empty thread id": {RunID: "r", ThreadID: "", StartedAt: 1},
				"NUL in run id":   {RunID: "r\x00x", ThreadID: "t", StartedAt: 1},
			} {
				_, err := runs.CreateOrResume(ctx, in)
				cfIs(t, err, contract.ErrInvalid, "CreateOrResume with "+name)
			}
			rsWant(t, runs, rsTenant, "r", nil, "nothing was created")
		}},
		{"every status round-trips and reads back valid", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			for _, st := range []contract.RunStatus{contract.StatusRunning, contract.StatusInterrupted, contract.StatusCompleted, contract.StatusFailed, contract.StatusAborted} {
				id := "r-" + string(st)
				rsCreate(t, runs, rsTenant, id, "t", 1)
				rsUpdate(t, runs, rsTenant, id, contract.RunPatch{Status: contract.Set(st)})
				got := rsGet(t, runs, rsTenant, id)
				if got == nil || got.Status != st {
					t.Fatalf("status after writing %s = %s", st, cfJSON(got))
				}
				if _, err := contract.ParseRunStatus(string(got.Status)); err != nil {
					t.Fatalf("read status %q does not parse: %v", got.Status, err)
				}
			}
			recs := rsByThreadEventually(t, b, rsTenant, "t", []string{"r-aborted", "r-completed", "r-failed", "r-interrupted", "r-running"}, "ListByThread lists every status")
			for _, r := range recs {
				if _, err := contract.ParseRunStatus(string(r.Status)); err != nil || "r-"+string(r.Status) != r.RunID {
					t.Fatalf("listed %s with status %q", r.RunID, r.Status)
				}
			}
		}},
		{"FindActiveRun returns the latest running run of the thread", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsActiveEventually(t, b, rsTenant, "thread-active", nil, "no run yet")
			a1 := rsCreate(t, runs, rsTenant, "active-1", "thread-active", 1000)
			a2 := rsCreate(t, runs, rsTenant, "active-2", "thread-active", 2000)
			rsActiveEventually(t, b, rsTenant, "thread-active", &a2, "active-2 is the latest")
			other := rsCreate(t, runs, rsTenant, "other-1", "thread-other", 3000)
			rsActiveEventually(t, b, rsTenant, "thread-active", &a2, "another thread's later run does not count")
			rsActiveEventually(t, b, rsTenant, "thread-other", &other, "the other thread's run")
			// An interrupted run is paused, not active.
			rsCreate(t, runs, rsTenant, "paused", "thread-active", 5000)
			rsUpdate(t, runs, rsTenant, "paused", contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)})
			rsUpdate(t, runs, rsTenant, "active-2", contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set[int64](2500)})
			rsActiveEventually(t, b, rsTenant, "thread-active", &a1, "active-1 after active-2 completed")
			rsUpdate(t, runs, rsTenant, "active-1", contract.RunPatch{Status: contract.Set(contract.StatusAborted), FinishedAt: contract.Set[int64](1500)})
			rsActiveEventually(t, b, rsTenant, "thread-active", nil, "none after every running run ended")
			rsActiveEventually(t, b, rsTenant, "thread-unknown", nil, "an unknown thread")
		}},
		{"FindActiveRun breaks startedAt ties by the greatest runId", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "zzz-earlier", "t", 400)
			rsCreate(t, runs, rsTenant, "tie-a", "t", 500)
			c := rsCreate(t, runs, rsTenant, "tie-c", "t", 500)
			bb := rsCreate(t, runs, rsTenant, "tie-b", "t", 500)
			rsActiveEventually(t, b, rsTenant, "t", &c, "tie-c has the greatest id of the latest start")
			rsUpdate(t, runs, rsTenant, "tie-c", contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
			rsActiveEventually(t, b, rsTenant, "t", &bb, "tie-b once tie-c completed")
		}},
		{"ListByThread returns every run ascending by startedAt, ties by runId", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "lt-b", "lt", 2)
			rsCreate(t, runs, rsTenant, "lt-a", "lt", 1)
			rsCreate(t, runs, rsTenant, "lt-d", "lt", 2)
			rsCreate(t, runs, rsTenant, "lt-c", "lt", 2)
			rsCreate(t, runs, rsTenant, "lt-0", "lt", 3)
			rsCreate(t, runs, rsTenant, "other", "lt-other", 0)
			rsUpdate(t, runs, rsTenant, "lt-c", contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set[int64](9)})
			rsUpdate(t, runs, rsTenant, "lt-0", contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)})
			recs := rsByThreadEventually(t, b, rsTenant, "lt", []string{"lt-a", "lt-b", "lt-c", "lt-d", "lt-0"}, "ListByThread lt")
			for _, r := range recs {
				if stored := rsGet(t, runs, rsTenant, r.RunID); stored == nil || !rsEqual(r, *stored) {
					t.Fatalf("listed %s = %s, stored %s", r.RunID, cfJSON(r), cfJSON(stored))
				}
			}
			rsByThreadEventually(t, b, rsTenant, "lt-unknown", nil, "an unknown thread lists nothing")
		}},
		{"ListReclaimable lists detached running runs at or before the cutoff, oldest first", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			const now, ttl = 10_000, 5_000
			detach := func(id string, since int64, extra contract.RunPatch) {
				rsCreate(t, runs, rsTenant, id, "rc-t", 1)
				extra.DetachedSince = contract.Set(since)
				rsUpdate(t, runs, rsTenant, id, extra)
			}
			detach("rc-boundary", 5000, contract.RunPatch{})
			detach("rc-too-recent", 5001, contract.RunPatch{})
			detach("rc-included", 1000, contract.RunPatch{})
			detach("rc-completed", 1000, contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set[int64](2000)})
			detach("rc-interrupted", 1000, contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)})
			detach("rc-oldest", 500, contract.RunPatch{})
			rsCreate(t, runs, rsTenant, "rc-never-detached", "rc-t", 1)
			got := rsReclaimableEventually(t, b, rsTenant, now, ttl, []string{"rc-oldest", "rc-included", "rc-boundary"}, "ListReclaimable(10000, 5000)")
			for _, r := range got {
				if stored := rsGet(t, runs, rsTenant, r.RunID); stored == nil || !rsEqual(r, *stored) {
					t.Fatalf("listed %s = %s, stored %s", r.RunID, cfJSON(r), cfJSON(stored))
				}
			}
		}},
		{"ListReclaimable with ttl 0 includes a run detached exactly now", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			const now = 10_000
			rsCreate(t, runs, rsTenant, "rc-now", "rc-t", 1)
			rsUpdate(t, runs, rsTenant, "rc-now", contract.RunPatch{DetachedSince: contract.Set[int64](now)})
			got := rsReclaimableEventually(t, b, rsTenant, now, 0, []string{"rc-now"}, "ListReclaimable(now, 0)")
			if ds := got[0].DetachedSince; ds == nil || *ds != now {
				t.Fatalf("listed detachedSince = %v, want %d", cfJSON(ds), now)
			}
			rsReclaimableEventually(t, b, rsTenant, now-1, 0, nil, "a moment earlier nothing is reclaimable")
		}},
		{"ListReclaimable drops a run whose detachedSince was cleared", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "rc-reattached", "rc-t", 1)
			rsCreate(t, runs, rsTenant, "rc-still", "rc-t", 1)
			rsUpdate(t, runs, rsTenant, "rc-reattached", contract.RunPatch{DetachedSince: contract.Set[int64](1000)})
			rsUpdate(t, runs, rsTenant, "rc-still", contract.RunPatch{DetachedSince: contract.Set[int64](1000)})
			rsReclaimableEventually(t, b, rsTenant, 10_000, 5_000, []string{"rc-reattached", "rc-still"}, "both detached")
			rsUpdate(t, runs, rsTenant, "rc-reattached", contract.RunPatch{DetachedSince: contract.Clear[int64]()})
			if got := rsGet(t, runs, rsTenant, "rc-reattached"); got == nil || got.DetachedSince != nil {
				t.Fatalf("after Clear detachedSince: %s", cfJSON(got))
			}
			rsReclaimableEventually(t, b, rsTenant, 10_000, 5_000, []string{"rc-still"}, "the re-attached run left")
		}},
		{"ListReclaimable never lists terminal runs written concurrently", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			statuses := []contract.RunStatus{contract.StatusCompleted, contract.StatusFailed, contract.StatusAborted}
			errs := make([]error, len(statuses))
			var wg sync.WaitGroup
			for i, st := range statuses {
				wg.Go(func() {
					ctx := ctxFor(t, rsTenant)
					id := "rc-" + string(st)
					if _, err := runs.CreateOrResume(ctx, contract.NewRun{RunID: id, ThreadID: "rc-t", StartedAt: 1}); err != nil {
						errs[i] = err
						return
					}
					errs[i] = runs.Update(ctx, id, contract.RunPatch{Status: contract.Set(st), DetachedSince: contract.Set[int64](1000), FinishedAt: contract.Set[int64](2000)})
				})
			}
			wg.Wait()
			for i, err := range errs {
				cfNoErr(t, err, "writing the "+string(statuses[i])+" run")
			}
			rsCreate(t, runs, rsTenant, "rc-live", "rc-t", 1)
			rsUpdate(t, runs, rsTenant, "rc-live", contract.RunPatch{DetachedSince: contract.Set[int64](1000)})
			rsReclaimableEventually(t, b, rsTenant, 10_000, 0, []string{"rc-live"}, "only the running run")
			for _, st := range statuses {
				if got := rsGet(t, runs, rsTenant, "rc-"+string(st)); got == nil || got.Status != st {
					t.Fatalf("rc-%s = %s", st, cfJSON(got))
				}
			}
		}},
		{"the same run id under two tenants is two runs", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			inA := rsCreate(t, runs, "tenant-a", "r", "t", 100)
			inB := rsCreate(t, runs, "tenant-b", "r", "t", 200)
			if inB.StartedAt != 200 {
				t.Fatalf("B's create resumed A's run: %s", cfJSON(inB))
			}
			rsWant(t, runs, "tenant-a", "r", &inA, "A")
			rsWant(t, runs, "tenant-b", "r", &inB, "B")
			rsWant(t, runs, "tenant-c", "r", nil, "C")
			rsWant(t, runs, "", "r", nil, "the empty tenant")
			rsActiveEventually(t, b, "tenant-a", "t", &inA, "A's active run")
			rsActiveEventually(t, b, "tenant-b", "t", &inB, "B's active run")
			rsActiveEventually(t, b, "tenant-c", "t", nil, "C has no active run")
			rsByThreadEventually(t, b, "tenant-a", "t", []string{"r"}, "A lists one run")
			// B detaches and finishes; A's run must not change or appear reclaimable.
			rsUpdate(t, runs, "tenant-b", "r", contract.RunPatch{DetachedSince: contract.Set[int64](300), CancelRequested: contract.Set(true)})
			rsReclaimableEventually(t, b, "tenant-b", 1000, 0, []string{"r"}, "B's run is reclaimable in B")
			rsReclaimableEventually(t, b, "tenant-a", 1000, 0, nil, "B's detach is invisible to A")
			rsWant(t, runs, "tenant-a", "r", &inA, "A after B's update")
			rsUpdate(t, runs, "tenant-b", "r", contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
			rsActiveEventually(t, b, "tenant-a", "t", &inA, "A's run still active after B's completed")
			rsActiveEventually(t, b, "tenant-b", "t", nil, "B has no active run")
			recs := rsByThreadEventually(t, b, "tenant-b", "t", []string{"r"}, "B lists its one run")
			if recs[0].StartedAt != 200 || recs[0].Status != contract.StatusCompleted {
				t.Fatalf("B lists %s", cfJSON(recs[0]))
			}
			cfNoErr(t, runs.Update(ctxFor(t, "tenant-c"), "r", contract.RunPatch{Status: contract.Set(contract.StatusFailed)}), "Update in C")
			rsWant(t, runs, "tenant-c", "r", nil, "C's update created nothing")
			rsWant(t, runs, "tenant-a", "r", &inA, "A after C's update")
		}},
		{"an invalid tenant is ErrInvalid on every method", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			for _, bad := range cfBadTenants() {
				ctx := ctxFor(t, bad)
				_, err := runs.CreateOrResume(ctx, contract.NewRun{RunID: "r", ThreadID: "t", StartedAt: 1})
				cfIs(t, err, contract.ErrInvalid, "CreateOrResume under "+bad)
				cfIs(t, runs.Update(ctx, "r", contract.RunPatch{Status: contract.Set(contract.StatusFailed)}), contract.ErrInvalid, "Update under "+bad)
				_, err = runs.Get(ctx, "r")
				cfIs(t, err, contract.ErrInvalid, "Get under "+bad)
				_, err = runs.FindActiveRun(ctx, "t")
				cfIs(t, err, contract.ErrInvalid, "FindActiveRun under "+bad)
				_, err = runs.ListByThread(ctx, "t")
				cfIs(t, err, contract.ErrInvalid, "ListByThread under "+bad)
				_, err = runs.ListReclaimable(ctx, 10, 0)
				cfIs(t, err, contract.ErrInvalid, "ListReclaimable under "+bad)
			}
		}},
	}
}

// rsDurable holds the four durable fields of a record for comparison.
type rsDurable struct {
	SandboxKey      *string
	DetachedSince   *int64
	CancelRequested *bool
	DriverEpoch     *int64
}

func rsDurableOf(r *contract.RunRecord) rsDurable {
	return rsDurable{r.SandboxKey, r.DetachedSince, r.CancelRequested, r.DriverEpoch}
}

// rsDurableWant fails unless run id's durable fields are exactly want and its status and
// startedAt are intact.
func rsDurableWant(t *testing.T, runs contract.RunStore, id string, want rsDurable, what string) {
	t.Helper()
	got := rsGet(t, runs, rsTenant, id)
	if got == nil {
		t.Fatalf("%s: run %s vanished", what, id)
	}
	if !reflect.DeepEqual(rsDurableOf(got), want) {
		t.Fatalf("%s: durable fields = %s, want %s", what, cfJSON(rsDurableOf(got)), cfJSON(want))
	}
	if got.Status != contract.StatusRunning || got.StartedAt != 1 || got.ThreadID != "fc-t" {
		t.Fatalf("%s: the run's identity changed: %s", what, cfJSON(got))
	}
}

// rsDurableField is one durable field: how to set it, clear it and where it sits.
type rsDurableField struct {
	name  string
	set   func(p *contract.RunPatch, d *rsDurable)
	clear func(p *contract.RunPatch, d *rsDurable)
}

func rsDurableFields() []rsDurableField {
	return []rsDurableField{
		{"sandboxKey",
			func(p *contract.RunPatch, d *rsDurable) {
				p.SandboxKey, d.SandboxKey = contract.Set("sandbox-new"), cfPtr("sandbox-new")
			},
			func(p *contract.RunPatch, d *rsDurable) { p.SandboxKey, d.SandboxKey = contract.Clear[string](), nil }},
		{"detachedSince",
			func(p *contract.RunPatch, d *rsDurable) {
				p.DetachedSince, d.DetachedSince = contract.Set[int64](777), cfPtr[int64](777)
			},
			func(p *contract.RunPatch, d *rsDurable) {
				p.DetachedSince, d.DetachedSince = contract.Clear[int64](), nil
			}},
		{"cancelRequested",
			func(p *contract.RunPatch, d *rsDurable) {
				p.CancelRequested, d.CancelRequested = contract.Set(false), cfPtr(false)
			},
			func(p *contract.RunPatch, d *rsDurable) {
				p.CancelRequested, d.CancelRequested = contract.Clear[bool](), nil
			}},
		{"driverEpoch",
			func(p *contract.RunPatch, d *rsDurable) {
				p.DriverEpoch, d.DriverEpoch = contract.Set[int64](9), cfPtr[int64](9)
			},
			func(p *contract.RunPatch, d *rsDurable) { p.DriverEpoch, d.DriverEpoch = contract.Clear[int64](), nil }},
	}
}

// rsAllFour is the reference's first population of the four fields.
func rsAllFour() (contract.RunPatch, rsDurable) {
	return contract.RunPatch{SandboxKey: contract.Set("sandbox-abc"), DetachedSince: contract.Set[int64](500),
			CancelRequested: contract.Set(true), DriverEpoch: contract.Set[int64](1)},
		rsDurable{cfPtr("sandbox-abc"), cfPtr[int64](500), cfPtr(true), cfPtr[int64](1)}
}

func rsDurableCases() []cfCase {
	cases := []cfCase{
		{"a fresh run reads the four durable fields as nil", func(t *testing.T, b contract.Backend) {
			rec := rsCreate(t, refstore.Runs(b.Runs()), rsTenant, "fc-1", "fc-t", 1)
			if d := rsDurableOf(&rec); d != (rsDurable{}) {
				t.Fatalf("CreateOrResume returned durable fields %s, want all nil", cfJSON(d))
			}
			rsDurableWant(t, refstore.Runs(b.Runs()), "fc-1", rsDurable{}, "fresh run")
			enc, err := json.Marshal(rsGet(t, refstore.Runs(b.Runs()), rsTenant, "fc-1"))
			cfNoErr(t, err, "marshal")
			for _, k := range []string{"sandboxKey", "detachedSince", "cancelRequested", "driverEpoch"} {
				if bytes.Contains(enc, []byte(`"`+k+`"`)) {
					t.Fatalf("fresh run JSON has %s: %s", k, enc)
				}
			}
		}},
		{"the four fields round-trip and driverEpoch is overwritten", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "fc-1", "fc-t", 1)
			p, want := rsAllFour()
			rsUpdate(t, runs, rsTenant, "fc-1", p)
			rsDurableWant(t, runs, "fc-1", want, "after setting all four")
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{DriverEpoch: contract.Set[int64](2)})
			want.DriverEpoch = cfPtr[int64](2)
			rsDurableWant(t, runs, "fc-1", want, "after the epoch bump to 2")
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{DetachedSince: contract.Clear[int64]()})
			want.DetachedSince = nil
			rsDurableWant(t, runs, "fc-1", want, "after clearing detachedSince")
		}},
		{"an explicit false cancelRequested reads back false", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "fc-1", "fc-t", 1)
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{CancelRequested: contract.Set(false)})
			rsDurableWant(t, runs, "fc-1", rsDurable{CancelRequested: cfPtr(false)}, "false on a fresh run")
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{CancelRequested: contract.Set(true)})
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{CancelRequested: contract.Set(false)})
			rsDurableWant(t, runs, "fc-1", rsDurable{CancelRequested: cfPtr(false)}, "false after true")
			if got := rsGet(t, runs, rsTenant, "fc-1"); got.Cancelled() {
				t.Fatal("Cancelled() is true for an explicit false")
			}
		}},
		{"one patch clearing all four clears all four and keeps the run", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "fc-1", "fc-t", 1)
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{SandboxKey: contract.Set("sandbox-xyz"), DetachedSince: contract.Set[int64](900),
				CancelRequested: contract.Set(true), DriverEpoch: contract.Set[int64](3)})
			rsDurableWant(t, runs, "fc-1", rsDurable{cfPtr("sandbox-xyz"), cfPtr[int64](900), cfPtr(true), cfPtr[int64](3)}, "re-populated")
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{SandboxKey: contract.Clear[string](), DetachedSince: contract.Clear[int64](),
				CancelRequested: contract.Clear[bool](), DriverEpoch: contract.Clear[int64]()})
			rsDurableWant(t, runs, "fc-1", rsDurable{}, "after clearing all four")
		}},
		{"unrelated updates leave the durable fields alone", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "fc-1", "fc-t", 1)
			p, want := rsAllFour()
			rsUpdate(t, runs, rsTenant, "fc-1", p)
			rsUpdate(t, runs, rsTenant, "fc-1", contract.RunPatch{Usage: contract.Set(json.RawMessage(`{"totalTokens":1}`)),
				Error: contract.Set(contract.RunError{Message: "m"})})
			rsDurableWant(t, runs, "fc-1", want, "after a usage/error update")
		}},
	}
	for _, f := range rsDurableFields() {
		cases = append(cases, cfCase{"setting and clearing " + f.name + " leaves the other three", func(t *testing.T, b contract.Backend) {
			runs := refstore.Runs(b.Runs())
			rsCreate(t, runs, rsTenant, "fc-1", "fc-t", 1)
			p, want := rsAllFour()
			rsUpdate(t, runs, rsTenant, "fc-1", p)
			var set contract.RunPatch
			f.set(&set, &want)
			rsUpdate(t, runs, rsTenant, "fc-1", set)
			rsDurableWant(t, runs, "fc-1", want, "after setting "+f.name)
			var clr contract.RunPatch
			f.clear(&clr, &want)
			rsUpdate(t, runs, rsTenant, "fc-1", clr)
			// A backend that ignores Clear (drops null keys when building its write) fails here.
			rsDurableWant(t, runs, "fc-1", want, "after clearing "+f.name)
			f.set(&set, &want)
			rsUpdate(t, runs, rsTenant, "fc-1", set)
			rsDurableWant(t, runs, "fc-1", want, "after setting "+f.name+" again")
		}})
	}
	return cases
}
