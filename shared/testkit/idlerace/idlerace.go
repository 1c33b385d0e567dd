// Package idlerace forces the race of docs/design.md §5 between an idle stop and the
// thread's next start: the stop is held mid-way (the row marked stopping, the provider's
// stop not yet run) while a start runs, and the test sees whether the start waited.
package idlerace

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// who labels a context with its caller (the stop or the start), so the lock seam below can
// tell whose WithLock it sees.
type who struct{}

// Seam wraps a backend's locks and reports when the start queues for sandbox:<key>
// while the stop is inside its critical section on that key.
type Seam struct {
	contract.Backend
	key string

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
	if key == "sandbox:"+l.s.key {
		l.s.mu.Lock()
		if label == "start" && l.s.stopHolds {
			l.s.once.Do(func() { close(l.s.queuedWhile) })
		}
		l.s.mu.Unlock()
	}
	return l.LockStore.WithLock(ctx, key, func(lctx context.Context) error {
		if label == "stop" && key == "sandbox:"+l.s.key {
			l.s.mu.Lock()
			l.s.stopHolds = true
			l.s.mu.Unlock()
			defer func() {
				l.s.mu.Lock()
				l.s.stopHolds = false
				l.s.mu.Unlock()
			}()
		}
		return fn(lctx)
	})
}

// HeldStop is the provider seam: its Stop reports that it was reached, then waits for
// release before the real stop runs.
type HeldStop struct {
	*localprocess.Provider
	reached chan string
	release chan struct{}
}

func (p *HeldStop) Stop(ctx context.Context, id string) error {
	p.reached <- id
	<-p.release
	return p.Provider.Stop(ctx, id)
}

// StopVariant runs an idle stop of key at now.
type StopVariant func(ctx context.Context, k *keeper.Keeper, b contract.Backend, key string, now int64) (keeper.StopResult, error)

// LockedStop is the stop as the reaper runs it: under the key's lock.
func LockedStop(ctx context.Context, k *keeper.Keeper, b contract.Backend, key string, now int64) (keeper.StopResult, error) {
	var res keeper.StopResult
	err := b.Locks().WithLock(ctx, "sandbox:"+key, func(lctx context.Context) (err error) {
		res, err = k.StopIdle(lctx, key, 10*time.Minute, now)
		return err
	})
	return res, err
}

// UnlockedStop is the broken variant: the same stop without the lock.
func UnlockedStop(ctx context.Context, k *keeper.Keeper, _ contract.Backend, key string, now int64) (keeper.StopResult, error) {
	return k.StopIdle(ctx, key, 10*time.Minute, now)
}

// RaceStopStart holds an idle stop mid-way (the row marked stopping, the provider's stop
// not yet run) and starts the thread's next run meanwhile. The stop is released once the
// start has finished, or has queued for the lock the stop holds. It reports whether the
// started run's sandbox is alive at the end, as it must be (docs/design.md §5).
func RaceStopStart(t *testing.T, b contract.Backend, stop StopVariant) (alive bool) {
	t.Helper()
	base := context.Background()
	ctx := contract.WithTenant(base, "acme")
	prov := &HeldStop{Provider: localprocess.New(t.TempDir()), reached: make(chan string, 1), release: make(chan struct{})}
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	seam := &Seam{Backend: b, queuedWhile: make(chan struct{})}
	k, err := keeper.New(keeper.Config{Backend: seam, Providers: []contract.Provider{prov},
		Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	setup := keeper.Setup{ID: "agent", Provider: prov.Name()}
	first, err := k.Start(ctx, keeper.StartInput{RunID: "run-1", ThreadID: "thread-1", Sandbox: setup})
	if err != nil {
		t.Fatal(err)
	}
	psid, key := first.Sandbox.ProviderSandboxID, first.Sandbox.Key
	t.Cleanup(func() { _ = prov.Destroy(base, psid) })
	seam.key = key
	if _, err := k.Finish(ctx, "run-1", first.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted}); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour.Milliseconds()) // idle past the grace

	type stopped struct {
		res keeper.StopResult
		err error
	}
	stopDone := make(chan stopped, 1)
	go func() {
		res, err := stop(context.WithValue(ctx, who{}, "stop"), k, seam, key, clock.Load())
		stopDone <- stopped{res, err}
	}()
	if got := <-prov.reached; got != psid {
		t.Fatalf("stopping %s, want %s", got, psid)
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
		close(prov.release)
	case <-seam.queuedWhile: // the start waits for the lock the stop holds
		close(prov.release)
		second = <-startDone
	}
	sr := <-stopDone
	if sr.err != nil {
		t.Fatalf("stop: %v", sr.err)
	}
	if second.err != nil {
		t.Fatalf("start: %v", second.err)
	}
	if second.res.Sandbox.ProviderSandboxID != psid || second.res.Outcome != keeper.OutcomeResumed {
		t.Fatalf("the next start got %+v (%s); want the thread's sandbox resumed", second.res.Sandbox, second.res.Outcome)
	}
	st, err := prov.Status(base, psid)
	if err != nil {
		t.Fatal(err)
	}
	row, err := b.Instances().GetRow(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stop %s; sandbox %s after the race; row lifecycle %q", sr.res.Outcome, st, row.Lifecycle)
	return st == contract.SandboxAlive && row.Lifecycle == contract.LifecycleRunning && sr.res.Outcome == keeper.StopStopped
}
