package testkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/store"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// RunReaperConformance proves the reaper of docs/design.md §5 and the journal sweep of docs/design.md §6 on a backend and
// a provider with a real shell (reference reaper-conformance R1–R9, plus the docs/design.md §5 cases the
// spec adds): journal sweep decisions on real mtimes; a run that finished while detached
// is finalized with its transcript; a producing one is left byte-for-byte alone; expired
// and cancelled runs end aborted with their agent killed and sandbox reclaimed; a returning
// viewer wins; a shared sandbox is never destroyed; a failed destroy is retried; a lapsed
// lease is detached unless a late heartbeat comes first; a hostile run id executes nothing;
// the in-use check alone keeps a shared sandbox whose row looks idle.
func RunReaperConformance(t *testing.T, newBackend NewBackend, newProvider NewProvider) {
	t.Helper()
	runRigCases(t, []rigCase{
		{"R1 a terminal run's journal and sidecar go, a live run's stay", reaperR1},
		{"R2 sweeping twice is quiet and rm of an absent journal succeeds", reaperR2},
		{"R3 an undecodable name is left alone beside a swept run", reaperR3},
		{"R4 the mtime listing carries its self-witness", reaperR4},
		{"R5 an empty journal directory lists as empty, not unavailable", reaperR5},
		{"R6 an old orphan goes, a young one stays, by real mtimes", reaperR6},
		{"R7 a detached run that finished is finalized with its transcript", reaperR7},
		{"R8 a still-producing detached run is left completely untouched", reaperR8},
		{"R9 a shell-hostile run id executes nothing end to end", reaperR9},
		{"R10 an expired producing run ends aborted and its sandbox is gone", reaperR10},
		{"R11 a viewer re-attaching between listing and claim keeps driving", reaperR11},
		{"R12 a cancelled detached run is expired at the next sweep", reaperR12},
		{"R13 a sandbox shared with a live run is kept and the expired agent killed", reaperR13},
		{"R14 a failed destroy is retried by the next sweep", reaperR14},
		{"R15 a lapsed lease is detached then expired; a late heartbeat keeps its run", reaperR15},
		{"R16 a sandbox shared with a live run is kept running by the in-use check alone, its row idle", reaperR16},
		{"R17 two tenants' runs of one id never cross journals in the provider's default directory", reaperR17},
		{"R18 a one-run sandbox cancelled a second after its start is destroyed within a few sweeps", reaperR18},
		{"R19 an early-cancelled run leaves the thread its sandbox, which the next run resumes", reaperR19},
		{"R20 a run finalized on a sandbox another run uses is reported finalized, its sandbox kept", reaperR20},
	}, newBackend, newProvider)
}

// reaperTTL is the suites' detached-run TTL; sweeps shift their clock past it (or not).
const reaperTTL = time.Hour

// Clock shifts of sweeps: fresh (TTL not reached, rows idle past the driver lease +
// margin, so reclaims are not refused as recently touched) and expired.
const (
	shiftFresh   = 10 * time.Minute
	shiftExpired = 2 * time.Hour
)

// reapCfg is a sweep's configuration: the reaper's, and that of the keeper it works
// through (K).
type reapCfg struct {
	reaper.Config
	K keeper.Config
}

// sweep runs one sweep over b (the rig's backend when nil) with its clock shifted.
func (r *rig) sweep(b contract.Backend, prov contract.Provider, shift time.Duration, mod func(*reapCfg)) reaper.Report {
	r.t.Helper()
	rep, err := r.reaper(b, prov, shift, mod).Sweep(r.ctx)
	if err != nil {
		r.t.Fatalf("sweep: %v (report %+v)", err, rep)
	}
	return rep
}

// reaper is the reaper of a sweep over b (the rig's backend when nil) with its clock
// shifted.
func (r *rig) reaper(b contract.Backend, prov contract.Provider, shift time.Duration, mod func(*reapCfg)) *reaper.Reaper {
	r.t.Helper()
	if b == nil {
		b = r.b
	}
	if prov == nil {
		prov = r.prov
	}
	cfg := reapCfg{
		Config: reaper.Config{DetachedRunTTL: reaperTTL, JournalDir: rigJournalDir, LockWait: 10 * time.Second},
		K: keeper.Config{Backend: b, Providers: []contract.Provider{prov},
			Now:    func() time.Time { return time.Now().Add(shift) },
			Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))},
	}
	if mod != nil {
		mod(&cfg)
	}
	k, err := keeper.New(cfg.K)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg.Keeper = k
	rp, err := reaper.New(cfg.Config)
	if err != nil {
		r.t.Fatal(err)
	}
	return rp
}

// candidate is runID as the reaper source lists it, in the rig's tenant.
func (r *rig) candidate(runID string) contract.Candidate {
	r.t.Helper()
	tenant, err := contract.Tenant(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	return contract.Candidate{Tenant: tenant, RunID: runID}
}

// sweepFor sweeps until runID's entry of tenant shows up (a lagging index converges within a
// few listings) and returns that entry and the reports of every sweep.
func (r *rig) sweepFor(tenant, runID string, shift time.Duration, mod func(*reapCfg)) (reaper.RunEntry, []reaper.Report) {
	r.t.Helper()
	var reps []reaper.Report
	for range 10 {
		rep := r.sweep(nil, nil, shift, mod)
		reps = append(reps, rep)
		for _, e := range rep.Runs {
			if e.RunID == runID && e.Tenant == tenant {
				return e, reps
			}
		}
	}
	r.t.Fatalf("no sweep acted on %s of %q: %+v", runID, tenant, reps)
	return reaper.RunEntry{}, nil
}

// entry returns runID's line of rep, failing when absent.
func entryOf(t *testing.T, rep reaper.Report, runID string) reaper.RunEntry {
	t.Helper()
	for _, e := range rep.Runs {
		if e.RunID == runID {
			return e
		}
	}
	b, _ := json.Marshal(rep)
	t.Fatalf("run %s is not in the report %s", runID, b)
	return reaper.RunEntry{}
}

// detachedRun starts a run, launches agent and detaches it; it returns the start result.
func (r *rig) detachedRun(prefix, agent string) (string, keeper.StartResult) {
	r.t.Helper()
	return r.detachedRunReuse(prefix, agent, keeper.ReuseThread)
}

// detachedRunOne is detachedRun in a sandbox of the run's own (reuse "none"), which the
// reaper destroys with the run (docs/design.md §5): the reclaim cases use it.
func (r *rig) detachedRunOne(prefix, agent string) (string, keeper.StartResult) {
	r.t.Helper()
	return r.detachedRunReuse(prefix, agent, keeper.ReuseNone)
}

func (r *rig) detachedRunReuse(prefix, agent string, reuse keeper.Reuse) (string, keeper.StartResult) {
	r.t.Helper()
	runID := r.id(prefix)
	res := r.startReuse(runID, runID+"-t", reuse)
	r.launch(res.Sandbox.ProviderSandboxID, runID, agent)
	if _, err := r.k.DetachWithKey(r.ctx, runID, res.Driver.Epoch, res.Sandbox.Key); err != nil {
		r.t.Fatalf("detach: %v", err)
	}
	return runID, res
}

// status reads the provider's status of psid.
func (r *rig) status(psid string) contract.SandboxStatus {
	s, err := r.prov.(contract.StatusReader).Status(r.ctx, psid)
	if err != nil {
		r.t.Fatalf("status: %v", err)
	}
	return s
}

// storedRun puts a run record with status st in the store (the sweep asks only Get).
func (r *rig) storedRun(runID string, st contract.RunStatus) {
	r.t.Helper()
	if _, err := refstore.Runs(r.b.Runs()).CreateOrResume(r.ctx, contract.NewRun{RunID: runID, ThreadID: runID + "-t", StartedAt: time.Now().UnixMilli()}); err != nil {
		r.t.Fatal(err)
	}
	if st.Terminal() {
		if err := refstore.Runs(r.b.Runs()).Update(r.ctx, runID, contract.RunPatch{Status: contract.Set(st), FinishedAt: contract.Set(time.Now().UnixMilli())}); err != nil {
			r.t.Fatal(err)
		}
	}
}

// finishedJournal runs an agent to its sentinel in psid.
func (r *rig) finishedJournal(psid, runID string) {
	r.t.Helper()
	r.launch(psid, runID, printDeltas("1")+"echo warn >&2\n")
	r.waitFinished(psid, runID)
}

func (r *rig) sweepDir(psid string, now time.Time) reaper.JournalSweep {
	r.t.Helper()
	js, err := reaper.SweepJournalDir(r.ctx, store.New(r.b, storecall.Policy{}).Runs(), r.ex, psid, rigJournalDir, now, reaper.DefaultJournalDeletes)
	if err != nil {
		r.t.Fatalf("journal sweep: %v", err)
	}
	return js
}

func reaperR1(t *testing.T, r *rig) {
	psid := r.sandbox()
	term, live := r.id("rp-terminal"), r.id("rp-live")
	r.finishedJournal(psid, term)
	r.finishedJournal(psid, live)
	r.storedRun(term, contract.StatusCompleted)
	r.storedRun(live, contract.StatusRunning)
	pt, pl := r.paths(term), r.paths(live)
	if !r.exists(psid, pt.Journal) || !r.exists(psid, pt.Stderr) || !r.exists(psid, pl.Journal) {
		t.Fatal("premise: journals missing before the sweep")
	}
	js := r.sweepDir(psid, time.Now())
	if !slices.Equal(js.Deleted, []string{term}) || len(js.Kept) != 1 || js.Kept[0].RunID != live || js.Kept[0].Reason != reaper.KeptNonTerminal {
		t.Fatalf("sweep = %+v", js)
	}
	if r.exists(psid, pt.Journal) || r.exists(psid, pt.Stderr) || !r.exists(psid, pl.Journal) || !r.exists(psid, pl.Stderr) {
		t.Fatal("wrong files deleted (checked through the shell)")
	}
}

func reaperR2(t *testing.T, r *rig) {
	psid := r.sandbox()
	runID := r.id("rp-twice")
	r.finishedJournal(psid, runID)
	r.storedRun(runID, contract.StatusFailed)
	if js := r.sweepDir(psid, time.Now()); !slices.Equal(js.Deleted, []string{runID}) {
		t.Fatalf("first sweep = %+v", js)
	}
	if js := r.sweepDir(psid, time.Now()); len(js.Deleted)+len(js.Kept)+len(js.Undecodable) != 0 {
		t.Fatalf("second sweep = %+v", js)
	}
	if err := journal.Delete(r.ctx, r.ex, psid, rigJournalDir, runID); err != nil {
		t.Fatalf("rm -f of an absent journal: %v", err)
	}
}

func reaperR3(t *testing.T, r *rig) {
	psid := r.sandbox()
	runID := r.id("rp-stray")
	r.finishedJournal(psid, runID)
	r.storedRun(runID, contract.StatusCompleted)
	stray := rigJournalDir + "/reaper-conformance-stray_1.ndjson"
	r.exec(psid, ": > "+journal.Quote(stray))
	js := r.sweepDir(psid, time.Now())
	if !slices.Equal(js.Deleted, []string{runID}) || !slices.Equal(js.Undecodable, []string{"reaper-conformance-stray_1.ndjson"}) || len(js.Kept) != 0 {
		t.Fatalf("sweep = %+v", js)
	}
	if !r.exists(psid, stray) || r.exists(psid, r.paths(runID).Journal) {
		t.Fatal("the stray must stay and the journal go")
	}
}

func reaperR4(t *testing.T, r *rig) {
	psid := r.sandbox()
	runID := r.id("rp-witness")
	r.finishedJournal(psid, runID)
	l, err := journal.List(r.ctx, r.ex, psid, rigJournalDir)
	if err != nil || len(l.Runs) != 1 || l.Runs[0].RunID != runID {
		t.Fatalf("listing = %+v, %v", l, err)
	}
	enc := journal.Name(rigTenant, runID)
	if want := []string{enc + ".err", enc + ".ndjson", enc + ".pid"}; !slices.Equal(l.Runs[0].Names, want) {
		t.Fatalf("names = %v, want %v", l.Runs[0].Names, want)
	}
	if d := time.Since(l.Runs[0].ModTime); d < -2*time.Minute || d > 2*time.Minute {
		t.Fatalf("mtime %v is not within 120 s of now", l.Runs[0].ModTime)
	}
}

func reaperR5(t *testing.T, r *rig) {
	psid := r.sandbox()
	r.exec(psid, "mkdir -p "+journal.Quote(rigJournalDir))
	l, err := journal.List(r.ctx, r.ex, psid, rigJournalDir)
	if err != nil || len(l.Runs) != 0 || len(l.Undecodable) != 0 {
		t.Fatalf("empty directory listed as %+v, %v", l, err)
	}
	if js := r.sweepDir(psid, time.Now()); len(js.Deleted)+len(js.Kept) != 0 {
		t.Fatalf("sweep = %+v", js)
	}
}

func reaperR6(t *testing.T, r *rig) {
	psid := r.sandbox()
	older, newer := r.id("rp-older"), r.id("rp-newer")
	r.finishedJournal(psid, older)
	r.finishedJournal(psid, newer)
	// Real mtimes, moved with touch -d rather than waited for.
	for _, f := range []string{".ndjson", ".err", ".pid"} {
		r.exec(psid, "touch -d '@"+strconv.FormatInt(time.Now().Add(-2*time.Hour).Unix(), 10)+"' "+
			journal.Quote(rigJournalDir+"/"+journal.Name(rigTenant, older)+f))
	}
	js := r.sweepDir(psid, time.Now())
	if !slices.Equal(js.Deleted, []string{older}) || len(js.Kept) != 1 || js.Kept[0].RunID != newer || js.Kept[0].Reason != reaper.KeptOrphanRecent {
		t.Fatalf("sweep = %+v", js)
	}
	if r.exists(psid, r.paths(older).Journal) || !r.exists(psid, r.paths(newer).Journal) {
		t.Fatal("wrong orphan deleted")
	}
}

func reaperR7(t *testing.T, r *rig) {
	runID, res := r.detachedRun("rp-final", printDeltas("1", "2", "3"))
	psid := res.Sandbox.ProviderSandboxID
	r.waitFinished(psid, runID)
	ds := *r.state(runID).DetachedSince
	rep := r.sweep(nil, nil, shiftFresh, nil)
	zero := 0
	want := reaper.RunEntry{Tenant: "acme", RunID: runID, Outcome: reaper.Finalized, Status: "completed", ExitCode: &zero, Events: 3, Sandbox: reaper.SandboxKept, Kept: reaper.KeptIdleStop}
	if got := entryOf(t, rep, runID); !reflect.DeepEqual(got, want) {
		t.Fatalf("entry = %+v, want %+v", got, want)
	}
	if rep.Considered != 1 || rep.Probed != 1 || rep.Outcomes.Finalized != 1 {
		t.Fatalf("report = %+v", rep)
	}
	if got := deltas(t, r.events(runID)); strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("transcript = %v", got)
	}
	st := r.state(runID)
	if st.Status != contract.StatusCompleted || st.DetachedSince == nil || *st.DetachedSince != ds || st.Epoch() != 2 {
		t.Fatalf("record = %+v (detachedSince must stay %d)", st.RunRecord, ds)
	}
	// The thread keeps its sandbox for its next run (docs/design.md §5).
	if s := r.status(psid); s != contract.SandboxAlive {
		t.Fatalf("sandbox %s after finalize; want it kept for the thread", s)
	}
}

// writeMethods are the FaultBackend methods that write a run, its log or its row.
var writeMethods = []string{"Runs.CreateClaimed", "Runs.Claim", "Runs.UpdateFenced", "Runs.RecordSandbox", "Runs.ClearLaunch",
	"Runs.Heartbeat", "Runs.Detach", "Runs.RequestCancel", "Log.Append", "Log.Fence", "Log.Close",
	"Log.MarkCancel", "Instances.MarkReclaiming", "Instances.DeleteReclaimed", "Instances.Touch"}

func reaperR8(t *testing.T, r *rig) {
	runID, res := r.detachedRun("rp-live", printDeltas("1")+waitGate("never"))
	psid := res.Sandbox.ProviderSandboxID
	t.Cleanup(func() { _ = journal.KillAgent(context.Background(), r.ex, psid, rigJournalDir, runID) })
	r.waitLine(psid, runID, `{"delta":"1"}`)
	if pr := journal.Probe(r.ctx, r.ex, psid, rigJournalDir, runID); pr.State != journal.Producing {
		t.Fatalf("premise: probe = %+v", pr)
	}
	before := r.state(runID)
	row, _ := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key)
	fb := storetest.NewFaultBackend(r.b)
	// The idle stop is off: it would defer the row's stop (a write) for the live run.
	rep := r.sweep(fb, nil, shiftFresh, func(c *reapCfg) { c.IdleStop = -1 })
	if got, want := entryOf(t, rep, runID), (reaper.RunEntry{Tenant: "acme", RunID: runID, Outcome: reaper.Producing}); !reflect.DeepEqual(got, want) {
		t.Fatalf("entry = %+v, want %+v", got, want)
	}
	if rep.Considered != 1 || rep.Probed != 1 || rep.Outcomes.Producing != 1 || rep.Outcomes.Finalized+rep.Outcomes.Expired+rep.Outcomes.Failed != 0 {
		t.Fatalf("report = %+v", rep)
	}
	for _, m := range writeMethods {
		if n := fb.Calls(m); n != 0 {
			t.Errorf("%s called %d times on a producing run", m, n)
		}
	}
	after := r.state(runID)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("record changed:\n%+v\n%+v", before, after)
	}
	row2, _ := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key)
	if !reflect.DeepEqual(row, row2) || len(r.events(runID)) != 0 || r.status(psid) != contract.SandboxAlive {
		t.Fatalf("row, log or sandbox touched: %+v / %+v", row, row2)
	}
}

func reaperR9(t *testing.T, r *rig) {
	n := strconv.FormatInt(time.Now().UnixNano(), 36)
	canary := "/tmp/rp-pwn-" + n
	runID := "rp-a;touch " + canary + ";b c/d$(x)-" + n
	t.Cleanup(func() { _ = os.Remove(canary) })
	noCanary := func(step string) {
		t.Helper()
		if _, err := os.Stat(canary); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: the canary %s exists: a run id was executed", step, canary)
		}
	}
	res := r.start(runID, "rp-hostile-thread-"+n)
	psid := res.Sandbox.ProviderSandboxID
	r.launch(psid, runID, printDeltas("1")+"echo boom >&2\n")
	if code := r.waitFinished(psid, runID); code != 0 {
		t.Fatalf("exit %d", code)
	}
	noCanary("launch and probe")
	p := r.paths(runID)
	base := p.Journal[strings.LastIndexByte(p.Journal, '/')+1:]
	if strings.Trim(base, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" || !strings.HasPrefix(p.Journal, rigJournalDir+"/") {
		t.Fatalf("journal name %q is not inert", p.Journal)
	}
	if tail, err := journal.StderrTail(r.ctx, r.ex, psid, rigJournalDir, runID, 0); err != nil || string(tail) != "boom\n" {
		t.Fatalf("stderr = %q, %v", tail, err)
	}
	l, err := journal.List(r.ctx, r.ex, psid, rigJournalDir)
	if err != nil || len(l.Runs) != 1 || l.Runs[0].RunID != runID {
		t.Fatalf("listing = %+v, %v", l, err)
	}
	noCanary("stderr and list")
	if _, err := r.k.DetachWithKey(r.ctx, runID, res.Driver.Epoch, res.Sandbox.Key); err != nil {
		t.Fatal(err)
	}
	rep := r.sweep(nil, nil, shiftFresh, nil)
	if e := entryOf(t, rep, runID); e.Outcome != reaper.Finalized || e.Status != "completed" {
		t.Fatalf("entry = %+v", e)
	}
	if got := deltas(t, r.events(runID)); strings.Join(got, ",") != "1" {
		t.Fatalf("transcript = %v", got)
	}
	noCanary("finalize, delete and reclaim")
}

func reaperR10(t *testing.T, r *rig) {
	runID, res := r.detachedRunOne("rp-expired", printDeltas("1")+waitGate("never"))
	psid := res.Sandbox.ProviderSandboxID
	r.waitLine(psid, runID, `{"delta":"1"}`)
	rep := r.sweep(nil, nil, shiftExpired, nil)
	e := entryOf(t, rep, runID)
	if e.Outcome != reaper.Expired || e.Status != "aborted" || e.Events != 1 || rep.Probed != 0 {
		t.Fatalf("entry = %+v, report %+v", e, rep)
	}
	st := r.state(runID)
	if st.Status != contract.StatusAborted || st.Error == nil || st.Error.Code != "expired" || !st.Cancelled() || st.DetachedSince == nil {
		t.Fatalf("record = %+v", st.RunRecord)
	}
	if got := deltas(t, r.events(runID)); strings.Join(got, ",") != "1" {
		t.Fatalf("transcript = %v", got)
	}
	if s := r.status(psid); s != contract.SandboxGone {
		t.Fatalf("sandbox %s; want gone", s)
	}
	if row, err := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key); err != nil || row != nil {
		t.Fatalf("row %+v, %v; want deleted", row, err)
	}
}

func reaperR11(t *testing.T, r *rig) {
	runID, res := r.detachedRun("rp-viewer", printDeltas("1")+waitGate("never"))
	psid := res.Sandbox.ProviderSandboxID
	t.Cleanup(func() { _ = journal.KillAgent(context.Background(), r.ex, psid, rigJournalDir, runID) })
	r.waitLine(psid, runID, `{"delta":"1"}`)
	// Classified as expired, then the viewer returns, then the sweep acts: its claim must
	// lose to the viewer's.
	rp := r.reaper(nil, nil, shiftExpired, nil)
	d := rp.Classify(r.ctx, r.candidate(runID))
	if d.Outcome != reaper.Expired {
		t.Fatalf("classified %+v; want expired (the claim is what this case tests)", d)
	}
	att, err := r.k.Attach(r.ctx, runID) // the viewer returns
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	rep := rp.Act(r.ctx, d)
	if e := entryOf(t, rep, runID); e.Outcome != reaper.NotClaimed {
		t.Fatalf("entry = %+v", e)
	}
	st := r.state(runID)
	if st.Status != contract.StatusRunning || st.Epoch() != 2 || st.DetachedSince != nil || st.Cancelled() {
		t.Fatalf("record = %+v; want the viewer's epoch 2, no cancel", st.RunRecord)
	}
	ar, err := r.k.Append(r.ctx, runID, att.Driver.Cursor, []contract.Event{{Data: json.RawMessage(`{"delta":"v"}`), Src: 1}})
	if err != nil || ar.Cursor.Epoch != 2 {
		t.Fatalf("the viewer's cursor after the sweep: %+v, %v", ar, err)
	}
	if r.status(psid) != contract.SandboxAlive {
		t.Fatal("the viewer's sandbox was touched")
	}
}

func reaperR12(t *testing.T, r *rig) {
	runID, res := r.detachedRunOne("rp-cancel", printDeltas("1")+waitGate("never"))
	psid := res.Sandbox.ProviderSandboxID
	r.waitLine(psid, runID, `{"delta":"1"}`)
	if _, err := r.k.Cancel(r.ctx, runID); err != nil {
		t.Fatal(err)
	}
	rep := r.sweep(nil, nil, shiftFresh, nil) // the TTL is far away: the cancel alone expires it
	if e := entryOf(t, rep, runID); e.Outcome != reaper.Expired || e.Status != "aborted" {
		t.Fatalf("entry = %+v", e)
	}
	if st := r.state(runID); st.Error == nil || st.Error.Code != "cancelled" {
		t.Fatalf("record = %+v", st.RunRecord)
	}
	if r.status(psid) != contract.SandboxGone {
		t.Fatal("a cancelled run's sandbox must be destroyed")
	}
}

// tickAgent prints one delta, then ticks a file in the sandbox every 50 ms (bounded).
func tickAgent(file string) string {
	return printDeltas("1") + fmt.Sprintf("i=0; while [ $i -lt 2400 ]; do printf x >> %s; sleep 0.05; i=$((i+1)); done\n", journal.Quote(file))
}

func reaperR13(t *testing.T, r *rig) {
	thread := r.id("rp-shared-thread")
	expired := r.id("rp-shared-expired")
	res := r.start(expired, thread)
	psid := res.Sandbox.ProviderSandboxID
	tick := "tick-" + expired
	r.launch(psid, expired, tickAgent(tick))
	if _, err := r.k.DetachWithKey(r.ctx, expired, 1, res.Sandbox.Key); err != nil {
		t.Fatal(err)
	}
	live := r.id("rp-shared-live")
	res2 := r.start(live, thread)
	if res2.Sandbox.ProviderSandboxID != psid || res2.Sandbox.Key != res.Sandbox.Key {
		t.Fatalf("premise: the second run got another sandbox: %+v", res2.Sandbox)
	}
	size := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(string(r.exec(psid, "wc -c < "+journal.Quote(tick)+" 2>/dev/null || echo 0").Stdout)))
		return n
	}
	r.eventually("the agent to tick", func() bool { return size() >= 2 })
	// A tiny TTL instead of a shifted clock: the row was just touched by the live run's start,
	// so even an in-use index that lags cannot make the reclaim destroy it.
	rep := r.sweep(nil, nil, 0, func(c *reapCfg) { c.DetachedRunTTL = time.Millisecond })
	e := entryOf(t, rep, expired)
	if e.Outcome != reaper.Expired || e.Status != "aborted" || e.Sandbox != reaper.SandboxKept || rep.Sandboxes.Kept != 1 {
		t.Fatalf("entry = %+v (sandboxes %+v); want expired, aborted, its sandbox kept", e, rep.Sandboxes)
	}
	// The report says why: the live run (or, while the index lags, its fresh touch).
	if e.Kept != reaper.KeptIdleStop {
		t.Fatalf("entry = %+v; want kept for the thread (idle-stop)", e)
	}
	if r.status(psid) != contract.SandboxAlive {
		t.Fatal("a sandbox serving a live run was destroyed")
	}
	if st := r.state(live); st.Status != contract.StatusRunning || st.Epoch() != 1 {
		t.Fatalf("the live run was touched: %+v", st.RunRecord)
	}
	base := size()
	grew := 0
	for range 10 {
		time.Sleep(60 * time.Millisecond)
		if size() != base {
			grew++
		}
	}
	if grew > 0 {
		t.Fatalf("the expired agent still ticks (%d of 10 samples grew)", grew)
	}
}

// flakyDestroy fails Destroy while fail > 0.
type flakyDestroy struct {
	contract.Provider
	contract.Executor
	contract.StatusReader
	fail  atomic.Int64
	tries atomic.Int64
}

func (f *flakyDestroy) Destroy(ctx context.Context, id string) error {
	f.tries.Add(1)
	if f.fail.Add(-1) >= 0 {
		return errors.New("injected destroy failure")
	}
	return f.Provider.Destroy(ctx, id)
}

func reaperR14(t *testing.T, r *rig) {
	runID, res := r.detachedRunOne("rp-flaky", printDeltas("1"))
	psid := res.Sandbox.ProviderSandboxID
	r.waitFinished(psid, runID)
	fp := &flakyDestroy{Provider: r.prov, Executor: r.ex, StatusReader: r.prov.(contract.StatusReader)}
	fp.fail.Store(1)
	rep := r.sweep(nil, fp, shiftFresh, nil)
	if e := entryOf(t, rep, runID); e.Outcome != reaper.Finalized || e.Status != "completed" || e.Sandbox != reaper.SandboxReclaimFailed ||
		rep.Sandboxes.ReclaimFailed != 1 || rep.Outcomes.Finalized != 1 || rep.OutcomeCounts()["reclaim-failed"] != 1 {
		t.Fatalf("entry = %+v", e)
	}
	row, err := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key)
	if err != nil || row == nil || row.Reclaiming == "" || r.status(psid) != contract.SandboxAlive {
		t.Fatalf("after a failed destroy: row %+v (%v), sandbox %s; want the tombstone kept", row, err, r.status(psid))
	}
	rep = r.sweep(nil, fp, shiftFresh, nil)
	if rep.Swept.PendingReclaims != 1 || fp.tries.Load() != 2 {
		t.Fatalf("second sweep %+v after %d destroys", rep.Swept, fp.tries.Load())
	}
	if row, _ := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key); row != nil || r.status(psid) != contract.SandboxGone {
		t.Fatalf("the retry left row %+v, sandbox %s", row, r.status(psid))
	}
}

func reaperR15(t *testing.T, r *rig) {
	// Two runs whose drivers went silent (never detached): their leases lapse.
	lapsed, resA := r.id("rp-lapsed"), keeper.StartResult{}
	resA = r.startReuse(lapsed, lapsed+"-t", keeper.ReuseNone) // destroyed with its run
	r.launch(resA.Sandbox.ProviderSandboxID, lapsed, printDeltas("1")+waitGate("never"))
	kept := r.id("rp-kept")
	resB := r.start(kept, kept+"-t")
	r.waitLine(resA.Sandbox.ProviderSandboxID, lapsed, `{"delta":"1"}`)
	leaseA := r.state(lapsed).LeaseUntil
	// Past both leases, within the TTL: both are classified to be lapsed; kept's late
	// heartbeat lands between that decision and the lapse. Then the sweep acts: lapsed →
	// detached since leaseUntil, then probed; kept's lapse is refused.
	rp := r.reaper(nil, nil, shiftFresh, nil)
	dA, dB := rp.Classify(r.ctx, r.candidate(lapsed)), rp.Classify(r.ctx, r.candidate(kept))
	if !dA.Lapse || !dB.Lapse {
		t.Fatalf("classified %+v and %+v; want both lapsed", dA, dB)
	}
	if _, err := r.k.Heartbeat(r.ctx, kept, resB.Driver.Epoch); err != nil {
		t.Fatalf("late heartbeat: %v", err)
	}
	repA, repB := rp.Act(r.ctx, dA), rp.Act(r.ctx, dB)
	if repA.Swept.Lapsed+repB.Swept.Lapsed != 1 || repA.Swept.Lapsed != 1 || repB.Swept.Stale != 1 {
		t.Fatalf("swept %+v and %+v; want the lapsed run lapsed, the heartbeat run stale", repA.Swept, repB.Swept)
	}
	if e := entryOf(t, repA, lapsed); e.Outcome != reaper.Producing {
		t.Fatalf("lapsed entry = %+v", e)
	}
	st := r.state(lapsed)
	if st.DetachedSince == nil || *st.DetachedSince != leaseA || !st.Lapsed || st.Epoch() != 1 {
		t.Fatalf("lapsed run = %+v", st)
	}
	if stB := r.state(kept); stB.DetachedSince != nil || stB.Lapsed || stB.Epoch() != 1 {
		t.Fatalf("the run whose heartbeat came first was lapsed: %+v", stB)
	}
	for _, e := range append(repA.Runs, repB.Runs...) {
		if e.RunID == kept {
			t.Fatalf("the heartbeat run was acted on: %+v", e)
		}
	}
	// Later, past the TTL: the lapsed run expires.
	rep := r.sweep(nil, nil, shiftExpired, nil)
	if e := entryOf(t, rep, lapsed); e.Outcome != reaper.Expired || e.Status != "aborted" {
		t.Fatalf("entry = %+v", e)
	}
	if r.status(resA.Sandbox.ProviderSandboxID) != contract.SandboxGone {
		t.Fatal("the expired lapsed run's sandbox survived")
	}
}

// indexWait bounds R16's wait for the key index to list a run: a correct index converges
// in a few queries (memstore's lag is counted in calls, dynalite has none), so the wait only
// ends early a broken store's case; the destroy, not the wait, decides the case.
const indexWait = 3 * time.Second

// reaperR20: a detached run whose agent exited 0 shares its thread's sandbox with a live
// run. The sweep finalizes it (completed) and keeps the sandbox; the report says both, the
// run's outcome finalized and its sandbox kept, never the sandbox's fate in the run's place.
func reaperR20(t *testing.T, r *rig) {
	thread := r.id("rp-fin-shared-thread")
	done := r.id("rp-fin-shared-done")
	res := r.start(done, thread)
	psid := res.Sandbox.ProviderSandboxID
	r.launch(psid, done, printDeltas("1", "2"))
	if _, err := r.k.DetachWithKey(r.ctx, done, 1, res.Sandbox.Key); err != nil {
		t.Fatal(err)
	}
	live := r.id("rp-fin-shared-live")
	if res2 := r.start(live, thread); res2.Sandbox.ProviderSandboxID != psid {
		t.Fatalf("premise: the second run got another sandbox: %+v", res2.Sandbox)
	}
	r.waitFinished(psid, done)
	rep := r.sweep(nil, nil, 0, nil)
	e := entryOf(t, rep, done)
	if e.Outcome != reaper.Finalized || e.Status != "completed" || e.Events != 2 || e.Sandbox != reaper.SandboxKept || e.Kept == "" {
		t.Fatalf("entry = %+v; want finalized, completed, 2 events, its sandbox kept", e)
	}
	if rep.Outcomes.Finalized != 1 || rep.Sandboxes.Kept != 1 || rep.OutcomeCounts()["finalized"] != 1 {
		t.Fatalf("outcomes %+v, sandboxes %+v; want one finalized run, one kept sandbox", rep.Outcomes, rep.Sandboxes)
	}
	if st := r.state(done); st.Status != contract.StatusCompleted {
		t.Fatalf("record = %+v", st.RunRecord)
	}
	if r.status(psid) != contract.SandboxAlive {
		t.Fatal("a sandbox serving a live run was destroyed")
	}
}

func reaperR16(t *testing.T, r *rig) {
	thread := r.id("rp-inuse-thread")
	live := r.id("rp-inuse-live")
	res := r.start(live, thread)
	psid, key := res.Sandbox.ProviderSandboxID, res.Sandbox.Key
	// The expired run starts second: it is the row's latest run, so once it has ended the
	// row's own words say "idle" and only the in-use check can find the live run.
	expired := r.id("rp-inuse-expired")
	if res2 := r.start(expired, thread); res2.Sandbox.ProviderSandboxID != psid {
		t.Fatalf("premise: the second run got another sandbox: %+v", res2.Sandbox)
	}
	r.launch(psid, expired, printDeltas("1")+waitGate("never"))
	t.Cleanup(func() { _ = journal.KillAgent(context.Background(), r.ex, psid, rigJournalDir, expired) })
	if _, err := r.k.DetachWithKey(r.ctx, expired, 1, key); err != nil {
		t.Fatal(err)
	}
	r.waitLine(psid, expired, `{"delta":"1"}`)
	listed := func() bool {
		ids, err := r.b.Runs().RunsUsingKey(r.ctx, key)
		return err == nil && slices.Contains(ids, live)
	}
	for deadline := time.Now().Add(indexWait); !listed(); {
		if time.Now().After(deadline) {
			t.Logf("the key index did not list the live run within %v", indexWait)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Sweep 1 expires the detached run; the thread keeps its sandbox (docs/design.md §5).
	e, _ := r.sweepFor(rigTenant, expired, 0, func(c *reapCfg) {
		c.DetachedRunTTL, c.K.DriverLease, c.K.ReclaimMargin = time.Millisecond, time.Millisecond, time.Millisecond
		c.IdleStop = -1
	})
	if e.Outcome != reaper.Expired || e.Status != "aborted" || e.Sandbox != reaper.SandboxKept {
		t.Fatalf("entry = %+v; want expired, aborted, its sandbox kept", e)
	}
	// Sweep 2, an hour later: the row and its latest run have been idle past the grace, so
	// only the in-use check stands between the idle stop and the live run.
	rep := r.sweep(nil, nil, time.Hour, func(c *reapCfg) {
		c.DetachedRunTTL, c.IdleStop = 24*time.Hour, 10*time.Minute
	})
	if r.status(psid) != contract.SandboxAlive {
		t.Fatal("a sandbox serving a live run was stopped")
	}
	if lc := rep.Lifecycle; lc.InUse != 1 || lc.Stopped != 0 {
		t.Fatalf("lifecycle %+v; want the sandbox kept in use, nothing stopped", lc)
	}
	row, err := r.b.Instances().GetRow(r.ctx, key)
	if err != nil || row == nil || row.ProviderSandboxID != psid || row.Reclaiming != "" || row.Lifecycle != contract.LifecycleRunning {
		t.Fatalf("row %+v, %v; want it naming the live run's sandbox, running, no tombstone", row, err)
	}
	if st := r.state(live); st.Status != contract.StatusRunning || st.Epoch() != 1 {
		t.Fatalf("the live run was touched: %+v", st.RunRecord)
	}
}

// reaperR17: tenants A and B each start run X (one id) in their own sandbox, with the journal
// in the provider's default directory (what dev and the functions use). A's agent finishes.
// B's detached run must not be finalized from A's journal, and A's journal must survive B's
// sweep; then A is finalized with its own output only, and B can still launch its own agent.
func reaperR17(t *testing.T, r *rig) {
	runID := r.id("rp-cross")
	type side struct {
		ctx context.Context
		res keeper.StartResult
	}
	start := func(tenant string) side {
		ctx := contract.WithTenant(r.ctx, tenant)
		res, err := r.k.Start(ctx, keeper.StartInput{RunID: runID, ThreadID: "thread-1",
			Sandbox: keeper.Setup{ID: "agent", Provider: r.prov.Name()}})
		if err != nil {
			t.Fatalf("start %s in %s: %v", runID, tenant, err)
		}
		psid := res.Sandbox.ProviderSandboxID
		t.Cleanup(func() { _ = r.prov.Destroy(context.Background(), psid) })
		return side{ctx, res}
	}
	a, b := start("tenant-a"), start("tenant-b")
	if a.res.Sandbox.ProviderSandboxID == b.res.Sandbox.ProviderSandboxID {
		t.Fatal("premise: the two tenants share a sandbox")
	}
	psidA, psidB := a.res.Sandbox.ProviderSandboxID, b.res.Sandbox.ProviderSandboxID
	if _, err := journal.Launch(a.ctx, r.ex, psidA, "", runID, printDeltas("from-a")); err != nil {
		t.Fatalf("launch in A: %v", err)
	}
	r.eventually("A's agent to finish", func() bool {
		return journal.Probe(a.ctx, r.ex, psidA, "", runID).State == journal.Finished
	})
	detach := func(s side) {
		if _, err := r.k.DetachWithKey(s.ctx, runID, s.res.Driver.Epoch, s.res.Sandbox.Key); err != nil {
			t.Fatalf("detach: %v", err)
		}
	}
	read := func(s side) []contract.Event {
		res, err := r.k.Read(s.ctx, runID, 0, 1000, 0)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return res.Events
	}
	status := func(s side) contract.RunStatus {
		st, err := r.b.Runs().State(s.ctx, runID)
		if err != nil || st == nil {
			t.Fatalf("state: %v %v", st, err)
		}
		return st.Status
	}
	sweepFor := func(tenant string, shift time.Duration) (reaper.RunEntry, []reaper.Report) {
		return r.sweepFor(tenant, runID, shift, func(c *reapCfg) { c.JournalDir = "" })
	}

	// B detached without an agent: nothing of B's says it finished. (No clock shift: A's
	// driver lease holds, so A is no candidate of this sweep.)
	detach(b)
	if e, _ := sweepFor("tenant-b", 0); e.Outcome == reaper.Finalized || e.Events != 0 {
		t.Fatalf("B's run was acted on from another tenant's journal: %+v", e)
	}
	if evs, st := read(b), status(b); len(evs) != 0 || st != contract.StatusRunning {
		t.Fatalf("B's run is %s with log %v; want running with an empty log", st, deltas(t, evs))
	}
	if pr := journal.Probe(a.ctx, r.ex, psidA, "", runID); pr.State != journal.Finished {
		t.Fatalf("A's journal after B's sweep: %+v; want it untouched", pr)
	}

	// A detaches: finalized from its own journal, with its own output only.
	detach(a)
	e, reps := sweepFor("tenant-a", shiftFresh)
	if e.Outcome != reaper.Finalized || e.Status != "completed" || e.Events != 1 {
		t.Fatalf("A's entry = %+v", e)
	}
	for _, rep := range reps {
		for _, e := range rep.Runs {
			if e.RunID == runID && e.Tenant == "tenant-b" && e.Outcome == reaper.Finalized {
				t.Fatalf("B's entry = %+v", e)
			}
		}
	}
	if got := deltas(t, read(a)); !slices.Equal(got, []string{"from-a"}) || status(a) != contract.StatusCompleted {
		t.Fatalf("A's log %v, status %s", got, status(a))
	}
	if evs, st := read(b), status(b); len(evs) != 0 || st != contract.StatusRunning {
		t.Fatalf("after A's finalize B's run is %s with log %v", st, deltas(t, evs))
	}
	// B's sandbox holds no journal of run X: B launches its own agent.
	if _, err := journal.Launch(b.ctx, r.ex, psidB, "", runID, printDeltas("from-b")); err != nil {
		t.Fatalf("launch in B: %v", err)
	}
	r.eventually("B's agent to finish", func() bool {
		return journal.Probe(b.ctx, r.ex, psidB, "", runID).State == journal.Finished
	})
}

// earlyCancel starts a detached run whose agent never ends and cancels it right after its
// start, then sweeps (real clock) until the reaper ends it: the row was touched by the
// run's own start moments ago, so the sandbox is kept with the reclaim deferred.
func (r *rig) earlyCancel(prefix string) (string, keeper.StartResult, reaper.RunEntry) {
	r.t.Helper()
	runID, res := r.detachedRunOne(prefix, printDeltas("1")+waitGate("never"))
	r.t.Cleanup(func() {
		_ = journal.KillAgent(context.Background(), r.ex, res.Sandbox.ProviderSandboxID, rigJournalDir, runID)
	})
	if _, err := r.k.Cancel(r.ctx, runID); err != nil {
		r.t.Fatal(err)
	}
	e, _ := r.sweepFor(rigTenant, runID, 0, nil)
	if e.Outcome != reaper.Expired || e.Status != "aborted" || e.Sandbox != reaper.SandboxKept || e.Kept != reaper.KeptTouched || e.RetryAt <= 0 {
		r.t.Fatalf("entry = %+v; want expired, aborted, its sandbox kept touched-recently with a retry time", e)
	}
	row, err := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key)
	if err != nil || row == nil || row.ReclaimDue != e.RetryAt || row.Reclaiming != "" {
		r.t.Fatalf("row %+v (%v); want the reclaim deferred to %d", row, err, e.RetryAt)
	}
	return runID, res, e
}

// reaperR18: the sweeps after an early cancel retry the deferred reclaim and destroy the
// sandbox once its start's touch is older than the reclaim margin (5 s, reached here by
// shifting the sweeps' clock a second per sweep, as a 1 s ticker would).
func reaperR18(t *testing.T, r *rig) {
	_, res, _ := r.earlyCancel("rp-early-cancel")
	psid := res.Sandbox.ProviderSandboxID
	var reps []reaper.Report
	for i := 1; r.status(psid) != contract.SandboxGone; i++ {
		if i > 12 {
			t.Fatalf("the sandbox outlived %d sweeps: %+v", i-1, reps)
		}
		reps = append(reps, r.sweep(nil, nil, time.Duration(i)*time.Second, nil))
	}
	if row, err := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key); err != nil || row != nil {
		t.Fatalf("row after the reclaim: %+v (%v)", row, err)
	}
	last := reps[len(reps)-1]
	if last.Swept.DeferredReclaimed != 1 {
		t.Fatalf("the last sweep %+v; want the deferred reclaim done", last.Swept)
	}
}

// reaperR19: a run cancelled a second after its start leaves the thread's sandbox to the
// idle stop (no reclaim), and the thread's next run resumes that very sandbox.
func reaperR19(t *testing.T, r *rig) {
	runID, res := r.detachedRun("rp-early-resumed", printDeltas("1")+waitGate("never"))
	psid := res.Sandbox.ProviderSandboxID
	t.Cleanup(func() { _ = journal.KillAgent(context.Background(), r.ex, psid, rigJournalDir, runID) })
	if _, err := r.k.Cancel(r.ctx, runID); err != nil {
		t.Fatal(err)
	}
	e, _ := r.sweepFor(rigTenant, runID, 0, nil)
	if e.Outcome != reaper.Expired || e.Status != "aborted" || e.Sandbox != reaper.SandboxKept || e.Kept != reaper.KeptIdleStop {
		t.Fatalf("entry = %+v; want expired, aborted, its sandbox kept for the thread", e)
	}
	next := r.id("rp-next")
	res2 := r.start(next, runID+"-t")
	if res2.Sandbox.ProviderSandboxID != psid || res2.Outcome != keeper.OutcomeResumed {
		t.Fatalf("the next run got %+v (%s); want the thread's sandbox resumed", res2.Sandbox, res2.Outcome)
	}
	row, err := r.b.Instances().GetRow(r.ctx, res.Sandbox.Key)
	if err != nil || row == nil || row.ReclaimDue != 0 || row.Reclaiming != "" {
		t.Fatalf("row after the resume: %+v (%v); want no reclaim", row, err)
	}
	for i := 6; i < 12; i++ { // within the next run's driver lease
		r.sweep(nil, nil, time.Duration(i)*time.Second, nil)
	}
	if r.status(psid) != contract.SandboxAlive {
		t.Fatal("the sandbox a resumed run uses was destroyed or stopped")
	}
	if st := r.state(next); st.Status != contract.StatusRunning {
		t.Fatalf("the next run is %s", st.Status)
	}
}
