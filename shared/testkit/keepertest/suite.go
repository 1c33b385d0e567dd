// Package keepertest proves shared/ops/keeper's operations on any backend: RunOpsSuite runs
// every proof of docs/design.md §4/§11 (64 concurrent starts, stale lock holders, crashes between
// create and row write, lost responses, takeover, cancel, finish, max age) against a fresh
// backend from a testkit.NewBackend factory, with a counting provider (shared/providers/counting)
// and a fault-injecting backend wrapper. memstore runs it in shared/ops/keeper; dynamostore reruns
// it unchanged.
package keepertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

// Options mirror testkit.Options (convertible: keepertest.Options(o)), so this package does
// not depend on the conformance kit's build.
type Options struct {
	Lock        contract.LockTiming
	DriverLease time.Duration
}

// NewBackend returns a fresh, isolated backend for one case.
type NewBackend func(t *testing.T, o Options) contract.Backend

// RenewStaller mirrors testkit.RenewStaller: a lock store, wrapped at a seam by the test
// (memstoretest.New, dynamotest.NewStallable), that can stall a key's renewals.
type RenewStaller interface {
	// StallRenewals keeps key's renewals from reaching the store until resume is called.
	StallRenewals(key string) (resume func())
}

// wait bounds every wait on a signal; reaching it means a hang, never a timing assumption.
const wait = 20 * time.Second

// ProviderName is the counting provider's name in every case.
const ProviderName = "counting"

// tenant of every case.
const tenant = "tenant-a"

// RunOpsSuite runs every proof of the operations against fresh backends from nb.
func RunOpsSuite(t *testing.T, nb NewBackend) {
	cases := []struct {
		name string
		run  func(t *testing.T, nb NewBackend)
	}{
		{"StartCreatesThenResumes", startCreatesThenResumes},
		{"StartValidates", startValidates},
		{"StartClampsStartedAt", startClampsStartedAt},
		{"Concurrent64StartsOneCreate", concurrent64},
		{"StaleHolderLeaseLostMidCreate", staleHolderLeaseLost},
		{"LeaseLostBeforeRowWriteKeepsSandbox", leaseLostBeforeWrite},
		{"RowWriteLostToAnotherWriter", rowWriteBackstop},
		{"CrashBetweenCreateAndRowWrite", crashLeavesIntent},
		{"CrashBeforeIntentRecordedUsesLookup", crashIntentLookup},
		{"OrphanIntentBesideLiveRowIsDestroyed", orphanIntent},
		{"LostResponsesOnEveryConditionalWrite", lostResponses},
		{"RetriedStartTakesOver", retriedStartTakesOver},
		{"RetriedStartsWhileCreatingNeverGone", retriedStartsWhileCreating},
		{"RetriedStartOutwaitedIsUnavailable", retriedStartOutwaited},
		{"RetriedStartFinishesALapsedFirstStart", retriedStartLapsed},
		{"AttachSupersedesOldCursor", attachSupersedes},
		{"AttachSandboxGone", attachSandboxGone},
		{"CancelSeenInNextAppend", cancelSeen},
		{"FinishClosesLog", finishCloses},
		{"ReadLongPolls", readLongPolls},
		{"MaxAgeReclaimsUnlessInUse", maxAge},
		{"PendingReclaimFinishedFirst", pendingReclaim},
		{"GoneSandboxRestoresOrCreates", goneRestoresOrCreates},
		{"TransientResumeFailsWithoutCreate", transientResume},
		{"SnapshotFencedAndUnsupported", snapshotFenced},
		{"SupersededSnapshotsAreDeleted", snapshotsSuperseded},
		{"SecretsInjectedNeverStored", secrets},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, nb) })
	}
}

// --- harness --------------------------------------------------------------------------

// clock is the keeper's settable wall clock, read in epoch milliseconds too.
type clock struct{ *manualclock.Clock }

// Ms returns the current fake time in epoch milliseconds.
func (c clock) Ms() int64 { return c.Now().UnixMilli() }

// syncBuffer collects the keeper's log lines.
type syncBuffer = syncbuf.Buffer

type env struct {
	t     *testing.T
	ctx   context.Context
	fb    *storetest.FaultBackend
	prov  *counting.Provider
	k     *keeper.Keeper
	clock clock
	logs  *syncBuffer
}

func newEnv(t *testing.T, nb NewBackend, o Options, wrap ...func(contract.Provider) contract.Provider) *env {
	t.Helper()
	e := &env{
		t:     t,
		ctx:   contract.WithTenant(t.Context(), tenant),
		fb:    storetest.NewFaultBackend(nb(t, o)),
		prov:  counting.New(ProviderName),
		clock: clock{manualclock.New()},
		logs:  &syncBuffer{},
	}
	e.clock.Set(time.Now().Truncate(time.Millisecond))
	var p contract.Provider = e.prov
	for _, w := range wrap {
		p = w(p)
	}
	k, err := keeper.New(keeper.Config{
		Backend:   e.fb,
		Providers: []contract.Provider{p},
		Now:       e.clock.Now,
		Logger:    slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("keeper.New: %v", err)
	}
	e.k = k
	return e
}

func setup(id string) keeper.Setup {
	return keeper.Setup{ID: id, Provider: ProviderName}
}

func startIn(runID, threadID string) keeper.StartInput {
	return keeper.StartInput{RunID: runID, ThreadID: threadID, Sandbox: setup("setup-1")}
}

// keyOf is the sandbox key Start derives for in (tenant of the case).
func keyOf(t *testing.T, in keeper.StartInput) string {
	t.Helper()
	ki := contract.KeyInput{ThreadID: in.ThreadID, SetupID: in.Sandbox.ID, Provider: in.Sandbox.Provider, Tenant: tenant}
	if len(in.Sandbox.Workspace) > 0 {
		ki.Workspace = in.Sandbox.Workspace
	}
	if in.Sandbox.Reuse == keeper.ReuseNone {
		ki.RunID = in.RunID
	}
	key, err := contract.SandboxKey(ki)
	if err != nil {
		t.Fatalf("SandboxKey: %v", err)
	}
	return key
}

func (e *env) start(in keeper.StartInput) keeper.StartResult {
	e.t.Helper()
	res, err := e.k.Start(e.ctx, in)
	if err != nil {
		e.t.Fatalf("Start(%s): %v", in.RunID, err)
	}
	return res
}

func (e *env) state(runID string) contract.RunState {
	e.t.Helper()
	st, err := e.fb.Inner().Runs().State(e.ctx, runID)
	if err != nil || st == nil {
		e.t.Fatalf("State(%s) = %v, %v", runID, st, err)
	}
	return *st
}

func (e *env) row(key string) *contract.InstanceRow {
	e.t.Helper()
	row, err := e.fb.Inner().Instances().GetRow(e.ctx, key)
	if err != nil {
		e.t.Fatalf("GetRow: %v", err)
	}
	return row
}

// intentSettled asserts no intent is open for key: none is left, or the one left records
// the sandbox the row names (a clean create leaves its intent for the next locked start or
// the reaper to drop, saving a call on the request path — docs/design.md §11's created-start budget).
func (e *env) intentSettled(t *testing.T, key string) {
	t.Helper()
	in := e.intent(key)
	if in == nil {
		return
	}
	row := e.row(key)
	if row == nil || in.ProviderSandboxID == "" || row.ProviderSandboxID != in.ProviderSandboxID {
		t.Fatalf("open intent left: %+v (row %+v)", in, row)
	}
}

func (e *env) intent(key string) *contract.Intent {
	e.t.Helper()
	in, err := e.fb.Inner().Intents().Get(e.ctx, key)
	if err != nil {
		e.t.Fatalf("Intents.Get: %v", err)
	}
	return in
}

func (e *env) append(runID string, at contract.Cursor, data ...string) contract.AppendResult {
	e.t.Helper()
	res, err := e.k.Append(e.ctx, runID, at, events(data...))
	if err != nil {
		e.t.Fatalf("Append(%s at %+v): %v", runID, at, err)
	}
	return res
}

// readAll reads the whole log of runID from the start.
func (e *env) readAll(runID string) (evs []contract.Event, closed bool) {
	e.t.Helper()
	after := int64(0)
	for range 1000 {
		page, err := e.k.Read(e.ctx, runID, after, 100, 0)
		if err != nil {
			e.t.Fatalf("Read(%s): %v", runID, err)
		}
		evs = append(evs, page.Events...)
		if page.Closed || len(page.Events) == 0 {
			return evs, page.Closed
		}
		after = page.Next
	}
	e.t.Fatalf("Read(%s) did not reach the tail", runID)
	return nil, false
}

// totalCalls is the number of counted backend calls so far.
func (e *env) totalCalls() int { return e.fb.TotalCalls() }

func events(data ...string) []contract.Event {
	out := make([]contract.Event, len(data))
	for i, d := range data {
		out[i] = contract.Event{Data: json.RawMessage(d)}
	}
	return out
}

func is(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

func noErr(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eq[T comparable](t *testing.T, got, want T, what string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

// await waits for ch or fails after wait.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// awaitErr is await for goroutines other than the test's: it reports with Errorf.
func awaitErr(t *testing.T, ch <-chan struct{}, what string) {
	select {
	case <-ch:
	case <-time.After(wait):
		t.Errorf("timed out waiting for %s", what)
	}
}

// --- start ---------------------------------------------------------------------------

func startCreatesThenResumes(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in1 := startIn("r1", "th1")
	key := keyOf(t, in1)
	before := e.totalCalls()
	r1 := e.start(in1)
	t.Logf("start, sandbox created: %d backend calls (%d with the lock)", e.totalCalls()-before, e.fb.Calls("Locks.WithLock"))
	eq(t, r1.Outcome, keeper.OutcomeCreated, "first start outcome")
	eq(t, r1.Sandbox.Key, key, "sandbox key")
	eq(t, r1.Driver.Epoch, 1, "epoch")
	eq(t, r1.Driver.Cursor, contract.Cursor{Epoch: 1, Next: 1}, "cursor")
	eq(t, r1.Driver.LeaseMs, contract.DefaultDriverLease, "leaseMs")
	eq(t, r1.Driver.LeaseUntil, e.clock.Ms()+contract.DefaultDriverLease, "leaseUntil")
	eq(t, r1.Run.Status, contract.StatusRunning, "status")
	eq(t, r1.Run.Epoch(), 1, "run epoch")
	psid := r1.Sandbox.ProviderSandboxID
	eq(t, e.state("r1").ProviderSandboxID, psid, "run records its sandbox")
	row := e.row(key)
	if row == nil || row.ProviderSandboxID != psid || row.LatestRunID != "r1" || row.ThreadID != "th1" {
		t.Fatalf("row after create: %+v", row)
	}
	e.intentSettled(t, key)

	before = e.totalCalls()
	r2 := e.start(startIn("r2", "th1"))
	calls := e.totalCalls() - before
	eq(t, r2.Outcome, keeper.OutcomeResumed, "second start outcome")
	eq(t, r2.Sandbox.ProviderSandboxID, psid, "second start resumes the same sandbox")
	eq(t, calls, 3, "backend calls of a resumed start (create-claimed ∥ row read, touch)")
	eq(t, e.row(key).LatestRunID, "r2", "touch moved latestRunId")
	eq(t, e.prov.Counts().Creates, 1, "creates")

	none := startIn("r3", "th1")
	none.Sandbox.Reuse = keeper.ReuseNone
	r3 := e.start(none)
	eq(t, r3.Outcome, keeper.OutcomeCreated, "reuse none creates")
	if r3.Sandbox.Key == key || r3.Sandbox.ProviderSandboxID == psid {
		t.Fatalf("reuse none shared the thread's sandbox: %+v", r3.Sandbox)
	}
	eq(t, r3.Sandbox.Key, keyOf(t, none), "reuse none key has the run id")
	eq(t, e.prov.Counts().Destroys, 0, "destroys")
}

func startValidates(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	bad := []keeper.StartInput{
		{RunID: "", ThreadID: "th", Sandbox: setup("s")},
		{RunID: "r", ThreadID: "", Sandbox: setup("s")},
		{RunID: "r", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: "nope"}},
		{RunID: "r", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: ProviderName, Reuse: "sometimes"}},
		{RunID: "r", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: ProviderName, Workspace: json.RawMessage(`{"secrets":[1]}`)}},
		{RunID: "r", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: ProviderName, SnapshotMaxAgeMs: -1}},
	}
	for i, in := range bad {
		_, err := e.k.Start(e.ctx, in)
		is(t, err, contract.ErrInvalid, fmt.Sprintf("bad input %d", i))
	}
	_, err := e.k.Start(contract.WithTenant(e.ctx, "no|pipes"), startIn("r", "th"))
	is(t, err, contract.ErrInvalid, "bad tenant")
	eq(t, e.prov.Counts().Creates, 0, "creates after invalid starts")
	if run, err := e.k.ActiveRun(e.ctx, "th"); err != nil || run != nil {
		t.Fatalf("an invalid start left an active run: %v, %v", run, err)
	}
}

func startClampsStartedAt(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	now := e.clock.Ms()
	for _, c := range []struct {
		runID     string
		startedAt int64
		want      int64
	}{
		{"past", now - 3_600_000, now - 5_000},
		{"future", now + 3_600_000, now + 5_000},
		{"zero", 0, now},
		{"near", now - 1_234, now - 1_234},
	} {
		in := startIn(c.runID, "th")
		in.StartedAt = c.startedAt
		eq(t, e.start(in).Run.StartedAt, c.want, "startedAt of "+c.runID)
	}
}

func concurrent64(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	const n = 64
	// Hold the creator inside Create until every starter has read the (missing) row in
	// step 1, so all 64 contend for the lock: the dangerous path, hit on purpose.
	allRead := make(chan struct{})
	e.fb.Hook("Instances.GetRow", func(_ context.Context, call int) {
		if call == n {
			close(allRead)
		}
	})
	e.prov.BeforeCreate(func(context.Context, int, contract.CreateInput) { awaitErr(t, allRead, "64 step-1 row reads") })
	var (
		wg  sync.WaitGroup
		res [n]keeper.StartResult
		err [n]error
	)
	for i := range n {
		wg.Go(func() { res[i], err[i] = e.k.Start(e.ctx, startIn(fmt.Sprintf("run-%02d", i), "th")) })
	}
	wg.Wait()
	outcomes := map[keeper.Outcome]int{}
	psid := ""
	for i := range n {
		noErr(t, err[i], fmt.Sprintf("start %d", i))
		outcomes[res[i].Outcome]++
		if psid == "" {
			psid = res[i].Sandbox.ProviderSandboxID
		}
		eq(t, res[i].Sandbox.ProviderSandboxID, psid, fmt.Sprintf("sandbox of start %d", i))
		eq(t, res[i].Driver.Epoch, 1, fmt.Sprintf("epoch of start %d", i))
	}
	c := e.prov.Counts()
	locked := e.fb.Calls("Locks.WithLock")
	t.Logf("64 concurrent starts: creates=%d destroys=%d resumes=%d outcomes=%v lock entries=%d", c.Creates, c.Destroys, c.Resumes, outcomes, locked)
	eq(t, c.Creates, 1, "creates")
	eq(t, c.Destroys, 0, "destroys")
	eq(t, outcomes[keeper.OutcomeCreated], 1, "created outcomes")
	if locked < 2 {
		t.Fatalf("only %d starters took the lock: contention was not exercised", locked)
	}
	eq(t, e.row(keyOf(t, startIn("x", "th"))).ProviderSandboxID, psid, "row")
}

func staleHolderLeaseLost(t *testing.T, nb NewBackend) {
	timing := contract.LockTiming{Lease: 600 * time.Millisecond, Renew: 150 * time.Millisecond, Skew: 100 * time.Millisecond}
	e := newEnv(t, nb, Options{Lock: timing})
	staller, ok := e.fb.Inner().Locks().(RenewStaller)
	if !ok {
		t.Skipf("lock store %T does not implement RenewStaller; lease-loss case not run", e.fb.Inner().Locks())
	}
	inA, inB := startIn("run-a", "th"), startIn("run-b", "th")
	key := keyOf(t, inA)
	resume := staller.StallRenewals("sandbox:" + key)
	defer resume()

	aInCreate, bDone := make(chan struct{}), make(chan struct{})
	var (
		mu       sync.Mutex
		aID      string
		aLctxErr error
	)
	e.prov.BeforeCreate(func(ctx context.Context, n int, _ contract.CreateInput) {
		if n != 1 {
			return
		}
		close(aInCreate)
		awaitErr(t, bDone, "B's start") // A is stuck in Create while its lease lapses and B wins
		// A's lease loop cancels ctx from a timer; on a loaded machine B can win before
		// that timer has run, so wait (bounded) for the cancellation itself.
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
		mu.Lock()
		aLctxErr = context.Cause(ctx)
		mu.Unlock()
	})
	e.prov.AfterCreate(func(n int, id string) {
		if n == 1 {
			mu.Lock()
			aID = id
			mu.Unlock()
		}
	})
	var (
		resA keeper.StartResult
		errA error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		resA, errA = e.k.Start(e.ctx, inA)
	}()
	await(t, aInCreate, "A inside Create")
	resB, errB := e.k.Start(e.ctx, inB) // waits out A's lease, then creates
	resume()
	close(bDone)
	await(t, done, "A's start")
	noErr(t, errB, "B's start")
	noErr(t, errA, "A's start (after losing its lease it queues again and resumes the winner's)")
	mu.Lock()
	defer mu.Unlock()
	is(t, aLctxErr, contract.ErrLeaseLost, "A's lock context")
	eq(t, resB.Outcome, keeper.OutcomeCreated, "B outcome")
	b := resB.Sandbox.ProviderSandboxID
	eq(t, resA.Sandbox.ProviderSandboxID, b, "A uses the winner's sandbox")
	eq(t, e.row(key).ProviderSandboxID, b, "row keeps the winner's sandbox")
	eq(t, strings.Join(e.prov.Destroyed(), ","), aID, "A destroyed exactly its own sandbox")
	eq(t, e.prov.Counts().Creates, 2, "creates")
	eq(t, strings.Join(e.prov.Live(), ","), b, "live sandboxes")
	e.intentSettled(t, key)
	eq(t, e.state("run-a").ProviderSandboxID, b, "A's run records the winner's sandbox")
}

func leaseLostBeforeWrite(t *testing.T, nb NewBackend) {
	timing := contract.LockTiming{Lease: 600 * time.Millisecond, Renew: 150 * time.Millisecond, Skew: 100 * time.Millisecond}
	e := newEnv(t, nb, Options{Lock: timing})
	staller, ok := e.fb.Inner().Locks().(RenewStaller)
	if !ok {
		t.Skipf("lock store %T does not implement RenewStaller; lease-loss case not run", e.fb.Inner().Locks())
	}
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	var cause error
	// The holder's lease lapses while it is inside Create; the create completes, so the
	// intent records the sandbox, but the row write must not happen under a lost lease.
	e.prov.BeforeCreate(func(ctx context.Context, n int, _ contract.CreateInput) {
		if n != 1 {
			return
		}
		resume := staller.StallRenewals("sandbox:" + key)
		defer resume()
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(wait):
			t.Errorf("the lease never lapsed")
		}
	})
	res := e.start(in)
	is(t, cause, contract.ErrLeaseLost, "the holder's lock context")
	eq(t, res.Outcome, keeper.OutcomeCreated, "outcome after re-acquiring and adopting its own sandbox")
	eq(t, e.fb.Calls("Locks.WithLock"), 2, "lock acquisitions")
	c := e.prov.Counts()
	eq(t, c.Creates, 1, "creates")
	eq(t, c.Destroys, 0, "destroys")
	eq(t, e.row(key).ProviderSandboxID, res.Sandbox.ProviderSandboxID, "row")
	e.intentSettled(t, key)
}

func rowWriteBackstop(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-a", "th")
	key := keyOf(t, in)
	var foreign string
	// Between A's lease check and its row write, another writer puts a row naming another
	// sandbox: A's conditional write must fail, and A must not overwrite it.
	e.fb.Hook("Instances.CreateRow", func(ctx context.Context, call int) {
		if call != 1 {
			return
		}
		id, err := e.prov.Create(e.ctx, contract.CreateInput{Name: key})
		noErr(t, err, "foreign create")
		foreign = id
		rec := contract.InstanceRecord{Key: key, Provider: ProviderName, ProviderSandboxID: id, ThreadID: "th", UpdatedAt: e.clock.Ms()}
		noErr(t, e.fb.Inner().Instances().CreateRow(e.ctx, rec, "foreign-incarnation"), "foreign row")
	})
	var mine string
	e.prov.AfterCreate(func(n int, id string) {
		if n == 1 {
			mine = id
		}
	})
	res := e.start(in)
	eq(t, res.Sandbox.ProviderSandboxID, foreign, "A uses the winner's sandbox")
	eq(t, res.Outcome, keeper.OutcomeResumed, "A outcome")
	eq(t, e.row(key).ProviderSandboxID, foreign, "row not overwritten")
	eq(t, strings.Join(e.prov.Destroyed(), ","), mine, "A destroyed its own sandbox")
	eq(t, e.fb.Calls("Instances.CreateRow"), 1, "A's refused row writes")
	e.intentSettled(t, key)
}

func crashLeavesIntent(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	cctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var made string
	e.prov.AfterCreate(func(n int, id string) {
		if n == 1 {
			made = id
			cancel() // the host "dies" right after the provider answered
		}
	})
	_, err := e.k.Start(cctx, in)
	is(t, err, context.Canceled, "crashed start")
	it := e.intent(key)
	if it == nil || it.ProviderSandboxID != made {
		t.Fatalf("intent after the crash = %+v, want one recording %s", it, made)
	}
	if e.row(key) != nil {
		t.Fatalf("row written despite the crash")
	}
	st := e.state("run-1")
	if st.Status != contract.StatusFailed || st.Error == nil || st.Error.Code != "start-failed" {
		t.Fatalf("crashed start's run = %+v, want failed/start-failed", st.RunRecord)
	}
	res := e.start(startIn("run-2", "th"))
	eq(t, res.Sandbox.ProviderSandboxID, made, "next start uses the intent's sandbox")
	eq(t, e.prov.Counts().Creates, 1, "creates")
	eq(t, e.prov.Counts().Destroys, 0, "destroys")
	eq(t, e.row(key).ProviderSandboxID, made, "row")
	if e.intent(key) != nil {
		t.Fatalf("intent not dropped after adoption")
	}
}

func crashIntentLookup(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	cctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	e.fb.Fail("Intents.Record", 3) // every attempt to record the id fails
	var made string
	e.prov.AfterCreate(func(n int, id string) {
		if n == 1 {
			made = id
			cancel()
		}
	})
	_, err := e.k.Start(cctx, in)
	is(t, err, context.Canceled, "crashed start")
	if it := e.intent(key); it == nil || it.ProviderSandboxID != "" {
		t.Fatalf("intent = %+v, want one without a recorded id", it)
	}
	res := e.start(startIn("run-2", "th"))
	eq(t, res.Sandbox.ProviderSandboxID, made, "next start finds the sandbox by Lookup")
	if e.prov.Counts().Lookups < 1 {
		t.Fatalf("Lookup was not used")
	}
	eq(t, e.prov.Counts().Creates, 1, "creates")
}

func orphanIntent(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	r1 := e.start(in)
	// A stale holder's leftover: an intent (token 0, below every lock fence) recording a
	// sandbox the row never named, while the row's own sandbox is alive.
	orphan, err := e.prov.Create(e.ctx, contract.CreateInput{Name: key})
	noErr(t, err, "orphan create")
	if left := e.intent(key); left != nil { // r1's settled intent: make room for the orphan's
		noErr(t, e.fb.Inner().Intents().Drop(e.ctx, key, left.Token), "drop settled intent")
	}
	noErr(t, e.fb.Inner().Intents().Put(e.ctx, key, 0, e.clock.Ms()), "put intent")
	noErr(t, e.fb.Inner().Intents().Record(e.ctx, key, 0, orphan), "record intent")
	e.fb.Fail("Instances.GetRow", 3) // step 1's row read fails: the start takes the lock
	r2 := e.start(startIn("run-2", "th"))
	eq(t, r2.Sandbox.ProviderSandboxID, r1.Sandbox.ProviderSandboxID, "the live row wins")
	eq(t, strings.Join(e.prov.Destroyed(), ","), orphan, "the intent's orphan is destroyed")
	eq(t, e.row(key).ProviderSandboxID, r1.Sandbox.ProviderSandboxID, "row unchanged")
	if e.intent(key) != nil {
		t.Fatalf("orphan intent not dropped")
	}
}

func lostResponses(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	e.fb.LoseResponses(true)
	r1 := e.start(in)
	eq(t, r1.Outcome, keeper.OutcomeCreated, "outcome")
	eq(t, r1.Driver.Epoch, 1, "a fresh run keeps epoch 1 despite a lost create response")
	for _, m := range []string{"Runs.CreateClaimed", "Intents.Put", "Intents.Record", "Instances.CreateRow", "Runs.RecordSandbox"} {
		eq(t, e.fb.Lost(m), 1, "lost responses of "+m)
	}
	eq(t, e.prov.Counts().Destroys, 0, "own sandbox never destroyed")
	eq(t, e.row(key).ProviderSandboxID, r1.Sandbox.ProviderSandboxID, "row")
	eq(t, e.state("run-1").Epoch(), 1, "stored epoch")

	e.fb.LoseResponses(true)
	r2 := e.start(startIn("run-2", "th"))
	eq(t, r2.Outcome, keeper.OutcomeResumed, "resumed outcome")
	eq(t, r2.Driver.Epoch, 1, "resumed epoch")
	eq(t, e.fb.Lost("Instances.Touch"), 1, "lost touch responses")

	e.fb.LoseResponses(true)
	at := e.append("run-1", r1.Driver.Cursor, `"a"`, `"b"`)
	eq(t, e.fb.Lost("Log.Append"), 1, "lost append responses")
	evs, _ := e.readAll("run-1")
	eq(t, len(evs), 2, "a retried append stores once")
	_, err := e.k.Heartbeat(e.ctx, "run-1", 1)
	noErr(t, err, "heartbeat")
	_, err = e.k.Detach(e.ctx, "run-1", 1)
	noErr(t, err, "detach")
	ar, err := e.k.Attach(e.ctx, "run-1")
	noErr(t, err, "attach")
	eq(t, e.fb.Lost("Runs.Claim"), 1, "lost claim responses")
	eq(t, e.fb.Lost("Log.Fence"), 1, "lost fence responses")
	eq(t, ar.Driver.Epoch, e.state("run-1").Epoch(), "attach epoch is the stored one")
	_, err = e.k.Append(e.ctx, "run-1", at.Cursor, events(`"stale"`))
	is(t, err, contract.ErrSuperseded, "old cursor after attach")
	at = e.append("run-1", ar.Driver.Cursor, `"c"`)
	_, err = e.k.Cancel(e.ctx, "run-2")
	noErr(t, err, "cancel")
	e.fb.LoseResponses(true)
	rec, err := e.k.Finish(e.ctx, "run-1", at.Cursor, keeper.FinishInput{Status: contract.StatusCompleted})
	noErr(t, err, "finish")
	eq(t, rec.Status, contract.StatusCompleted, "finished status")
	eq(t, e.fb.Lost("Runs.UpdateFenced"), 1, "lost terminal write responses")
	eq(t, e.fb.Lost("Log.Close"), 1, "lost close responses")
	evs, closed := e.readAll("run-1")
	if !closed || len(evs) != 3 {
		t.Fatalf("log after finish: %d events, closed=%v", len(evs), closed)
	}
	eq(t, e.prov.Counts().Destroys, 0, "destroys")
}

// retriedStartsWhileCreating: many starts of one run id while its first start is still
// inside Create. None answers ErrSandboxGone: each waits for the first
// to resolve its sandbox, then takes the run over (or is superseded by another retry).
func retriedStartsWhileCreating(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	const n = 32
	in := startIn("run-1", "th")
	// Hold the creator inside Create until the n-1 retried starts have each read the run
	// (the take-over's read that found no row, or the first read of the wait): the
	// dangerous window, hit on purpose.
	seen := make(chan struct{})
	e.fb.Hook("Runs.State", func(_ context.Context, call int) {
		if call == n-1 {
			close(seen)
		}
	})
	e.prov.BeforeCreate(func(context.Context, int, contract.CreateInput) { awaitErr(t, seen, "the retried starts' reads") })
	var (
		wg  sync.WaitGroup
		res [n]keeper.StartResult
		err [n]error
	)
	for i := range n {
		wg.Go(func() { res[i], err[i] = e.k.Start(e.ctx, in) })
	}
	wg.Wait()
	e.fb.Hook("Runs.State", nil)
	outcomes, refusals := map[keeper.Outcome]int{}, map[string]int{}
	for i := range n {
		switch {
		case err[i] == nil:
			outcomes[res[i].Outcome]++
		case errors.Is(err[i], contract.ErrSandboxGone):
			refusals["sandbox-gone"]++
		case errors.Is(err[i], contract.ErrSuperseded):
			refusals["superseded"]++ // another retry claimed the run after this one
		default:
			t.Errorf("start %d: %v", i, err[i])
		}
	}
	t.Logf("%d concurrent starts of one run: outcomes=%v refusals=%v creates=%d", n, outcomes, refusals, e.prov.Counts().Creates)
	eq(t, refusals["sandbox-gone"], 0, "starts answered sandbox-gone while the sandbox was being created")
	// The first start answers created, or superseded when a retry claimed the run between
	// the row write and the run's record of it; a retry holds the run in the end.
	if outcomes[keeper.OutcomeCreated] > 1 || outcomes[keeper.OutcomeTakenOver] == 0 {
		t.Fatalf("outcomes %v, refusals %v: want at most one created and a taken-over", outcomes, refusals)
	}
	eq(t, e.prov.Counts().Creates, 1, "creates")
}

// retriedStartOutwaited: a retried start whose first start is still creating past
// Config.StartWait answers ErrUnavailable (HTTP 503 with Retry-After), never
// ErrSandboxGone, and leaves the first start's epoch alone.
func retriedStartOutwaited(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	k, err := keeper.New(keeper.Config{Backend: e.fb, Providers: []contract.Provider{e.prov}, Now: e.clock.Now,
		StartWait: 50 * time.Millisecond})
	noErr(t, err, "keeper.New")
	in := startIn("run-1", "th")
	inCreate, release := make(chan struct{}), make(chan struct{})
	e.prov.BeforeCreate(func(context.Context, int, contract.CreateInput) {
		close(inCreate)
		awaitErr(t, release, "the release of the create")
	})
	var (
		first    keeper.StartResult
		firstErr error
		done     = make(chan struct{})
	)
	go func() {
		defer close(done)
		first, firstErr = k.Start(e.ctx, in)
	}()
	await(t, inCreate, "the first start inside Create")
	_, err = k.Start(e.ctx, in)
	is(t, err, keeper.ErrUnavailable, "a retried start while the sandbox is still being created")
	if errors.Is(err, contract.ErrSandboxGone) {
		t.Fatalf("retried start answered sandbox-gone: %v", err)
	}
	eq(t, e.state("run-1").Epoch(), 1, "epoch after the refused retry")
	close(release)
	await(t, done, "the first start")
	noErr(t, firstErr, "the first start")
	eq(t, first.Outcome, keeper.OutcomeCreated, "the first start's outcome")
	r2, err := k.Start(e.ctx, in)
	noErr(t, err, "a retried start once the sandbox is recorded")
	eq(t, r2.Outcome, keeper.OutcomeTakenOver, "the retried start's outcome")
	eq(t, r2.Sandbox.ProviderSandboxID, first.Sandbox.ProviderSandboxID, "the retried start's sandbox")
}

// retriedStartLapsed: the run's first start died before it recorded a sandbox (its
// driver lease lapsed, no row): a retried start resolves the sandbox itself and takes the
// run over, instead of answering sandbox-gone.
func retriedStartLapsed(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	now := e.clock.Ms()
	_, created, err := e.fb.Inner().Runs().CreateClaimed(e.ctx, contract.CreateClaimedRun{
		NewRun:     contract.NewRun{RunID: "run-1", ThreadID: "th", StartedAt: now - 120_000, Status: contract.StatusRunning},
		SandboxKey: keyOf(t, in), LeaseUntil: now - 60_000, Token: "dead-start"})
	noErr(t, err, "the dead first start's run")
	eq(t, created, true, "created")
	r, err := e.k.Start(e.ctx, in)
	noErr(t, err, "a retried start of a run whose first start lapsed")
	eq(t, r.Outcome, keeper.OutcomeTakenOver, "outcome")
	eq(t, r.Driver.Epoch, 2, "epoch")
	eq(t, e.prov.Counts().Creates, 1, "creates")
	eq(t, e.state("run-1").ProviderSandboxID, r.Sandbox.ProviderSandboxID, "recorded sandbox")
	eq(t, e.row(keyOf(t, in)).ProviderSandboxID, r.Sandbox.ProviderSandboxID, "row")
	e.append("run-1", r.Driver.Cursor, `"alive"`)
}

func retriedStartTakesOver(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	r1 := e.start(in)
	ev := events(`"one"`, `"two"`)
	ev[0].Src, ev[1].Src = 10, 20
	a1, err := e.k.Append(e.ctx, "run-1", r1.Driver.Cursor, ev)
	noErr(t, err, "append")
	r2 := e.start(in)
	eq(t, r2.Outcome, keeper.OutcomeTakenOver, "retried start outcome")
	eq(t, r2.Driver.Epoch, 2, "retried start epoch")
	eq(t, r2.Sandbox.ProviderSandboxID, r1.Sandbox.ProviderSandboxID, "same sandbox")
	eq(t, r2.Driver.Src, 20, "highest src")
	if r2.Driver.LastOffset < 2 {
		t.Fatalf("last offset %d, want >= 2", r2.Driver.LastOffset)
	}
	eq(t, e.prov.Counts().Creates, 1, "a retried start never creates again")
	_, err = e.k.Append(e.ctx, "run-1", a1.Cursor, events(`"stale"`))
	is(t, err, contract.ErrSuperseded, "the first driver's cursor")
	a2 := e.append("run-1", r2.Driver.Cursor, `"three"`)

	other := in
	other.ThreadID = "th-other"
	_, err = e.k.Start(e.ctx, other)
	is(t, err, contract.ErrConflict, "same run id, other thread")
	otherSetup := in
	otherSetup.Sandbox = setup("setup-2")
	_, err = e.k.Start(e.ctx, otherSetup)
	is(t, err, contract.ErrConflict, "same run id, other sandbox key")

	_, err = e.k.Finish(e.ctx, "run-1", a2.Cursor, keeper.FinishInput{Status: contract.StatusCompleted})
	noErr(t, err, "finish")
	_, err = e.k.Start(e.ctx, in)
	is(t, err, contract.ErrTerminalRun, "start of a finished run")
	eq(t, e.state("run-1").Status, contract.StatusCompleted, "a terminal run is never revived")
}

// --- attach, heartbeat, detach ----------------------------------------------------------

func attachSupersedes(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	r1 := e.start(startIn("run-1", "th"))
	c1 := e.append("run-1", r1.Driver.Cursor, `"x"`).Cursor
	d, err := e.k.Detach(e.ctx, "run-1", 1)
	noErr(t, err, "detach")
	first := *d.DetachedSince
	e.clock.Add(time.Minute)
	d, err = e.k.Detach(e.ctx, "run-1", 1)
	noErr(t, err, "second detach")
	eq(t, *d.DetachedSince, first, "first detach wins")
	before := e.totalCalls()
	d, err = e.k.DetachWithKey(e.ctx, "run-1", 1, r1.Sandbox.Key)
	noErr(t, err, "detach with key")
	eq(t, *d.DetachedSince, first, "first detach still wins")
	eq(t, e.totalCalls()-before, 1, "backend calls of DetachWithKey")

	ar, err := e.k.Attach(e.ctx, "run-1")
	noErr(t, err, "attach")
	eq(t, ar.Driver.Epoch, 2, "attach epoch")
	if ar.Run.DetachedSince != nil {
		t.Fatalf("attach kept detachedSince")
	}
	eq(t, ar.Sandbox.ProviderSandboxID, r1.Sandbox.ProviderSandboxID, "attach sandbox")
	eq(t, ar.Driver.LeaseUntil, e.clock.Ms()+contract.DefaultDriverLease, "attach lease")

	_, err = e.k.Append(e.ctx, "run-1", c1, events(`"late"`))
	is(t, err, contract.ErrSuperseded, "append with the old cursor")
	_, err = e.k.Heartbeat(e.ctx, "run-1", 1)
	is(t, err, contract.ErrSuperseded, "heartbeat with the old epoch")
	_, err = e.k.Detach(e.ctx, "run-1", 1)
	is(t, err, contract.ErrSuperseded, "detach with the old epoch")
	_, err = e.k.Finish(e.ctx, "run-1", c1, keeper.FinishInput{Status: contract.StatusCompleted})
	is(t, err, contract.ErrSuperseded, "finish with the old cursor")
	if _, closed := e.readAll("run-1"); closed {
		t.Fatalf("a refused finish closed the log")
	}
	eq(t, e.state("run-1").Status, contract.StatusRunning, "status after a refused finish")

	hb, err := e.k.Heartbeat(e.ctx, "run-1", 2)
	noErr(t, err, "heartbeat")
	eq(t, hb.LeaseUntil, e.clock.Ms()+contract.DefaultDriverLease, "heartbeat lease")
	c2 := e.append("run-1", ar.Driver.Cursor, `"y"`).Cursor
	rec, err := e.k.Finish(e.ctx, "run-1", c2, keeper.FinishInput{Status: contract.StatusCompleted})
	noErr(t, err, "finish")
	eq(t, rec.Status, contract.StatusCompleted, "status")

	_, err = e.k.Attach(e.ctx, "run-1")
	is(t, err, contract.ErrTerminalRun, "attach to a finished run")
	_, err = e.k.Attach(e.ctx, "nope")
	is(t, err, contract.ErrUnknownRun, "attach to an unknown run")
	_, err = e.k.Get(e.ctx, "nope")
	is(t, err, contract.ErrUnknownRun, "get unknown")
	got, err := e.k.Get(e.ctx, "run-1")
	noErr(t, err, "get")
	eq(t, got.Status, contract.StatusCompleted, "get status")
	_, err = e.k.Attach(contract.WithTenant(t.Context(), "tenant-b"), "run-1")
	is(t, err, contract.ErrUnknownRun, "attach from another tenant")
}

func attachSandboxGone(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	r1 := e.start(in) // records its sandbox (locked path)
	r2 := e.start(startIn("run-2", "th"))
	eq(t, r2.Outcome, keeper.OutcomeResumed, "fast path")
	eq(t, e.state("run-2").ProviderSandboxID, "", "the fast path records no sandbox id")
	// The row now names another sandbox: run-1's sandbox is gone; run-2 (no recorded
	// id) still finds a live row.
	row := e.row(key)
	rec := row.InstanceRecord
	rec.ProviderSandboxID = "someone-else"
	noErr(t, e.fb.Inner().Instances().ReplaceRow(e.ctx, rec, row.Incarnation, "other-inc"), "replace row")
	_, err := e.k.Attach(e.ctx, "run-1")
	is(t, err, contract.ErrSandboxGone, "attach when the row names another sandbox")
	_, err = e.k.Attach(e.ctx, "run-2")
	noErr(t, err, "attach of a run without a recorded id while the row exists")
	noErr(t, refstore.Instances(e.fb.Inner().Instances()).Delete(e.ctx, key), "delete row")
	_, err = e.k.Attach(e.ctx, "run-2")
	is(t, err, contract.ErrSandboxGone, "attach when the row is missing")
	_ = r1
}

// --- cancel ----------------------------------------------------------------------------

func cancelSeen(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	r := e.start(startIn("run-1", "th"))
	at := e.append("run-1", r.Driver.Cursor, `"a"`)
	if at.CancelRequested {
		t.Fatalf("cancel seen before any cancel")
	}
	rec, err := e.k.CancelThread(e.ctx, "th")
	noErr(t, err, "cancel the thread's active run")
	eq(t, rec.RunID, "run-1", "cancelled run")
	if !rec.Cancelled() {
		t.Fatalf("cancelRequested not set")
	}
	eq(t, rec.Status, contract.StatusRunning, "cancel changes no status")
	at = e.append("run-1", at.Cursor, `"b"`)
	if !at.CancelRequested {
		t.Fatalf("the next append did not see the cancel")
	}
	hb, err := e.k.Heartbeat(e.ctx, "run-1", 1)
	noErr(t, err, "heartbeat")
	if !hb.CancelRequested {
		t.Fatalf("heartbeat did not report the cancel")
	}
	rec, err = e.k.Cancel(e.ctx, "run-1")
	noErr(t, err, "second cancel")
	_, err = e.k.Cancel(e.ctx, "nope")
	is(t, err, contract.ErrUnknownRun, "cancel unknown")
	rec, err = e.k.Finish(e.ctx, "run-1", at.Cursor, keeper.FinishInput{Status: contract.StatusAborted})
	noErr(t, err, "finish aborted")
	rec, err = e.k.Cancel(e.ctx, "run-1")
	noErr(t, err, "cancel of a terminal run")
	eq(t, rec.Status, contract.StatusAborted, "terminal cancel is a no-op")
	_, err = e.k.CancelThread(e.ctx, "th")
	is(t, err, contract.ErrUnknownRun, "cancel an idle thread")

	// A cancel that lands while a new driver attaches is reported by the attach.
	r2 := e.start(startIn("run-2", "th"))
	_, err = e.k.Cancel(e.ctx, "run-2")
	noErr(t, err, "cancel run-2")
	ar, err := e.k.Attach(e.ctx, "run-2")
	noErr(t, err, "attach")
	if !ar.Driver.CancelRequested {
		t.Fatalf("attach did not report the cancel")
	}
	_ = r2
}

// --- log -----------------------------------------------------------------------------

func finishCloses(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	r := e.start(startIn("run-1", "th"))
	at := e.append("run-1", r.Driver.Cursor, `"a"`, `"b"`, `{"c":3}`)
	_, err := e.k.Finish(e.ctx, "run-1", at.Cursor, keeper.FinishInput{Status: contract.StatusRunning})
	is(t, err, contract.ErrInvalid, "finish with running")
	usage := json.RawMessage(`{"tokens":5}`)
	e.clock.Add(time.Second)
	rec, err := e.k.Finish(e.ctx, "run-1", at.Cursor, keeper.FinishInput{
		Status: contract.StatusFailed, Error: &contract.RunError{Message: "boom", Code: "agent"}, Usage: usage})
	noErr(t, err, "finish")
	eq(t, rec.Status, contract.StatusFailed, "status")
	if rec.FinishedAt == nil || *rec.FinishedAt != e.clock.Ms() {
		t.Fatalf("finishedAt = %v, want %d", rec.FinishedAt, e.clock.Ms())
	}
	if rec.Error == nil || rec.Error.Code != "agent" || string(rec.Usage) != string(usage) {
		t.Fatalf("finish record %+v", rec)
	}
	evs, closed := e.readAll("run-1")
	if !closed || len(evs) != 3 {
		t.Fatalf("after finish: %d events, closed=%v", len(evs), closed)
	}
	again, err := e.k.Finish(e.ctx, "run-1", at.Cursor, keeper.FinishInput{Status: contract.StatusFailed})
	noErr(t, err, "retried finish")
	eq(t, again.Status, contract.StatusFailed, "retried finish status")
	_, err = e.k.Append(e.ctx, "run-1", at.Cursor, events(`"late"`))
	if err == nil {
		t.Fatalf("append after finish succeeded")
	}
	if run, err := e.k.ActiveRun(e.ctx, "th"); err != nil || run != nil {
		t.Fatalf("active run after finish: %v %v", run, err)
	}

	// interrupted: a pause — no finishedAt, the log stays open, attach resumes it.
	r2 := e.start(startIn("run-2", "th"))
	at2 := e.append("run-2", r2.Driver.Cursor, `"p"`)
	rec, err = e.k.Finish(e.ctx, "run-2", at2.Cursor, keeper.FinishInput{Status: contract.StatusInterrupted})
	noErr(t, err, "interrupt")
	if rec.Status != contract.StatusInterrupted || rec.FinishedAt != nil {
		t.Fatalf("interrupted record %+v", rec)
	}
	if _, closed := e.readAll("run-2"); closed {
		t.Fatalf("interrupt closed the log")
	}
	ar, err := e.k.Attach(e.ctx, "run-2")
	noErr(t, err, "attach an interrupted run")
	eq(t, ar.Run.Status, contract.StatusRunning, "attach resumes an interrupted run")
}

func readLongPolls(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	r := e.start(startIn("run-1", "th"))
	base := e.fb.Calls("Log.Read")
	reached, appended := make(chan struct{}), make(chan struct{})
	e.fb.Hook("Log.Read", func(ctx context.Context, call int) {
		if call == base+2 { // the first read found nothing; the reader is polling
			close(reached)
			awaitErr(t, appended, "the append")
		}
	})
	var (
		page keeper.ReadResult
		err  error
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		page, err = e.k.Read(e.ctx, "run-1", 0, 10, wait)
	}()
	await(t, reached, "the reader's second poll")
	e.append("run-1", r.Driver.Cursor, `"late"`)
	close(appended)
	await(t, done, "the long poll")
	e.fb.Hook("Log.Read", nil)
	noErr(t, err, "long poll")
	eq(t, len(page.Events), 1, "events after the wait")
	eq(t, e.fb.Calls("Log.Read")-base, 2, "reads of the long poll")

	// A cancelled caller ends the wait with its error.
	cctx, cancel := context.WithCancel(e.ctx)
	e.fb.Hook("Log.Read", func(context.Context, int) { cancel() })
	_, err = e.k.Read(cctx, "run-1", page.Next, 10, wait)
	is(t, err, context.Canceled, "read with a cancelled caller")
	e.fb.Hook("Log.Read", nil)
}

// --- max age, reclaim, gone ---------------------------------------------------------------

func maxAge(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	const hour = int64(3_600_000)
	withAge := func(runID, thread string) keeper.StartInput {
		in := startIn(runID, thread)
		in.Sandbox.SnapshotMaxAgeMs = hour
		return in
	}
	// Not in use: the old sandbox is reclaimed (destroyed), a new one created.
	r1 := e.start(withAge("run-1", "th1"))
	_, err := e.k.Finish(e.ctx, "run-1", r1.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted})
	noErr(t, err, "finish run-1")
	e.clock.Add(2 * time.Hour)
	// A lagging index still lists the finished run (and a run that never existed): the
	// in-use check must re-read each hit and act on none of them.
	e.fb.StaleUsingKey("run-1", "ghost")
	states := e.fb.Calls("Runs.State")
	r2 := e.start(withAge("run-2", "th1"))
	e.fb.StaleUsingKey()
	if got := e.fb.Calls("Runs.State") - states; got < 2 {
		t.Fatalf("the in-use check re-read %d index hits, want >= 2", got)
	}
	eq(t, r2.Outcome, keeper.OutcomeCreated, "expired, unused sandbox is re-created")
	if r2.Sandbox.ProviderSandboxID == r1.Sandbox.ProviderSandboxID {
		t.Fatalf("expired sandbox resumed")
	}
	eq(t, strings.Join(e.prov.Destroyed(), ","), r1.Sandbox.ProviderSandboxID, "the expired sandbox was destroyed")
	eq(t, e.fb.Calls("Instances.MarkReclaiming"), 1, "tombstones written")

	// In use by another non-terminal run: resumed anyway, never destroyed.
	r3 := e.start(withAge("run-3", "th2"))
	e.clock.Add(2 * time.Hour)
	r4 := e.start(withAge("run-4", "th2"))
	eq(t, r4.Outcome, keeper.OutcomeResumed, "expired sandbox in use is resumed")
	eq(t, r4.Sandbox.ProviderSandboxID, r3.Sandbox.ProviderSandboxID, "same sandbox")
	eq(t, len(e.prov.Destroyed()), 1, "no destroy of a sandbox in use")
	if e.fb.Calls("Runs.State") < 1 {
		t.Fatalf("the in-use check did not re-read the index hit")
	}

	// Young enough (within max age): the fast path resumes, no lock.
	locks := e.fb.Calls("Locks.WithLock")
	r5 := e.start(withAge("run-5", "th2"))
	eq(t, r5.Outcome, keeper.OutcomeResumed, "young row")
	eq(t, e.fb.Calls("Locks.WithLock"), locks, "fast path takes no lock")
}

func pendingReclaim(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	r1 := e.start(in)
	old := r1.Sandbox.ProviderSandboxID
	e.clock.Add(2 * time.Hour)
	row := e.row(key)
	noErr(t, e.fb.Inner().Instances().MarkReclaiming(e.ctx, key, old, row.UpdatedAt, e.clock.Ms()-120_000, "reaper-token"), "tombstone")

	e.prov.FailDestroy(func(string) error { return errors.New("provider down") })
	_, err := e.k.Start(e.ctx, startIn("run-2", "th"))
	is(t, err, keeper.ErrUnavailable, "start while the pending destroy fails")
	if row := e.row(key); row == nil || row.Reclaiming != "reaper-token" {
		t.Fatalf("tombstone not kept after a failed destroy: %+v", row)
	}
	eq(t, e.prov.Counts().Creates, 1, "no create while the reclaim is pending")

	e.prov.FailDestroy(nil)
	r3 := e.start(startIn("run-3", "th"))
	eq(t, r3.Outcome, keeper.OutcomeCreated, "after the reclaim, a fresh sandbox")
	if r3.Sandbox.ProviderSandboxID == old || e.prov.Alive(old) {
		t.Fatalf("tombstoned sandbox resumed or not destroyed")
	}
	eq(t, e.row(key).Reclaiming, "", "fresh row")
}

func goneRestoresOrCreates(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	r1 := e.start(in)
	sb, err := e.k.Snapshot(e.ctx, "run-1", r1.Driver.Cursor, "after-setup")
	noErr(t, err, "snapshot")
	eq(t, e.row(key).LatestSnapshotID, sb.LatestSnapshotID, "row records the snapshot")
	e.prov.Kill(r1.Sandbox.ProviderSandboxID)
	r2 := e.start(startIn("run-2", "th"))
	eq(t, r2.Outcome, keeper.OutcomeRestored, "gone sandbox with a snapshot")
	eq(t, r2.Sandbox.LatestSnapshotID, sb.LatestSnapshotID, "the row keeps the snapshot it was restored from")
	eq(t, e.row(key).ProviderSandboxID, r2.Sandbox.ProviderSandboxID, "row names the restored sandbox")
	eq(t, e.state("run-2").ProviderSandboxID, r2.Sandbox.ProviderSandboxID, "run records it")
	eq(t, e.prov.Counts().Restores, 1, "restores")

	// Without Restorer: gone → create, and the snapshot id is cleared.
	e2 := newEnv(t, nb, Options{}, counting.Basic)
	r := e2.start(in)
	e2.prov.Kill(r.Sandbox.ProviderSandboxID)
	r3 := e2.start(startIn("run-3", "th"))
	eq(t, r3.Outcome, keeper.OutcomeCreated, "gone sandbox without restore")
	eq(t, e2.prov.Counts().Creates, 2, "creates")
}

func transientResume(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	r1 := e.start(startIn("run-1", "th"))
	_, err := e.k.Finish(e.ctx, "run-1", r1.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted})
	noErr(t, err, "finish")
	e.prov.FailResume(func(string) error { return errors.New("provider throttled") })
	_, err = e.k.Start(e.ctx, startIn("run-2", "th"))
	is(t, err, keeper.ErrUnavailable, "transient resume")
	eq(t, e.prov.Counts().Creates, 1, "a transient resume error never creates")
	st := e.state("run-2")
	if st.Status != contract.StatusFailed || st.Error == nil || st.Error.Code != "start-failed" {
		t.Fatalf("failed start left run %+v", st.RunRecord)
	}
	if run, err := e.k.ActiveRun(e.ctx, "th"); err != nil || run != nil {
		t.Fatalf("failed start lingers as active: %v %v", run, err)
	}
	evs, closed := e.readAll("run-2")
	if !closed || len(evs) != 0 {
		t.Fatalf("failed start's log: %d events, closed=%v", len(evs), closed)
	}
}

func snapshotFenced(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	r1 := e.start(startIn("run-1", "th"))
	_, err := e.k.Snapshot(e.ctx, "run-1", r1.Driver.Cursor, "")
	noErr(t, err, "snapshot")
	_, err = e.k.Attach(e.ctx, "run-1")
	noErr(t, err, "attach")
	_, err = e.k.Snapshot(e.ctx, "run-1", r1.Driver.Cursor, "")
	is(t, err, contract.ErrSuperseded, "snapshot with the old epoch")
	eq(t, e.prov.Counts().Snapshots, 1, "provider snapshots")
	_, err = e.k.Snapshot(e.ctx, "nope", r1.Driver.Cursor, "")
	is(t, err, contract.ErrUnknownRun, "snapshot unknown")

	e2 := newEnv(t, nb, Options{}, counting.Basic)
	r := e2.start(startIn("run-1", "th"))
	_, err = e2.k.Snapshot(e2.ctx, "run-1", r.Driver.Cursor, "")
	is(t, err, keeper.ErrUnsupported, "snapshot without a Snapshotter")
}

// snapshotsSuperseded: ten snapshots keep one copy, each superseded one deleted through the
// provider by its successor's request; a delete that fails never fails the request, stays
// listed on the row, and a reaper sweep deletes it.
func snapshotsSuperseded(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	in := startIn("run-1", "th")
	key := keyOf(t, in)
	r1 := e.start(in)
	var last keeper.Sandbox
	for i := range 10 {
		sb, err := e.k.Snapshot(e.ctx, "run-1", r1.Driver.Cursor, fmt.Sprint("s", i))
		noErr(t, err, "snapshot")
		last = sb
	}
	eq(t, strings.Join(e.prov.Snaps(), ","), last.LatestSnapshotID, "the snapshots left after ten")
	eq(t, e.prov.Counts().SnapshotDeletes, 9, "provider snapshot deletes")
	eq(t, e.row(key).LatestSnapshotID, last.LatestSnapshotID, "the row's snapshot")
	eq(t, len(e.row(key).StaleSnapshots), 0, "stale snapshots on the row")

	e.prov.FailDeleteSnapshot(func(string) error { return errors.New("provider unavailable") })
	next, err := e.k.Snapshot(e.ctx, "run-1", r1.Driver.Cursor, "s10")
	noErr(t, err, "a snapshot whose predecessor's delete fails")
	eq(t, strings.Join(e.row(key).StaleSnapshots, ","), last.LatestSnapshotID, "the undeleted one listed on the row")
	eq(t, len(e.prov.Snaps()), 2, "snapshots while the delete fails")
	e.prov.FailDeleteSnapshot(nil)

	rk, err := keeper.New(keeper.Config{Backend: e.fb, Providers: []contract.Provider{e.prov},
		Now: e.clock.Now, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	noErr(t, err, "the reaper's keeper")
	rp, err := reaper.New(reaper.Config{Keeper: rk, DetachedRunTTL: time.Hour})
	noErr(t, err, "reaper")
	for i := 0; len(e.row(key).StaleSnapshots) > 0; i++ {
		if i == 10 {
			t.Fatalf("ten sweeps left stale snapshots %v", e.row(key).StaleSnapshots)
		}
		_, err := rp.Sweep(context.WithoutCancel(e.ctx))
		noErr(t, err, "sweep")
	}
	eq(t, strings.Join(e.prov.Snaps(), ","), next.LatestSnapshotID, "the snapshots left after the sweep")
	eq(t, e.row(key).LatestSnapshotID, next.LatestSnapshotID, "the row keeps the latest")

	// A row reclaimed (here: aged past the setup's max age) takes its snapshot with it.
	_, err = e.k.Finish(e.ctx, "run-1", r1.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted})
	noErr(t, err, "finish")
	e.clock.Add(2 * time.Hour)
	aged := startIn("run-2", "th")
	aged.Sandbox.SnapshotMaxAgeMs = 3_600_000
	eq(t, e.start(aged).Outcome, keeper.OutcomeCreated, "an aged row is reclaimed and re-created")
	eq(t, len(e.prov.Snaps()), 0, "snapshots left after the reclaim")
}

func secrets(t *testing.T, nb NewBackend) {
	e := newEnv(t, nb, Options{})
	const secret = "s3cr3t-value-42"
	in := startIn("run-1", "th")
	in.Sandbox.Workspace = json.RawMessage(`{"repo":"r","secrets":{"TOKEN":"` + secret + `"}}`)
	plain := startIn("run-1", "th")
	plain.Sandbox.Workspace = json.RawMessage(`{"repo":"r"}`)
	r1 := e.start(in)
	eq(t, r1.Sandbox.Key, keyOf(t, plain), "secrets do not change the key")
	inputs := e.prov.Inputs()
	eq(t, inputs[0].Env["TOKEN"], secret, "secret injected as env")
	ws, _ := json.Marshal(inputs[0].Workspace)
	if strings.Contains(string(ws), secret) {
		t.Fatalf("the provider's workspace carries the secret: %s", ws)
	}
	in2 := in
	in2.RunID = "run-2"
	e.start(in2)
	eq(t, e.prov.Env(r1.Sandbox.ProviderSandboxID)["TOKEN"], secret, "secret re-injected after resume")
	if strings.Contains(e.logs.String(), secret) {
		t.Fatalf("the secret was logged")
	}
	for _, id := range []string{"run-1", "run-2"} {
		b, _ := json.Marshal(e.state(id))
		if strings.Contains(string(b), secret) {
			t.Fatalf("the secret was stored on %s", id)
		}
	}
	b, _ := json.Marshal(e.row(r1.Sandbox.Key))
	if strings.Contains(string(b), secret) {
		t.Fatalf("the secret was stored on the row")
	}
}
