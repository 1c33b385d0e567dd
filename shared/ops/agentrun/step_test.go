package agentrun_test

// The pump step's exactly-once proofs on both backends (memstore; dynamostore on the local
// DynamoDB): a lost answer, two racing pumpers (with a deliberately broken pump, built here
// at the Log seam, that the race test catches), a successor after takeover, and exited only
// once every line is stored. Plus its budgets: DynamoDB calls per pumped batch (counted on
// dynalite) and provider calls while the agent is silent (counted, never timed).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// backends runs fn on memstore and on dynamostore over dynalite (dynamotest fails under CI
// without it).
func backends(t *testing.T, fn func(t *testing.T, newBackend func() contract.Backend)) {
	t.Run("memstore", func(t *testing.T) { fn(t, func() contract.Backend { return memstore.New() }) })
	t.Run("dynamostore", func(t *testing.T) {
		client := dynamotest.Client(t)
		fn(t, func() contract.Backend {
			return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
		})
	})
}

// numberedLines prints {"n":from}..{"n":to}, one per line.
func numberedLines(from, to int) string {
	return fmt.Sprintf(`i=%d; while [ $i -le %d ]; do printf '{"n":%%d}\n' $i; i=$((i+1)); done; `, from, to)
}

// gateOn blocks the agent until the file name exists in the sandbox.
func gateOn(name string) string { return fmt.Sprintf(`while [ ! -e %s ]; do sleep 0.01; done; `, name) }

// step runs one pump step of res's run at cursor at.
func (e *env) step(res keeper.StartResult, runID string, at contract.Cursor, log agentrun.Log, batch int, wait time.Duration) (agentrun.StepResult, error) {
	if log == nil {
		log = e.K
	}
	return agentrun.Step(e.Ctx, agentrun.StepInput{Log: log, Executor: e.Prov, SandboxID: res.Sandbox.ProviderSandboxID,
		Dir: dir, RunID: runID, At: at, Wait: wait, PollMin: 2 * time.Millisecond, PollMax: 10 * time.Millisecond, BatchEvents: batch})
}

// stepUntilExited steps from at until exited; it returns the last answer.
func (e *env) stepUntilExited(res keeper.StartResult, runID string, at contract.Cursor, log agentrun.Log, batch int) agentrun.StepResult {
	e.T.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, err := e.step(res, runID, at, log, batch, 500*time.Millisecond)
		if err != nil {
			e.T.Fatalf("step at %+v: %v", at, err)
		}
		if r.Exited {
			return r
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("%s never exited", runID)
		}
		at = r.Cursor
	}
}

// numbers returns the "n" of every event in the run's log, in order.
func (e *env) numbers(runID string) []int {
	e.T.Helper()
	rr, err := e.K.Read(e.Ctx, runID, 0, 1000, 0)
	if err != nil {
		e.T.Fatal(err)
	}
	var out []int
	for _, ev := range rr.Events {
		var m struct{ N int }
		if err := json.Unmarshal(ev.Data, &m); err != nil {
			e.T.Fatalf("event %s: %v", ev.Data, err)
		}
		out = append(out, m.N)
	}
	return out
}

// exactlyOnce reports whether got is 1..n in order.
func exactlyOnce(got []int, n int) bool {
	if len(got) != n {
		return false
	}
	for i, v := range got {
		if v != i+1 {
			return false
		}
	}
	return true
}

func (e *env) waitFinished(res keeper.StartResult, runID string) {
	e.T.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for journal.Probe(e.Ctx, e.Prov, res.Sandbox.ProviderSandboxID, dir, runID).State != journal.Finished {
		if time.Now().After(deadline) {
			e.T.Fatal("the agent never finished")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lostAnswer stores the first append, then reports it failed (its answer was lost).
type lostAnswer struct {
	agentrun.Log
	lost atomic.Bool
}

func (l *lostAnswer) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	res, err := l.Log.Append(ctx, runID, at, events)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		return contract.AppendResult{}, errors.New("connection reset (the append landed)")
	}
	return res, err
}

// TestStepExactlyOnceAfterALostAnswer: the append landed, its answer did not; the retried
// step (the same cursor, after the journal grew) stores only the new lines.
func TestStepExactlyOnceAfterALostAnswer(t *testing.T) {
	backends(t, func(t *testing.T, nb func() contract.Backend) {
		e := newEnvOn(t, 0, nb())
		res := e.Start("r-lost", numberedLines(1, 3)+gateOn("g")+numberedLines(4, 6))
		at := res.Driver.Cursor
		lost := &lostAnswer{Log: e.K}
		deadline := time.Now().Add(30 * time.Second)
		for len(e.numbers("r-lost")) < 3 {
			if _, err := e.step(res, "r-lost", at, lost, 0, 50*time.Millisecond); err == nil && !lost.lost.Load() {
				continue
			}
			if time.Now().After(deadline) {
				t.Fatal("lines 1..3 never stored")
			}
		}
		if !lost.lost.Load() {
			t.Fatal("the dangerous path (a stored batch whose answer was lost) was not hit")
		}
		if _, err := e.Prov.Exec(e.Ctx, res.Sandbox.ProviderSandboxID, ": > g"); err != nil {
			t.Fatal(err)
		}
		e.waitFinished(res, "r-lost")
		r := e.stepUntilExited(res, "r-lost", at, nil, 0)
		if got := e.numbers("r-lost"); !exactlyOnce(got, 6) || r.Cursor.Src == 0 {
			t.Fatalf("log %v after the retry (cursor %+v); want 1..6 once", got, r.Cursor)
		}
	})
}

// conflictCounter counts the appends another writer's batch refused (ErrConflict).
type conflictCounter struct {
	agentrun.Log
	n *atomic.Int64
}

func (c conflictCounter) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	res, err := c.Log.Append(ctx, runID, at, events)
	if errors.Is(err, contract.ErrConflict) {
		c.n.Add(1)
	}
	return res, err
}

// barrier holds each pumper's first append until both pumpers read the journal and are
// about to append at one cursor, so one of those appends must meet the other's batch.
type barrier struct {
	agentrun.Log
	arrive *sync.WaitGroup
	once   sync.Once
}

func (b *barrier) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	b.once.Do(func() {
		b.arrive.Done()
		b.arrive.Wait()
	})
	return b.Log.Append(ctx, runID, at, events)
}

// brokenRetry is a deliberately broken pump: on another writer's batch at its cursor it
// moves to the log's tail and stores its own batch there, trusting what it read instead of
// reading on from the Src the log holds. It chases the tail until its batch lands, so every
// race it loses stores lines twice whatever the timing. The race test must catch it.
type brokenRetry struct{ agentrun.Log }

func (b brokenRetry) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	res, err := b.Log.Append(ctx, runID, at, events)
	for range 100 {
		if !errors.Is(err, contract.ErrConflict) {
			return res, err
		}
		f, ferr := b.Log.Fence(ctx, runID, at.Epoch)
		if ferr != nil {
			return res, ferr
		}
		res, err = b.Log.Append(ctx, runID, f.Cursor, events)
	}
	return res, err
}

// racePumpers lets two pumpers of one epoch (batches of 2 and of 3 lines, so their first
// batches differ) race from the same cursor to the agent's exit, their first appends held
// until both are ready; wrap builds each pumper's Log. It returns the log and how many
// appends met the other's batch.
func racePumpers(t *testing.T, nb func() contract.Backend, wrap func(agentrun.Log) agentrun.Log) ([]int, int64) {
	e := newEnvOn(t, 0, nb())
	res := e.Start("r-race", numberedLines(1, 20))
	e.waitFinished(res, "r-race")
	var (
		arrive    sync.WaitGroup
		conflicts atomic.Int64
		wg        sync.WaitGroup
	)
	arrive.Add(2)
	for _, batch := range []int{2, 3} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			log := wrap(conflictCounter{Log: &barrier{Log: e.K, arrive: &arrive}, n: &conflicts})
			at := res.Driver.Cursor
			for range 100 {
				r, err := e.step(res, "r-race", at, log, batch, 0)
				if err != nil {
					t.Errorf("pumper (batch %d): %v", batch, err)
					return
				}
				if r.Exited {
					return
				}
				at = r.Cursor
			}
			t.Errorf("pumper (batch %d) never reached the exit", batch)
		}()
	}
	wg.Wait()
	return e.numbers("r-race"), conflicts.Load()
}

// TestStepRacingPumpersStoreEachLineOnce: two pumpers racing from one cursor store every
// line exactly once; the race provably happened (an append met the other's batch); the
// same race with the broken pump stores lines twice, so the check can fail.
func TestStepRacingPumpersStoreEachLineOnce(t *testing.T) {
	backends(t, func(t *testing.T, nb func() contract.Backend) {
		got, conflicts := racePumpers(t, nb, func(l agentrun.Log) agentrun.Log { return l })
		if !exactlyOnce(got, 20) {
			t.Fatalf("log %v; want 1..20 exactly once", got)
		}
		if conflicts == 0 {
			t.Fatal("no append met the other pumper's batch: the race was not staged")
		}
		broken, bc := racePumpers(t, nb, func(l agentrun.Log) agentrun.Log { return brokenRetry{Log: l} })
		if exactlyOnce(broken, 20) || bc == 0 {
			t.Fatalf("the broken pump stored %v (%d conflicts): the race test would not catch duplicates", broken, bc)
		}
		t.Logf("correct: %d conflicts, log exactly once; broken: %d lines stored for 20", conflicts, len(broken))
	})
}

// TestStepSuccessorAfterTakeover: a successor's step resumes at the log's highest Src; the
// superseded pumper's next step is refused (with lines to store, and with none).
func TestStepSuccessorAfterTakeover(t *testing.T) {
	backends(t, func(t *testing.T, nb func() contract.Backend) {
		e := newEnvOn(t, 0, nb())
		res := e.Start("r-succ", numberedLines(1, 3)+gateOn("g")+numberedLines(4, 6))
		at := res.Driver.Cursor
		deadline := time.Now().Add(30 * time.Second)
		for at.Src == 0 || len(e.numbers("r-succ")) < 3 {
			r, err := e.step(res, "r-succ", at, nil, 0, 50*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			at = r.Cursor
			if time.Now().After(deadline) {
				t.Fatal("lines 1..3 never stored")
			}
		}
		att, err := e.K.Attach(e.Ctx, "r-succ")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.step(res, "r-succ", at, nil, 0, 0); !errors.Is(err, contract.ErrSuperseded) {
			t.Fatalf("the superseded pumper with nothing to store: %v", err)
		}
		if _, err := e.Prov.Exec(e.Ctx, res.Sandbox.ProviderSandboxID, ": > g"); err != nil {
			t.Fatal(err)
		}
		e.waitFinished(res, "r-succ")
		if _, err := e.step(res, "r-succ", at, nil, 0, 0); !errors.Is(err, contract.ErrSuperseded) {
			t.Fatalf("the superseded pumper with lines to store: %v", err)
		}
		e.stepUntilExited(res, "r-succ", att.Driver.Cursor, nil, 0)
		if got := e.numbers("r-succ"); !exactlyOnce(got, 6) {
			t.Fatalf("log %v; want 1..6 once", got)
		}
	})
}

// failLast refuses (transiently) the first append of a batch holding the line of src.
type failLast struct {
	agentrun.Log
	src    int64
	failed atomic.Bool
}

func (f *failLast) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	if events[len(events)-1].Src == f.src && f.failed.CompareAndSwap(false, true) {
		return contract.AppendResult{}, fmt.Errorf("throttled: %w", keeper.ErrUnavailable)
	}
	return f.Log.Append(ctx, runID, at, events)
}

// TestStepExitedOnlyOnceEveryLineIsStored: the journal is complete up to its sentinel, but
// the append of its last batch fails: the step reports the error, not exited; the next one
// stores the last line and only then says exited.
func TestStepExitedOnlyOnceEveryLineIsStored(t *testing.T) {
	backends(t, func(t *testing.T, nb func() contract.Backend) {
		e := newEnvOn(t, 0, nb())
		res := e.Start("r-exit", numberedLines(1, 5)+"exit 4")
		e.waitFinished(res, "r-exit")
		var last int64
		_, _ = agentrun.Pump(e.Ctx, e.Prov, res.Sandbox.ProviderSandboxID, dir, "r-exit", 0, journal.NewTranslator("r-exit"), 100, 1<<20,
			func(b []contract.Event) error { last = b[len(b)-1].Src; return nil }, nil)
		fl := &failLast{Log: e.K, src: last}
		r, err := e.step(res, "r-exit", res.Driver.Cursor, fl, 2, 0)
		if err == nil || r.Exited || !fl.failed.Load() {
			t.Fatalf("step over a failed last append: %+v, %v", r, err)
		}
		if got := e.numbers("r-exit"); len(got) != 4 {
			t.Fatalf("stored %v before the failure; want 1..4", got)
		}
		r, err = e.step(res, "r-exit", r.Cursor, fl, 2, 0)
		if err != nil || !r.Exited || r.ExitCode != 4 || r.Appended != 1 {
			t.Fatalf("second step: %+v, %v", r, err)
		}
		if got := e.numbers("r-exit"); !exactlyOnce(got, 5) {
			t.Fatalf("log %v", got)
		}
	})
}

// countingExec counts provider calls.
type countingExec struct {
	contract.Executor
	n atomic.Int64
}

func (c *countingExec) Exec(ctx context.Context, psid, command string) (contract.ExecResult, error) {
	c.n.Add(1)
	return c.Executor.Exec(ctx, psid, command)
}

// TestStepBudgets counts, on dynalite, the DynamoDB calls of the pump route's step
// (Service.Pump): a cold pump (the run's sandbox resolved), a pumped batch, an idle pump;
// and the provider calls of a pump waiting on a silent agent, bounded by its pacing.
func TestStepBudgets(t *testing.T) {
	counter := dynamotest.NewCounter()
	client := dynamotest.Client(t, counter.Attach)
	e := newEnvOn(t, 0, dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)}))
	res := e.Start("r-budget", numberedLines(1, 10)+gateOn("g1")+numberedLines(11, 30)+gateOn("g2"))
	e.waitFinishedLines(res, "r-budget", 10)
	svc, err := agentrun.NewService(agentrun.ServiceConfig{Keeper: e.K, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	measure := func(what string, budget int, wait time.Duration, at contract.Cursor) agentrun.StepResult {
		t.Helper()
		counter.Reset()
		r, err := svc.Pump(e.Ctx, agentrun.PumpInput{RunID: "r-budget", At: at, Wait: wait})
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%-42s %d DynamoDB calls (budget %d) %v; %d events", what, counter.Total(), budget, counter.Snapshot(), r.Appended)
		if counter.Total() > budget {
			t.Errorf("%s: %d DynamoDB calls, budget %d", what, counter.Total(), budget)
		}
		return r
	}
	r := measure("cold pump, one batch (resolves the sandbox)", 3, 0, res.Driver.Cursor)
	if r.Appended != 10 {
		t.Fatalf("cold pump stored %d", r.Appended)
	}
	if _, err := e.Prov.Exec(e.Ctx, res.Sandbox.ProviderSandboxID, ": > g1"); err != nil {
		t.Fatal(err)
	}
	e.waitFinishedLines(res, "r-budget", 30)
	r = measure("pumped batch (20 events, one item)", 1, 0, r.Cursor)
	if r.Appended != 20 {
		t.Fatalf("pumped %d", r.Appended)
	}
	r = measure("idle pump (nothing new; reads the run)", 1, 0, r.Cursor)

	// A silent agent: one waiting pump's provider calls are bounded by its pacing (20 ms
	// doubling to 200 ms), whatever the timers' lateness (late only means fewer calls).
	ce := &countingExec{Executor: e.Prov}
	wait := 2 * time.Second
	counter.Reset()
	sr, err := agentrun.Step(e.Ctx, agentrun.StepInput{Log: e.K, Executor: ce, SandboxID: res.Sandbox.ProviderSandboxID, Dir: dir,
		RunID: "r-budget", At: r.Cursor, Wait: wait})
	if err != nil || sr.Appended != 0 {
		t.Fatalf("silent wait: %+v, %v", sr, err)
	}
	maxExecs := int64(1 + 4 + wait/agentrun.DefaultPumpPollMax) // 20, 40, 80, 160 ms, then every 200 ms
	t.Logf("silent agent: one %s pump made %d provider calls (%.1f/s; bound %d) and %d DynamoDB calls %v",
		wait, ce.n.Load(), float64(ce.n.Load())/wait.Seconds(), maxExecs, counter.Total(), counter.Snapshot())
	if ce.n.Load() > maxExecs || ce.n.Load() < 2 || counter.Total() != 1 {
		t.Errorf("silent pump: %d provider calls (bound %d), %d DynamoDB calls (want 1)", ce.n.Load(), maxExecs, counter.Total())
	}
}

// waitFinishedLines waits until the journal holds at least n complete lines.
func (e *env) waitFinishedLines(res keeper.StartResult, runID string, n int) {
	e.T.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines := 0
		_, _ = journal.Read(e.Ctx, e.Prov, res.Sandbox.ProviderSandboxID, dir, runID, 0, false, func(journal.Line) error { lines++; return nil })
		if lines >= n {
			return
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("the journal holds %d lines, want %d", lines, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
