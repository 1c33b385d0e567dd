// Package idlerace forces the race of docs/design.md §5 between an idle stop and the
// thread's next start, through the reaper's own sweep: the stop is held mid-way (the row
// marked stopping, the provider's stop not yet sent) while a keeper start runs on the same
// thread, and the test sees whether the start waited for the stop and resumed the sandbox.
// The broken variant is a backend seam whose lock lets the sweep's stop run without
// sandbox:<key>; the race must tell it apart.
package idlerace

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// who labels a context with its caller (the sweep's stop or the start), so the lock seam
// can tell whose WithLock it sees (the label rides every context derived from it).
type who struct{}

// Seam wraps a backend's locks and reports when the start queues for sandbox:<key>
// while the sweep's stop is inside its critical section on that key. Broken is the
// broken variant: the sweep takes sandbox:<key> in name only (fn runs without the lock).
type Seam struct {
	contract.Backend
	Broken bool

	key         string
	mu          sync.Mutex
	stopHolds   bool
	queuedWhile chan struct{} // closed: the start queued while the stop held the lock
	once        sync.Once
}

func (s *Seam) Locks() contract.LockStore { return seamLocks{s.Backend.Locks(), s} }

type seamLocks struct {
	contract.LockStore
	s *Seam
}

func (l seamLocks) WithLock(ctx context.Context, key string, fn func(context.Context) error) error {
	label, _ := ctx.Value(who{}).(string)
	ours := key == "sandbox:"+l.s.key
	if ours && label == "start" {
		l.s.mu.Lock()
		if l.s.stopHolds {
			l.s.once.Do(func() { close(l.s.queuedWhile) })
		}
		l.s.mu.Unlock()
	}
	if !ours || label != "stop" {
		return l.LockStore.WithLock(ctx, key, fn)
	}
	held := func(lctx context.Context) error {
		l.s.mu.Lock()
		l.s.stopHolds = true
		l.s.mu.Unlock()
		defer func() {
			l.s.mu.Lock()
			l.s.stopHolds = false
			l.s.mu.Unlock()
		}()
		return fn(lctx)
	}
	if l.s.Broken {
		return fn(ctx) // the sweep's stop without the lock: nothing for the start to queue on
	}
	return l.LockStore.WithLock(ctx, key, held)
}

// Gate holds a provider's stop mid-way: a provider wrapper's Stop calls Hold before the
// real stop, so the row is marked stopping and the provider not yet asked. It holds the
// stop before the request rather than inside the stand-in because the hosted stand-ins
// serialize a resume behind a stop in progress themselves, which would hide whether
// sandkeep's lock did.
type Gate struct {
	reached chan string
	release chan struct{}
	once    sync.Once
}

// NewGate returns a closed gate: the first stop that reaches it waits for Release.
func NewGate() *Gate { return &Gate{reached: make(chan string, 1), release: make(chan struct{})} }

// Hold announces the stop of id and waits until Release (or ctx ends).
func (g *Gate) Hold(ctx context.Context, id string) {
	select {
	case g.reached <- id:
	default: // a later stop: announced once
	}
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

// Release lets every held and later stop through.
func (g *Gate) Release() { g.once.Do(func() { close(g.release) }) }

// HeldStop is the local-process provider behind a Gate.
type HeldStop struct {
	*localprocess.Provider
	Gate *Gate
}

func (p HeldStop) Stop(ctx context.Context, id string) error {
	p.Gate.Hold(ctx, id)
	return p.Provider.Stop(ctx, id)
}

// Race is one forced interleaving: Provider's Stop calls Gate.Hold before its real stop
// (and it reads its sandboxes' status), Backend is fresh, Broken selects the broken seam.
type Race struct {
	Backend  contract.Backend
	Provider Provider
	Gate     *Gate
	Broken   bool
}

// Provider is a provider the race runs on: it reads its sandboxes' status, and its Stop
// calls Gate.Hold before the real stop.
type Provider interface {
	contract.Provider
	contract.StatusReader
}

// Test runs the race on both backends (Backends), each a parallel subtest: through the
// sweep as deployed the start must be Serialized, and through the broken seam (a stop
// that skips the lock) it must not — the proof that the race reaches the dangerous path.
// newProvider returns a fresh provider whose Stop holds at gate.
func Test(t *testing.T, newProvider func(t *testing.T, gate *Gate) Provider) {
	t.Helper()
	for name, nb := range Backends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			race := func(broken bool) Result {
				gate := NewGate()
				return Run(t, Race{Backend: nb(t), Provider: newProvider(t, gate), Gate: gate, Broken: broken})
			}
			if res := race(false); !res.Serialized() {
				t.Fatalf("the start was handed a sandbox stopped under it: %+v", res)
			}
			if res := race(true); res.Serialized() {
				t.Fatalf("the broken variant (a sweep's stop that skips the lock) was not caught: %+v", res)
			}
		})
	}
}

// Result is what the race left: the start's outcome and whether it got the thread's
// sandbox, the sandbox's provider status and the row's lifecycle at the end, and the
// sweep's stops.
type Result struct {
	Outcome   keeper.Outcome
	SameID    bool
	Status    contract.SandboxStatus
	Lifecycle string
	Stopped   int
}

// Serialized reports whether the start waited for the stop and resumed the thread's
// sandbox, left running (docs/design.md §5).
func (r Result) Serialized() bool {
	return r.Outcome == keeper.OutcomeResumed && r.SameID && r.Status == contract.SandboxAlive &&
		r.Lifecycle == keeper.LifecycleRunning && r.Stopped == 1
}

// Run runs one run on a thread, ends it, moves the clock an hour on, and runs the reaper's
// sweep; its idle stop is held at the gate while a keeper start runs on the thread. The
// stop is released once the start has finished, or has queued for the lock the stop holds.
func Run(t *testing.T, rc Race) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(contract.WithTenant(context.Background(), "acme"), time.Minute)
	defer cancel()
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	seam := &Seam{Backend: rc.Backend, Broken: rc.Broken, queuedWhile: make(chan struct{})}
	k, err := keeper.New(keeper.Config{Backend: seam, Providers: []contract.Provider{rc.Provider},
		Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	rp, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: time.Hour, QuietReport: true})
	if err != nil {
		t.Fatal(err)
	}
	setup := keeper.Setup{ID: "agent", Provider: rc.Provider.Name()}
	first, err := k.Start(ctx, keeper.StartInput{RunID: "run-1", ThreadID: "thread-1", Sandbox: setup})
	if err != nil {
		t.Fatal(err)
	}
	psid, key := first.Sandbox.ProviderSandboxID, first.Sandbox.Key
	t.Cleanup(func() { rc.Gate.Release(); _ = rc.Provider.Destroy(context.Background(), psid) })
	seam.key = key
	if _, err := k.Finish(ctx, "run-1", first.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted}); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour.Milliseconds()) // idle past the grace

	type swept struct {
		rep reaper.Report
		err error
	}
	sweepDone := make(chan swept, 1)
	go func() {
		rep, err := rp.Sweep(context.WithValue(ctx, who{}, "stop"))
		sweepDone <- swept{rep, err}
	}()
	select {
	case got := <-rc.Gate.reached:
		if got != psid {
			t.Fatalf("stopping %s, want %s", got, psid)
		}
	case sw := <-sweepDone:
		t.Fatalf("the sweep ended without stopping the idle sandbox: %+v %v", sw.rep.Lifecycle, sw.err)
	case <-ctx.Done():
		t.Fatal("the sweep's stop never reached the provider")
	}
	type started struct {
		res keeper.StartResult
		err error
	}
	startDone := make(chan started, 1)
	go func() {
		res, err := k.Start(context.WithValue(ctx, who{}, "start"), keeper.StartInput{RunID: "run-2", ThreadID: "thread-1", Sandbox: setup})
		startDone <- started{res, err}
	}()
	var second started
	select {
	case second = <-startDone: // the start did not wait for the stop
		rc.Gate.Release()
	case <-seam.queuedWhile: // the start waits for the lock the stop holds
		rc.Gate.Release()
		second = <-startDone
	case <-ctx.Done():
		t.Fatal("the start neither ended nor queued for the stop's lock")
	}
	sw := <-sweepDone
	if sw.err != nil {
		t.Fatalf("sweep: %v", sw.err)
	}
	if second.err != nil {
		t.Fatalf("start: %v", second.err)
	}
	st, err := rc.Provider.Status(ctx, psid)
	if err != nil {
		t.Fatal(err)
	}
	row, err := k.View(ctx, "run-2")
	if err != nil {
		t.Fatal(err)
	}
	res := Result{Outcome: second.res.Outcome, SameID: second.res.Sandbox.ProviderSandboxID == psid,
		Status: st, Stopped: sw.rep.Lifecycle.Stopped}
	if row.Sandbox != nil {
		res.Lifecycle = row.Sandbox.Lifecycle
	}
	t.Logf("start %s (same sandbox %v); sweep stopped %d, stale %d; sandbox %s after the race; row lifecycle %q",
		res.Outcome, res.SameID, res.Stopped, sw.rep.Swept.Stale, res.Status, res.Lifecycle)
	return res
}

// Backends are the two backends every idle-stop test runs on, each fresh per call: the
// memory store, and dynamostore on a fresh table of the test's DynamoDB endpoint.
func Backends() map[string]func(t *testing.T) contract.Backend {
	return map[string]func(t *testing.T) contract.Backend{
		"memory": func(*testing.T) contract.Backend { return memstore.New() },
		"dynamodb": func(t *testing.T) contract.Backend {
			client := dynamotest.Client(t)
			return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
		},
	}
}
