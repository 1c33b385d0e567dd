package testkit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// RenewStaller is what the lease-loss cases need of a lock store (detected by type
// assertion on Backend.Locks()): a way to watch a holder lose its lease. No store
// implements it; a test builds it at a seam around one — memstoretest.New (a stalling
// lease table) or dynamotest.NewStallable (a stalling DynamoDB client).
type RenewStaller interface {
	// StallRenewals keeps every renewal of key's lease (any tenant) from reaching the store
	// — held back, then failed — from its return until resume is called; resume is idempotent.
	StallRenewals(key string) (resume func())
}

// lkT is the part of *testing.T the lock and event-log cases use, so the package's own
// negative controls can run a case against a recorder and expect it to fail.
type lkT interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Context() context.Context
	Failed() bool
}

// lkCase is one conformance case: the options its fresh backend needs and its body.
type lkCase struct {
	name string
	opts Options
	run  func(t lkT, b contract.Backend)
}

// lkLeaseTiming is the short lock timing the lease-loss cases use: lease 600 ms,
// renew 150 ms, skew 100 ms.
var lkLeaseTiming = contract.LockTiming{
	Lease: 600 * time.Millisecond,
	Renew: 150 * time.Millisecond,
	Skew:  100 * time.Millisecond,
}

// lkTolerance is the allowance for one backoff step on top of lease + skew (docs/design.md §10).
const lkTolerance = time.Second

// lkWait bounds every wait on a signal; reaching it means the backend hung, never that a
// timing assumption failed.
const lkWait = 20 * time.Second

// lkCases lists the lock-store cases in the order they run.
func lkCases() []lkCase {
	short := Options{Lock: lkLeaseTiming}
	return []lkCase{
		{"NoOverlapUnderContention", Options{}, lkNoOverlap},
		{"IndependentKeys", Options{}, lkIndependentKeys},
		{"ErrorIsReturnedAndReleases", Options{}, lkErrorReleases},
		{"PanicReleases", Options{}, lkPanicReleases},
		{"StalledHolderLosesLease", short, lkStalledHolder},
		{"StaleReleaseIsNoOp", short, lkStaleRelease},
		{"FenceStrictlyIncreases", Options{}, lkFenceIncreases},
		{"DeadlineBoundsWait", Options{}, lkDeadlineBoundsWait},
		{"TenantsIsolated", Options{}, lkTenantsIsolated},
		{"InvalidTenantRefused", Options{}, lkInvalidTenant},
	}
}

// RunLockStoreConformance runs the lock-store suite (docs/design.md §2.3, §10) against fresh backends
// from nb; the lease-loss cases need a RenewStaller (built at a seam) and skip naming it.
func RunLockStoreConformance(t *testing.T, nb NewBackend) {
	for _, c := range lkCases() {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, fresh(t, nb, c.opts))
		})
	}
}

// lkCtx returns a context of t scoped to tenant.
func lkCtx(t lkT, tenant string) context.Context {
	return contract.WithTenant(t.Context(), tenant)
}

// lkAwait waits for ch or fails the case after lkWait.
func lkAwait(t lkT, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(lkWait):
		t.Fatalf("timed out after %v waiting for %s", lkWait, what)
	}
}

// lkAwaitErr waits for the result of a WithLock run on its own goroutine.
func lkAwaitErr(t lkT, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(lkWait):
		t.Fatalf("timed out after %v waiting for %s", lkWait, what)
		return nil
	}
}

// lkHold runs WithLock(key) on its own goroutine and keeps the lease until release is
// closed; entered is closed once fn runs, with the fn ctx stored in *fnCtx.
type lkHolder struct {
	entered chan struct{}
	release chan struct{}
	done    chan error
	fnCtx   context.Context
	fence   int64
}

func lkHold(ctx context.Context, ls contract.LockStore, key string) *lkHolder {
	h := &lkHolder{entered: make(chan struct{}), release: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		h.done <- ls.WithLock(ctx, key, func(fnCtx context.Context) error {
			h.fnCtx, h.fence = fnCtx, contract.LeaseFence(fnCtx)
			close(h.entered)
			select { // the test's end also lets go, so a failed case leaks nothing
			case <-h.release:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	return h
}

// lkReacquire proves key is free: a WithLock bounded well below the default lease must get
// in, so a key left held until expiry fails the case.
func lkReacquire(t lkT, ls contract.LockStore, ctx context.Context, key, after string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ran := false
	start := time.Now()
	if err := ls.WithLock(ctx, key, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("key not released after %s: WithLock = %v, fn ran = %v", after, err, ran)
	}
	t.Logf("re-acquired %q after %s in %v", key, after, time.Since(start).Round(time.Millisecond))
}

// lkNoOverlap: 16 goroutines × 20 sections on one key never overlap; the dangerous path
// (a caller waiting while another holds the key) must be hit.
func lkNoOverlap(t lkT, b contract.Backend) {
	const workers, sections = 16, 20
	ls := b.Locks()
	ctx, cancel := context.WithTimeout(lkCtx(t, "t1"), 2*time.Minute)
	defer cancel()
	var (
		inSection, overlaps, waiting, contended, startedBusy atomic.Int64
		done, regressions, lastFence                         atomic.Int64
		wg                                                   sync.WaitGroup
		errMu                                                sync.Mutex
		errs                                                 []error
	)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range sections {
				if inSection.Load() > 0 {
					startedBusy.Add(1)
				}
				waiting.Add(1)
				entered := false
				err := ls.WithLock(ctx, "hot", func(ctx context.Context) error {
					entered = true
					waiting.Add(-1)
					if inSection.Add(1) != 1 {
						overlaps.Add(1)
					}
					if waiting.Load() > 0 {
						contended.Add(1)
					}
					// Sections are serialised, so the fence each one sees must exceed the last.
					if f := contract.LeaseFence(ctx); f <= lastFence.Swap(f) {
						regressions.Add(1)
					}
					runtime.Gosched()
					inSection.Add(-1)
					done.Add(1)
					return nil
				})
				if !entered {
					waiting.Add(-1)
				}
				if err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("worker %d section %d: %w", w, i, err))
					errMu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d sections in %v; %d entered with others waiting, %d calls started while held, %d overlaps, %d fence regressions",
		done.Load(), time.Since(start).Round(time.Millisecond), contended.Load(), startedBusy.Load(), overlaps.Load(), regressions.Load())
	for _, err := range errs {
		t.Errorf("WithLock: %v", err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d sections overlapped another on the same key", n)
	}
	if n := regressions.Load(); n != 0 {
		t.Errorf("%d sections saw a fence not above the previous section's", n)
	}
	if n := done.Load(); n != workers*sections {
		t.Errorf("%d sections ran, want %d", n, workers*sections)
	}
	if contended.Load() == 0 && startedBusy.Load() == 0 {
		t.Errorf("no contention was observed: the case proved nothing")
	}
}

// lkIndependentKeys: while key A is held, key B is acquired (signalled, no sleep).
func lkIndependentKeys(t lkT, b contract.Backend) {
	ls := b.Locks()
	ctx := lkCtx(t, "t1")
	a := lkHold(ctx, ls, "key-a")
	defer close(a.release)
	lkAwait(t, a.entered, "key-a to be acquired")
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ranB := make(chan struct{})
	err := ls.WithLock(bctx, "key-b", func(context.Context) error { close(ranB); return nil })
	select {
	case <-ranB:
	default:
		t.Fatalf("key-b not acquired while key-a was held: %v", err)
	}
	if err != nil {
		t.Errorf("WithLock(key-b) = %v, want nil", err)
	}
	if a.fnCtx.Err() != nil {
		t.Errorf("key-a holder's ctx ended while key-b was taken: %v", context.Cause(a.fnCtx))
	}
}

// lkErrorReleases: fn's error is what WithLock returns, and the key is free afterwards.
func lkErrorReleases(t lkT, b contract.Backend) {
	ls := b.Locks()
	ctx := lkCtx(t, "t1")
	boom := errors.New("section failed")
	err := ls.WithLock(ctx, "k", func(context.Context) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("WithLock = %v, want fn's error", err)
	}
	lkReacquire(t, ls, ctx, "k", "an error")
}

// lkPanicReleases: a panicking fn does not leave the key held; WithLock either re-panics
// or returns an error, never nil.
func lkPanicReleases(t lkT, b contract.Backend) {
	ls := b.Locks()
	ctx := lkCtx(t, "t1")
	type marker struct{}
	var recovered any
	var err error
	func() {
		defer func() { recovered = recover() }()
		err = ls.WithLock(ctx, "k", func(context.Context) error { panic(marker{}) })
	}()
	switch {
	case recovered != nil:
		if _, ok := recovered.(marker); !ok {
			t.Errorf("WithLock panicked with %v, want fn's panic value", recovered)
		}
		t.Logf("fn's panic propagated out of WithLock")
	case err != nil:
		t.Logf("fn's panic became an error: %v", err)
	default:
		t.Fatalf("WithLock swallowed fn's panic and returned nil")
	}
	lkReacquire(t, ls, ctx, "k", "a panic")
}

// lkTakeover is the lease-loss scenario: A holds the key with renewals stalled, loses its
// lease, and B (waiting since the stall) gets in. B has resumed renewals when it returns
// and still holds the key until b.release is closed; A has not returned yet (aRelease).
type lkTakeover struct {
	a, b           *lkHolder
	aCancelledAt   time.Time // when A's fn saw its ctx end
	aCause         error
	bEnteredAt     time.Time
	aDoneAtBEntry  bool // A's ctx had ended when B's fn started
	stallAt        time.Time
	aRelease       chan struct{}
	aDone          chan error
	aSawCancel     chan struct{}
	resumeRenewals func()
}

func lkStartTakeover(t lkT, b contract.Backend, key string) *lkTakeover {
	t.Helper()
	ls := b.Locks()
	staller, ok := ls.(RenewStaller)
	if !ok {
		t.Skipf("lock store %T does not implement testkit.RenewStaller; lease-loss case not run", ls)
	}
	ctx := lkCtx(t, "t1")
	s := &lkTakeover{
		a:          &lkHolder{entered: make(chan struct{})},
		b:          &lkHolder{entered: make(chan struct{}), release: make(chan struct{}), done: make(chan error, 1)},
		aRelease:   make(chan struct{}),
		aDone:      make(chan error, 1),
		aSawCancel: make(chan struct{}),
	}
	go func() {
		s.aDone <- ls.WithLock(ctx, key, func(ctx context.Context) error {
			s.a.fnCtx, s.a.fence = ctx, contract.LeaseFence(ctx)
			close(s.a.entered)
			select {
			case <-ctx.Done():
				s.aCancelledAt, s.aCause = time.Now(), context.Cause(ctx)
			case <-time.After(lkWait):
			}
			close(s.aSawCancel)
			select {
			case <-s.aRelease:
			case <-t.Context().Done():
			}
			return context.Cause(ctx)
		})
	}()
	lkAwait(t, s.a.entered, "holder A to acquire")
	s.resumeRenewals = staller.StallRenewals(key)
	s.stallAt = time.Now()
	bctx, cancel := context.WithTimeout(ctx, lkWait)
	go func() {
		defer cancel()
		s.b.done <- ls.WithLock(bctx, key, func(ctx context.Context) error {
			s.bEnteredAt = time.Now()
			s.aDoneAtBEntry = s.a.fnCtx.Err() != nil
			s.b.fnCtx, s.b.fence = ctx, contract.LeaseFence(ctx)
			// Renewals resume only now, so A's stalled renewal can no longer succeed.
			s.resumeRenewals()
			close(s.b.entered)
			select {
			case <-s.b.release:
			case <-t.Context().Done():
			}
			return nil
		})
	}()
	lkAwait(t, s.aSawCancel, "holder A's ctx to be cancelled")
	if s.aCause == nil {
		s.resumeRenewals()
		t.Fatalf("holder A's ctx was not cancelled within %v of stalling renewals (lease %v)", lkWait, lkLeaseTiming.Lease)
	}
	select {
	case <-s.b.entered:
	case err := <-s.b.done:
		close(s.aRelease)
		t.Fatalf("successor B never got in after A lost its lease: %v", err)
	}
	return s
}

// lkStalledHolder: a holder whose renewals stall has fn's ctx cancelled with ErrLeaseLost,
// and the next caller gets in within lease + skew + one backoff step of the stall.
func lkStalledHolder(t lkT, b contract.Backend) {
	s := lkStartTakeover(t, b, "stalled")
	defer close(s.b.release)
	lease, skew := lkLeaseTiming.Lease, lkLeaseTiming.Skew
	cancelAfter := s.aCancelledAt.Sub(s.stallAt)
	takeover := s.bEnteredAt.Sub(s.stallAt)
	t.Logf("lease %v, renew %v, skew %v: holder cancelled %v after the stall, successor in %v after the stall (%v after the cancel); holder cancelled first: %v",
		lease, lkLeaseTiming.Renew, skew, cancelAfter.Round(time.Millisecond), takeover.Round(time.Millisecond),
		s.bEnteredAt.Sub(s.aCancelledAt).Round(time.Millisecond), s.aDoneAtBEntry)
	if !errors.Is(s.aCause, contract.ErrLeaseLost) {
		t.Errorf("cause of holder's ctx = %v, want ErrLeaseLost", s.aCause)
	}
	if bound := lease + skew + lkTolerance; takeover > bound {
		t.Errorf("successor got in %v after the stall, over lease + skew + one backoff step = %v", takeover, bound)
	}
	if !s.aDoneAtBEntry {
		// Scheduling can delay the holder's timer; reported, not decided on timing.
		t.Logf("WARNING: successor entered before the holder's ctx was observed cancelled")
	}
	if s.b.fence <= s.a.fence {
		t.Errorf("successor's fence %d not above the lost holder's %d", s.b.fence, s.a.fence)
	}
	close(s.aRelease)
	if err := lkAwaitErr(t, s.aDone, "holder A to return"); !errors.Is(err, contract.ErrLeaseLost) {
		t.Errorf("lost holder's WithLock = %v, want fn's ErrLeaseLost", err)
	}
}

// lkStaleRelease: the lost holder's release (its fn returning) does not free the new
// holder's lease: a third caller stays out while the new holder keeps its ctx.
func lkStaleRelease(t lkT, b contract.Backend) {
	s := lkStartTakeover(t, b, "stale")
	ls := b.Locks()
	close(s.aRelease) // A returns now: its release is stale.
	aErr := lkAwaitErr(t, s.aDone, "holder A to return")
	t.Logf("stale holder returned %v", aErr)

	ctx := lkCtx(t, "t1")
	cctx, cancel := context.WithTimeout(ctx, 2*lkLeaseTiming.Renew+lkLeaseTiming.Skew)
	defer cancel()
	ranC := false
	cErr := ls.WithLock(cctx, "stale", func(context.Context) error { ranC = true; return nil })
	if ranC {
		t.Errorf("a third caller got the key while the new holder held it: the stale release freed it")
	}
	if cErr == nil {
		t.Errorf("third caller's WithLock = nil while the key was held")
	}
	if err := s.b.fnCtx.Err(); err != nil {
		t.Errorf("new holder's ctx ended after the stale release: %v", context.Cause(s.b.fnCtx))
	}
	close(s.b.release)
	if err := lkAwaitErr(t, s.b.done, "new holder to return"); err != nil {
		t.Errorf("new holder's WithLock = %v, want nil", err)
	}
	lkReacquire(t, ls, ctx, "stale", "the new holder's release")
}

// lkFenceIncreases: each acquisition sees a fence above every earlier one; outside a
// section LeaseFence is 0.
func lkFenceIncreases(t lkT, b contract.Backend) {
	ls := b.Locks()
	ctx := lkCtx(t, "t1")
	if f := contract.LeaseFence(ctx); f != 0 {
		t.Errorf("LeaseFence outside WithLock = %d, want 0", f)
	}
	var fences []int64
	for range 5 {
		if err := ls.WithLock(ctx, "fenced", func(ctx context.Context) error {
			fences = append(fences, contract.LeaseFence(ctx))
			return nil
		}); err != nil {
			t.Fatalf("WithLock: %v", err)
		}
	}
	t.Logf("fences: %v", fences)
	for i, f := range fences {
		if f <= 0 || i > 0 && f <= fences[i-1] {
			t.Errorf("fences %v do not strictly increase from above 0", fences)
			break
		}
	}
}

// lkDeadlineBoundsWait: a caller waiting on a held key returns once its ctx deadline
// passes, with an error wrapping context.DeadlineExceeded, without running fn.
func lkDeadlineBoundsWait(t lkT, b contract.Backend) {
	ls := b.Locks()
	ctx := lkCtx(t, "t1")
	h := lkHold(ctx, ls, "busy")
	defer close(h.release)
	lkAwait(t, h.entered, "the holder to acquire")
	const deadline = 200 * time.Millisecond
	wctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	ran := false
	res := make(chan error, 1)
	start := time.Now()
	go func() { res <- ls.WithLock(wctx, "busy", func(context.Context) error { ran = true; return nil }) }()
	err := lkAwaitErr(t, res, "the waiter to give up at its deadline")
	t.Logf("waiter with a %v deadline returned after %v: %v", deadline, time.Since(start).Round(time.Millisecond), err)
	if ran {
		t.Errorf("waiter ran fn while the key was held")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiter's WithLock = %v, want an error wrapping context.DeadlineExceeded", err)
	}
}

// lkTenantsIsolated: the same key under two tenants is two locks.
func lkTenantsIsolated(t lkT, b contract.Backend) {
	ls := b.Locks()
	h := lkHold(lkCtx(t, "tenant-a"), ls, "shared-key")
	defer close(h.release)
	lkAwait(t, h.entered, "tenant-a to acquire")
	ctx, cancel := context.WithTimeout(lkCtx(t, "tenant-b"), 5*time.Second)
	defer cancel()
	ran := false
	if err := ls.WithLock(ctx, "shared-key", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("tenant-b could not take the key tenant-a holds: WithLock = %v, fn ran = %v", err, ran)
	}
}

// lkInvalidTenant: a tenant outside the charset is ErrInvalid and fn never runs.
func lkInvalidTenant(t lkT, b contract.Backend) {
	ran := false
	err := b.Locks().WithLock(lkCtx(t, "bad#tenant"), "k", func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, contract.ErrInvalid) || ran {
		t.Errorf("WithLock under tenant %q = %v (fn ran %v), want ErrInvalid without running fn", "bad#tenant", err, ran)
	}
}
