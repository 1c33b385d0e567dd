package reaper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

const dir = "sandkeep-journal"

type world struct {
	t    *testing.T
	ctx  context.Context
	b    contract.Backend
	prov contract.Provider
	k    *keeper.Keeper
	n    atomic.Int64
}

func newWorld(t *testing.T, b contract.Backend, prov contract.Provider) *world {
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{prov}})
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, ctx: contract.WithTenant(t.Context(), "acme"), b: b, prov: prov, k: k}
}

func (w *world) id(p string) string { return fmt.Sprintf("%s-%d", p, w.n.Add(1)) }

func (w *world) start(runID, thread string) keeper.StartResult {
	w.t.Helper()
	res, err := w.k.Start(w.ctx, keeper.StartInput{RunID: runID, ThreadID: thread, Sandbox: keeper.Setup{ID: "a", Provider: w.prov.Name()}})
	if err != nil {
		w.t.Fatalf("start: %v", err)
	}
	return res
}

func (w *world) launch(res keeper.StartResult, runID, agent string) {
	w.t.Helper()
	if _, err := journal.Launch(w.ctx, w.prov.(contract.Executor), res.Sandbox.ProviderSandboxID, dir, runID, agent); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = w.prov.Destroy(context.Background(), res.Sandbox.ProviderSandboxID) })
}

func (w *world) detach(res keeper.StartResult, runID string) {
	w.t.Helper()
	if _, err := w.k.DetachWithKey(w.ctx, runID, res.Driver.Epoch, res.Sandbox.Key); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) wait(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *world) probe(res keeper.StartResult, runID string, want journal.ProbeState) {
	w.t.Helper()
	w.wait("probe "+string(want), func() bool {
		return journal.Probe(w.ctx, w.prov.(contract.Executor), res.Sandbox.ProviderSandboxID, dir, runID).State == want
	})
}

// reapCfg is a sweep's configuration: the reaper's, and that of the keeper it works
// through (K: the world's backend and provider, the sweep's clock and logger).
type reapCfg struct {
	reaper.Config
	K keeper.Config
}

// reapConfig is the world's sweep configuration, the clock shifted by shift.
func (w *world) reapConfig(shift time.Duration, logw io.Writer, mod func(*reapCfg)) reapCfg {
	w.t.Helper()
	if logw == nil {
		logw = io.Discard
	}
	cfg := reapCfg{Config: reaper.Config{DetachedRunTTL: time.Hour, JournalDir: dir},
		K: keeper.Config{Backend: w.b, Providers: []contract.Provider{w.prov},
			Now: func() time.Time { return time.Now().Add(shift) }, Logger: slog.New(slog.NewJSONHandler(logw, nil))}}
	if mod != nil {
		mod(&cfg)
	}
	k, err := keeper.New(cfg.K)
	if err != nil {
		w.t.Fatal(err)
	}
	cfg.Keeper = k
	return cfg
}

func (w *world) reaper(shift time.Duration, logw io.Writer, mod func(*reapCfg)) *reaper.Reaper {
	w.t.Helper()
	r, err := reaper.New(w.reapConfig(shift, logw, mod).Config)
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

func TestNewRequiresTTL(t *testing.T) {
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{localprocess.New(t.TempDir())}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = reaper.New(reaper.Config{Keeper: k})
	if err == nil || !strings.Contains(err.Error(), "TTL") {
		t.Fatalf("New without TTL: %v", err)
	}
}

// TestReportJSONShape pins the report's keys: every outcome always present.
func TestReportJSONShape(t *testing.T) {
	w := newWorld(t, memstore.New(), localprocess.New(t.TempDir()))
	var logs bytes.Buffer
	var metrics bytes.Buffer
	rep, err := w.reaper(0, &logs, func(c *reapCfg) { c.Metrics = emf.New(&metrics) }).Sweep(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rep)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(b, &m)
	for _, k := range []string{"considered", "probed", "outcomes", "runs", "swept", "lifecycle"} {
		if _, ok := m[k]; !ok {
			t.Errorf("report lacks %q: %s", k, b)
		}
	}
	var outs map[string]int
	_ = json.Unmarshal(m["outcomes"], &outs)
	if len(outs) != 8 || string(m["runs"]) != "[]" {
		t.Fatalf("outcomes %v, runs %s", outs, m["runs"])
	}
	for _, o := range []string{"finalized", "expired", "producing", "reshipped", "unknown", "budget-exceeded", "not-claimed", "failed"} {
		if _, ok := outs[o]; !ok {
			t.Errorf("outcome %q missing", o)
		}
	}
	var boxes map[string]int
	if err := json.Unmarshal(m["sandboxes"], &boxes); err != nil || len(boxes) != 3 {
		t.Errorf("sandboxes %s: want reclaimed, kept and reclaim-failed", m["sandboxes"])
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), `"report":{"considered":0`) {
		t.Fatalf("want one JSON report line, got %d: %s", n, logs.String())
	}
	// 10 ReapOutcome lines, IdleRunningSandboxes, and SandboxLifecycle per action (3).
	if strings.Count(metrics.String(), "\n") != 14 || !strings.Contains(metrics.String(), `"Outcome":"reclaim-failed"`) ||
		!strings.Contains(metrics.String(), `"IdleRunningSandboxes":0`) || !strings.Contains(metrics.String(), `"Action":"stopped"`) {
		t.Fatalf("metrics: %s", metrics.String())
	}
}

// TestOneSweepAtATime: a sweep finding the lock held gives up with ErrBusy.
func TestOneSweepAtATime(t *testing.T) {
	b := memstore.New()
	w := newWorld(t, b, localprocess.New(t.TempDir()))
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = b.Locks().WithLock(contract.WithTenant(context.Background(), reaper.SystemTenant), reaper.SweepLockKey, func(context.Context) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	_, err := w.reaper(0, nil, func(c *reapCfg) { c.LockWait = 50 * time.Millisecond }).Sweep(w.ctx)
	close(release)
	if !errors.Is(err, reaper.ErrBusy) {
		t.Fatalf("sweep beside a held lock: %v", err)
	}
}

// panicky panics in Status: a sweep never panics.
type panicky struct{ *localprocess.Provider }

func (panicky) Status(context.Context, string) (contract.SandboxStatus, error) { panic("boom") }

func TestSweepNeverPanics(t *testing.T) {
	lp := localprocess.New(t.TempDir())
	w := newWorld(t, memstore.New(), panicky{lp})
	runID := w.id("p")
	res := w.start(runID, runID)
	w.launch(res, runID, "printf '{}\\n'")
	w.detach(res, runID)
	_, err := w.reaper(10*time.Minute, nil, nil).Sweep(w.ctx)
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a panicking provider: %v", err)
	}
}

func TestForceFinish(t *testing.T) {
	w := newWorld(t, memstore.New(), localprocess.New(t.TempDir()))
	runID := w.id("force")
	res := w.start(runID, runID)
	w.launch(res, runID, "printf '{\"a\":1}\\n'; sleep 30")
	w.wait("the agent's pid", func() bool {
		_, found, _ := journal.PID(w.ctx, w.prov.(contract.Executor), res.Sandbox.ProviderSandboxID, dir, runID)
		return found
	})
	e, err := reaper.ForceFinish(w.ctx, w.reapConfig(10*time.Minute, nil, nil).Keeper, dir, runID)
	if err != nil || e.Status != "aborted" {
		t.Fatalf("force finish: %+v, %v", e, err)
	}
	rec, _ := w.k.Get(w.ctx, runID)
	if rec.Status != contract.StatusAborted || rec.Error == nil || rec.Error.Code != "forced" || rec.Epoch() != 2 {
		t.Fatalf("record = %+v", rec)
	}
	if _, err := w.k.Append(w.ctx, runID, res.Driver.Cursor, []contract.Event{{Data: json.RawMessage(`1`)}}); !errors.Is(err, contract.ErrSuperseded) && !errors.Is(err, contract.ErrLogClosed) {
		t.Fatalf("the old driver's append after force finish: %v", err)
	}
	if _, err := reaper.ForceFinish(w.ctx, w.reapConfig(0, nil, nil).Keeper, dir, runID); !errors.Is(err, contract.ErrTerminalRun) {
		t.Fatalf("second force finish: %v", err)
	}
}

// TestMixedPopulationReport sweeps one population holding every kind of candidate and
// housekeeping item (buildPopulation), and logs the report (the figure in the report).
func TestMixedPopulationReport(t *testing.T) {
	w := newWorld(t, memstore.New(), localprocess.New(t.TempDir()))
	p := buildPopulation(t, w)
	var logs bytes.Buffer
	rep, err := w.reaper(10*time.Minute, &logs, nil).Sweep(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s", strings.TrimSpace(logs.String()))
	o := rep.Outcomes
	// The live run of the shared thread has no heartbeating driver here: at +10 min its lease
	// lapsed, so it is detached since its leaseUntil and probed (no journal: unknown).
	if o.Finalized != 1 || o.Producing != 1 || o.Expired != 3 || o.Unknown != 1 || rep.Sandboxes.Kept != 4 || rep.Sandboxes.Reclaimed != 0 ||
		rep.Considered != 6 || rep.Probed != 3 || rep.Swept.Lapsed != 1 {
		t.Fatalf("outcomes %+v considered %d probed %d", o, rep.Considered, rep.Probed)
	}
	if rep.Swept.OrphansDestroyed != 1 || rep.Swept.IdleReclaimed != 1 || rep.Swept.PendingReclaims != 1 || rep.Swept.JournalSandboxes != 4 {
		t.Fatalf("swept %+v", rep.Swept)
	}
	for _, id := range []string{p.orphan, p.idle, p.pending} {
		if w.alive(id) {
			t.Errorf("sandbox %s survived; want gone", id)
		}
	}
	// Ended runs' sandboxes stay for their threads (docs/design.md §5).
	for _, id := range []string{p.finBox, p.expBox} {
		if !w.alive(id) {
			t.Errorf("sandbox %s was destroyed; want it kept for its thread", id)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// dynamoWorld is a world on a fresh DynamoDB table with a call counter.
func dynamoWorld(t *testing.T, prov contract.Provider) (*world, *dynamotest.Counter) {
	return dynamoWorldLocks(t, prov, contract.LockTiming{})
}

// dynamoWorldLocks is dynamoWorld with the locks' timing (zero fields: the defaults).
func dynamoWorldLocks(t *testing.T, prov contract.Provider, locks contract.LockTiming) (*world, *dynamotest.Counter) {
	c := dynamotest.NewCounter()
	client := dynamotest.Client(t, c.Attach)
	store := dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client), Lock: locks})
	return newWorld(t, store, prov), c
}

func writes(c *dynamotest.Counter) int {
	return c.Calls("PutItem") + c.Calls("UpdateItem") + c.Calls("DeleteItem") + c.Calls("BatchWriteItem") + c.Calls("TransactWriteItems")
}

// TestDynamoProducingRunGetsZeroWrites: a sweep over a still-producing detached run issues
// exactly the writes of a sweep over nothing (the sweep lock's), and the run is untouched.
func TestDynamoProducingRunGetsZeroWrites(t *testing.T) {
	w, c := dynamoWorld(t, localprocess.New(t.TempDir()))
	rp := w.reaper(10*time.Minute, nil, nil)
	c.Reset()
	if _, err := rp.Sweep(w.ctx); err != nil {
		t.Fatal(err)
	}
	baseline := writes(c)

	runID := w.id("producing")
	res := w.start(runID, runID)
	w.launch(res, runID, `printf '{"d":1}\n'; sleep 30`)
	w.detach(res, runID)
	w.probe(res, runID, journal.Producing)
	before, _ := w.b.Runs().State(w.ctx, runID)
	// The first sweep also resolves the start's leftover resolve intent (its own lock and
	// drop); the second sees the producing run alone.
	for range 2 {
		c.Reset()
		if rep, err := rp.Sweep(w.ctx); err != nil || rep.Outcomes.Producing != 1 {
			t.Fatalf("sweep: %+v, %v", rep, err)
		}
	}
	rep := reaper.Report{Outcomes: reaper.Outcomes{Producing: 1}}
	got := writes(c)
	after, _ := w.b.Runs().State(w.ctx, runID)
	if rep.Outcomes.Producing != 1 || got != baseline || c.Calls("PutItem")+c.Calls("DeleteItem") != 0 {
		t.Fatalf("producing sweep: %d writes (%v), baseline %d, report %+v", got, c.Snapshot(), baseline, rep)
	}
	if before.Epoch() != 1 || after.Epoch() != 1 || after.LeaseUntil != before.LeaseUntil || *after.DetachedSince != *before.DetachedSince {
		t.Fatalf("run changed: %+v -> %+v", before, after)
	}
	t.Logf("sweep writes: baseline %d, with a producing run %d (calls %v)", baseline, got, c.Snapshot())
}

// fastProvider is an in-memory provider with a shell that answers instantly and holds no
// journal: reaping measures DynamoDB calls, not process spawns.
type fastProvider struct {
	mu   sync.Mutex
	live map[string]bool
	n    int
}

func (p *fastProvider) Name() string { return "fast" }
func (p *fastProvider) Create(_ context.Context, in contract.CreateInput) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	id := in.Name + "." + strconv.Itoa(p.n)
	p.live[id] = true
	return id, nil
}
func (p *fastProvider) Resume(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.live[id] {
		return contract.ErrSandboxGone
	}
	return nil
}
func (p *fastProvider) Destroy(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.live, id)
	return nil
}
func (p *fastProvider) Status(_ context.Context, id string) (contract.SandboxStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[id] {
		return contract.SandboxAlive, nil
	}
	return contract.SandboxGone, nil
}
func (p *fastProvider) Exec(context.Context, string, string) (contract.ExecResult, error) {
	return contract.ExecResult{}, nil
}
func (p *fastProvider) Start(context.Context, string, string) (int, error) { return 2, nil }
func (p *fastProvider) Kill(context.Context, string, int) error            { return nil }

// TestDynamoCallsPerReapedRun reaps N expired detached runs with repeated sweeps until
// drained and reports DynamoDB calls per reaped run (N = SANDKEEP_REAP_RUNS, default 200).
func TestDynamoCallsPerReapedRun(t *testing.T) {
	n := 200
	if v, err := strconv.Atoi(os.Getenv("SANDKEEP_REAP_RUNS")); err == nil && v > 0 {
		n = v
	}
	fp := &fastProvider{live: map[string]bool{}}
	// The sweep lock's lease outlasts any sweep, so its UpdateItems are its acquire and
	// release alone: a renewal, which a slow machine's sweep of 200 runs can need under
	// the default 5 s renew period, would add one to the exact count below.
	w, c := dynamoWorldLocks(t, fp, contract.LockTiming{Lease: 10 * time.Minute, Renew: 5 * time.Minute})
	c.Pause()
	for i := range n {
		runID := fmt.Sprintf("bulk-%05d", i)
		res := w.start(runID, runID)
		w.detach(res, runID)
	}
	// Start leaves its resolve intent open (resolved by the reaper's intent sweep at ~5
	// calls each); drop them here so the figure is the reaping alone.
	for i := range n {
		key, err := contract.SandboxKey(contract.KeyInput{ThreadID: fmt.Sprintf("bulk-%05d", i), SetupID: "a", Provider: fp.Name(), Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		if in, err := w.b.Intents().Get(w.ctx, key); err == nil && in != nil {
			_ = w.b.Intents().Drop(w.ctx, key, in.Token)
		}
	}
	// The figure is the reaping alone: the idle stop (its own sweep, deferring each
	// just-ended run's sandbox by one write) is off here.
	rp := w.reaper(2*time.Hour, nil, func(c *reapCfg) { c.IdleStop = -1 })
	c.Reset()
	reaped, sweeps := 0, 0
	t0 := time.Now()
	for reaped < n && sweeps < n {
		rep, err := rp.Sweep(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		sweeps++
		if rep.Outcomes.Expired == 0 {
			t.Fatalf("sweep %d reaped nothing: %+v", sweeps, rep)
		}
		reaped += rep.Outcomes.Expired
	}
	// Each thread's sandbox stays for its next run (the idle stop stops it later).
	if reaped != n || len(fp.live) != n {
		t.Fatalf("reaped %d of %d, %d sandboxes left (want every thread's kept)", reaped, n, len(fp.live))
	}
	per := float64(c.Total()) / float64(n)
	t.Logf("reaped %d runs in %d sweeps (%v): %d DynamoDB calls, %.2f per run; per op %v; scanned %d",
		n, sweeps, time.Since(t0).Round(time.Millisecond), c.Total(), per, c.Snapshot(), c.Scanned())
	if per > 20 {
		t.Fatalf("%.2f calls per reaped run; budget 20", per)
	}
	// Per reaped run: GetItem ×2 (re-read, row: read once), PutItem ×2 (fence, close),
	// UpdateItem ×2 (claim, terminal write carrying cancelRequested) plus the sweep lock's
	// acquire and release; no reclaim (the thread keeps its sandbox, docs/design.md §5).
	// Exact: a second row read or a separate cancelRequested write (GetItem + PutItem)
	// shows here.
	if c.Calls("GetItem") != 2*n || c.Calls("PutItem") != 2*n || c.Calls("DeleteItem") != 0 ||
		c.Calls("UpdateItem") != 2*n+2*sweeps {
		t.Fatalf("calls %v for %d runs in %d sweeps; want GetItem %d, PutItem %d, DeleteItem 0, UpdateItem %d",
			c.Snapshot(), n, sweeps, 2*n, 2*n, 2*n+2*sweeps)
	}
}
