package reaper_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// population is one of every kind of candidate and housekeeping item, written through
// the inner store (so a FaultBackend around it counts only what a sweep does).
type population struct {
	fin, prod, exp, can, shExp, shLive string // run ids
	finBox, expBox, canBox, sharedBox  string
	orphan, idle, pending, settled     string // sandbox ids of the housekeeping items
}

func buildPopulation(t *testing.T, w *world) population {
	var p population
	past := time.Now().Add(-2 * time.Hour).UnixMilli()
	b := w.b
	p.fin = w.id("finished")
	r1 := w.start(p.fin, p.fin)
	w.launch(r1, p.fin, `printf '{"d":1}\n{"d":2}\n'`)
	w.detach(r1, p.fin)
	w.probe(r1, p.fin, journal.Finished)
	p.finBox = r1.Sandbox.ProviderSandboxID

	p.prod = w.id("producing")
	r2 := w.start(p.prod, p.prod)
	w.launch(r2, p.prod, `printf '{"d":1}\n'; sleep 30`)
	w.detach(r2, p.prod)
	w.probe(r2, p.prod, journal.Producing)

	p.exp = w.id("expired")
	r3 := w.start(p.exp, p.exp)
	w.launch(r3, p.exp, `printf '{"d":1}\n'; sleep 30`)
	w.detach(r3, p.exp)
	must(t, refstore.Runs(b.Runs()).Update(w.ctx, p.exp, contract.RunPatch{DetachedSince: contract.Set(past)}))
	p.expBox = r3.Sandbox.ProviderSandboxID

	p.can = w.id("cancelled")
	r4 := w.start(p.can, p.can)
	w.launch(r4, p.can, `sleep 30`)
	w.detach(r4, p.can)
	if _, err := w.k.Cancel(w.ctx, p.can); err != nil {
		t.Fatal(err)
	}
	p.canBox = r4.Sandbox.ProviderSandboxID

	// Two runs of one thread: the expired one's sandbox serves the live one, whose driver
	// went silent (its lease lapses by the sweep's clock: lapsed, then probed: unknown).
	thr := w.id("shared")
	p.shExp = w.id("shared-expired")
	r5 := w.start(p.shExp, thr)
	w.launch(r5, p.shExp, `sleep 30`)
	w.detach(r5, p.shExp)
	must(t, refstore.Runs(b.Runs()).Update(w.ctx, p.shExp, contract.RunPatch{DetachedSince: contract.Set(past)}))
	p.shLive = w.id("shared-live")
	w.start(p.shLive, thr)
	p.sharedBox = r5.Sandbox.ProviderSandboxID

	create := func(name string) string {
		id, err := w.prov.Create(w.ctx, contract.CreateInput{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.prov.Destroy(w.ctx, id) })
		return id
	}
	rows := b.Instances()
	row := func(key, id string, updatedAt int64) {
		must(t, rows.CreateRow(w.ctx, contract.InstanceRecord{Key: key, Provider: w.prov.Name(),
			ProviderSandboxID: id, ThreadID: "old", UpdatedAt: updatedAt}, "inc-"+key))
	}
	// A stale intent whose orphan no row names; one whose sandbox the row names.
	p.orphan = create("sk_orphan")
	must(t, b.Intents().Put(w.ctx, "sk_orphan", 7, past))
	must(t, b.Intents().Record(w.ctx, "sk_orphan", 7, p.orphan))
	p.settled = create("sk_settled")
	row("sk_settled", p.settled, time.Now().UnixMilli())
	must(t, b.Intents().Put(w.ctx, "sk_settled", 3, past))
	must(t, b.Intents().Record(w.ctx, "sk_settled", 3, p.settled))
	// An idle row past retention that no run uses; a tombstoned row (a failed destroy).
	ancient := past - int64(48*time.Hour/time.Millisecond)
	p.idle = create("sk_idle")
	row("sk_idle", p.idle, ancient)
	p.pending = create("sk_pending")
	row("sk_pending", p.pending, ancient)
	must(t, rows.MarkReclaiming(w.ctx, "sk_pending", p.pending, ancient, ancient, "tomb-1"))
	return p
}

// alive reports whether the provider still has id.
func (w *world) alive(id string) bool {
	s, err := w.prov.(contract.StatusReader).Status(w.ctx, id)
	if err != nil {
		w.t.Fatal(err)
	}
	return s != contract.SandboxGone
}

// outcomes maps run id → outcome of a report.
func outcomes(rep reaper.Report) map[string]reaper.Outcome {
	m := map[string]reaper.Outcome{}
	for _, e := range rep.Runs {
		m[e.RunID] = e.Outcome
	}
	return m
}

// reaperWrites are the FaultBackend methods a sweep may write through.
var reaperWrites = []string{"Locks.WithLock", "Runs.Claim", "Runs.Lapse", "Runs.UpdateFenced", "Runs.Heartbeat",
	"Runs.Detach", "Runs.RequestCancel", "Log.Append", "Log.Fence", "Log.Close", "Log.MarkCancel",
	"Instances.CreateRow", "Instances.ReplaceRow", "Instances.Touch", "Instances.MarkReclaiming",
	"Instances.DeleteReclaimed", "Intents.Put", "Intents.Record", "Intents.Drop"}

// TestDryRunPlansWithoutWritingThenTheSweepDoesIt: a dry run over the whole population
// writes nothing (not even the sweep lock), destroys nothing, and says what a sweep would
// do; the real sweep that follows — with every conditional write's first response lost —
// does exactly that, and never destroys the sandbox a live run uses.
func TestDryRunPlansWithoutWritingThenTheSweepDoesIt(t *testing.T) {
	dryRunThenSweep(t, memstore.New())
}

// TestDynamoDryRunPlansWithoutWritingThenTheSweepDoesIt is the same on DynamoDB: every
// lost response meets dynamostore's own recognition of the retried write.
func TestDynamoDryRunPlansWithoutWritingThenTheSweepDoesIt(t *testing.T) {
	w, _ := dynamoWorld(t, localprocess.New(t.TempDir()))
	dryRunThenSweep(t, w.b)
}

func dryRunThenSweep(t *testing.T, inner contract.Backend) {
	w := newWorld(t, inner, localprocess.New(t.TempDir()))
	p := buildPopulation(t, w)
	fb := storetest.NewFaultBackend(inner)
	w.b = fb

	var logs bytes.Buffer
	dry, err := w.reaper(10*time.Minute, &logs, nil).DryRun(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range reaperWrites {
		if n := fb.Calls(m); n != 0 {
			t.Errorf("dry run: %s called %d times", m, n)
		}
	}
	for _, id := range []string{p.finBox, p.expBox, p.canBox, p.sharedBox, p.orphan, p.idle, p.pending, p.settled} {
		if !w.alive(id) {
			t.Errorf("dry run destroyed %s", id)
		}
	}
	want := map[string]reaper.Outcome{p.fin: reaper.Finalized, p.prod: reaper.Producing, p.exp: reaper.Expired,
		p.can: reaper.Expired, p.shExp: reaper.Expired, p.shLive: reaper.Unknown}
	predicted := outcomes(dry)
	if !equalOutcomes(predicted, want) {
		t.Fatalf("dry-run outcomes %v (report %+v), want %v", predicted, dry.Runs, want)
	}
	// An ended run's sandbox stays for its thread: the idle stop stops it after the grace
	// (docs/design.md §5).
	for _, id := range []string{p.fin, p.exp, p.can, p.shExp} {
		if e := entry(dry, id); e.Reclaim != reaper.ActKeepIdleStop || !e.DryRun {
			t.Errorf("dry-run entry %+v; want its sandbox kept for the idle stop", e)
		}
	}
	planned := map[string]reaper.Planned{}
	for _, pl := range dry.Planned {
		planned[pl.Kind+"/"+pl.Key] = pl
	}
	for key, act := range map[string]string{
		reaper.PlanPendingReclaim + "/sk_pending": reaper.ActDestroyAndDelete,
		reaper.PlanIdleInstance + "/sk_idle":      reaper.ActDestroyAndDelete,
		reaper.PlanStaleIntent + "/sk_orphan":     reaper.ActDestroyOrphan,
		reaper.PlanStaleIntent + "/sk_settled":    reaper.ActDropIntent,
	} {
		if planned[key].Action != act {
			b, _ := json.Marshal(dry.Planned)
			t.Errorf("plan %s = %+v, want %s; plan %s", key, planned[key], act, b)
		}
	}
	if planned[reaper.PlanStaleIntent+"/sk_orphan"].ProviderSandboxID != p.orphan {
		t.Errorf("the orphan plan names %q, want %q", planned[reaper.PlanStaleIntent+"/sk_orphan"].ProviderSandboxID, p.orphan)
	}
	if !strings.Contains(logs.String(), `"planned":[`) || strings.Count(logs.String(), "\n") != 1 {
		t.Fatalf("the dry run's one report line: %s", logs.String())
	}

	// The real sweep, every conditional write's first response lost.
	fb.LoseResponses(true)
	rep, err := w.reaper(10*time.Minute, nil, nil).Sweep(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcomes(rep); !equalOutcomes(got, want) {
		t.Fatalf("sweep outcomes %v, want the dry run's %v (report %+v)", got, want, rep)
	}
	for _, id := range []string{p.fin, p.exp, p.can, p.shExp} {
		if e := entry(rep, id); e.Sandbox != reaper.SandboxKept || e.Kept != reaper.KeptIdleStop {
			t.Errorf("sweep entry %+v; want its sandbox kept for the idle stop (as the dry run said)", e)
		}
	}
	for _, m := range []string{"Runs.Claim", "Runs.Lapse", "Runs.UpdateFenced", "Log.Fence", "Log.Close",
		"Instances.MarkReclaiming", "Instances.DeleteReclaimed", "Intents.Drop"} {
		if fb.Lost(m) != 1 {
			t.Errorf("%s: %d responses lost; the lost-response path must be hit", m, fb.Lost(m))
		}
	}
	s := rep.Swept
	if s.Lapsed != 1 || s.PendingReclaims != 1 || s.IdleReclaimed != 1 || s.OrphansDestroyed != 1 ||
		s.IntentsDropped < 1 || s.PendingReclaimsFailed+s.IdleFailed+s.IntentsFailed != 0 || rep.Outcomes.Failed != 0 {
		t.Fatalf("swept %+v, outcomes %+v", s, rep.Outcomes)
	}
	for _, id := range []string{p.orphan, p.idle, p.pending} {
		if w.alive(id) {
			t.Errorf("sandbox %s survived the sweep", id)
		}
	}
	for _, id := range []string{p.finBox, p.expBox, p.canBox, p.sharedBox, p.settled} {
		if !w.alive(id) {
			t.Errorf("sandbox %s was destroyed: a thread's sandbox, or one in use", id)
		}
	}
	for id, st := range map[string]contract.RunStatus{p.fin: contract.StatusCompleted, p.exp: contract.StatusAborted,
		p.can: contract.StatusAborted, p.shExp: contract.StatusAborted, p.prod: contract.StatusRunning, p.shLive: contract.StatusRunning} {
		rs, err := inner.Runs().State(w.ctx, id)
		if err != nil || rs == nil || rs.Status != st {
			t.Errorf("run %s: %+v, %v; want %s", id, rs, err, st)
			continue
		}
		// A claim retried after its lost response may burn an epoch (docs/design.md §3.1): 2 or 3.
		if st == contract.StatusAborted && (!rs.Cancelled() || rs.Epoch() < 2) {
			t.Errorf("expired run %s: cancelRequested %v, epoch %d; want set, ≥ 2", id, rs.Cancelled(), rs.Epoch())
		}
	}
	if rs, _ := inner.Runs().State(w.ctx, p.shLive); !rs.Lapsed || rs.Epoch() != 1 {
		t.Errorf("the lapsed run: %+v", rs)
	}
	for _, key := range []string{"sk_orphan", "sk_settled"} {
		if in, err := inner.Intents().Get(w.ctx, key); err != nil || in != nil {
			t.Errorf("intent %s left: %+v, %v", key, in, err)
		}
	}
	if row, _ := inner.Instances().GetRow(w.ctx, "sk_settled"); row == nil || row.ProviderSandboxID != p.settled {
		t.Errorf("the settled row changed: %+v", row)
	}
}

// entry returns runID's line of rep (zero when absent).
func entry(rep reaper.Report, runID string) reaper.RunEntry {
	for _, e := range rep.Runs {
		if e.RunID == runID {
			return e
		}
	}
	return reaper.RunEntry{}
}

func equalOutcomes(got, want map[string]reaper.Outcome) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// TestQuietReportLeavesTheLineToTheCaller: with QuietReport the sweep logs nothing on
// success (the Lambda handler logs the report it gets back); without it, one line.
func TestQuietReportLeavesTheLineToTheCaller(t *testing.T) {
	w := newWorld(t, memstore.New(), localprocess.New(t.TempDir()))
	for _, quiet := range []bool{true, false} {
		var logs bytes.Buffer
		rp := w.reaper(0, &logs, func(c *reapCfg) { c.QuietReport = quiet })
		if _, err := rp.Sweep(w.ctx); err != nil {
			t.Fatal(err)
		}
		want := 1
		if quiet {
			want = 0
		}
		if n := strings.Count(logs.String(), "\n"); n != want {
			t.Fatalf("QuietReport=%v: %d log lines, want %d: %s", quiet, n, want, logs.String())
		}
	}
}

// TestDynamoDryRunWritesNothing: on DynamoDB a dry run over an expired run, an idle row and
// a stale intent issues no write call at all (the sweep lock included).
func TestDynamoDryRunWritesNothing(t *testing.T) {
	w, c := dynamoWorld(t, localprocess.New(t.TempDir()))
	runID := w.id("expired")
	res := w.start(runID, runID)
	w.launch(res, runID, `printf '{"d":1}\n'; sleep 30`)
	w.detach(res, runID)
	rows := w.b.Instances()
	must(t, rows.CreateRow(w.ctx, contract.InstanceRecord{Key: "sk_idle", Provider: w.prov.Name(), ProviderSandboxID: "gone-1",
		ThreadID: "old", UpdatedAt: time.Now().Add(-72 * time.Hour).UnixMilli()}, "inc-1"))
	c.Reset()
	rp := w.reaper(2*time.Hour, nil, func(c *reapCfg) {
		c.K.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	})
	rep, err := rp.DryRun(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := writes(c); n != 0 {
		t.Fatalf("dry run: %d writes (%v)", n, c.Snapshot())
	}
	if e := entry(rep, runID); e.Outcome != reaper.Expired || e.Reclaim != reaper.ActKeepIdleStop || len(rep.Planned) < 2 {
		t.Fatalf("dry run report %+v", rep)
	}
	t.Logf("dry run: %d calls, all reads (%v)", c.Total(), c.Snapshot())
}
