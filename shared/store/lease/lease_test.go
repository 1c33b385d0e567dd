package lease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/lease"
)

var timing = contract.LockTiming{Lease: 3 * time.Second, Renew: time.Second, Skew: 500 * time.Millisecond}

// fake is a one-key lease under a mutex whose renewals can be made to fail or find the
// lease taken; it counts every primitive call.
type fake struct {
	mu                        sync.Mutex
	held                      bool
	fence                     int64
	renewErr                  error
	taken                     bool
	acquires, renews, release atomic.Int64
	unbounded                 atomic.Int64 // renewals whose ctx had no deadline
}

func (f *fake) primitives() lease.Primitives {
	return lease.Primitives{
		Waiting: `fake: waiting for lock "k"`,
		Acquire: func(context.Context, time.Time) (int64, bool, error) {
			f.acquires.Add(1)
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.held {
				return 0, false, nil
			}
			f.held = true
			f.fence++
			return f.fence, true, nil
		},
		Renew: func(ctx context.Context, _ time.Time) (bool, error) {
			f.renews.Add(1)
			if _, ok := ctx.Deadline(); !ok {
				f.unbounded.Add(1)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			return !f.taken, f.renewErr
		},
		Release: func(ctx context.Context) {
			f.release.Add(1)
			if ctx.Err() != nil {
				panic("release got a cancelled ctx")
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			f.held = false
		},
	}
}

func TestRenewalsKeepTheLeaseAndFenceIsVisible(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		var fence int64
		err := lease.Hold(t.Context(), timing, f.primitives(), func(ctx context.Context) error {
			fence = contract.LeaseFence(ctx)
			time.Sleep(10 * timing.Lease) // fake time: many renewals
			if ctx.Err() != nil {
				t.Errorf("lease lost while renewals landed: %v", context.Cause(ctx))
			}
			return nil
		})
		if err != nil || fence != 1 {
			t.Fatalf("hold: err %v, fence %d", err, fence)
		}
		if n := f.renews.Load(); n < 25 {
			t.Fatalf("%d renewals in 10 leases, want one per Renew", n)
		}
		if f.unbounded.Load() != 0 {
			t.Fatalf("%d renewals not bounded by the loss deadline", f.unbounded.Load())
		}
		if f.release.Load() != 1 || f.held {
			t.Fatalf("released %d times, held %v", f.release.Load(), f.held)
		}
	})
}

func TestFailedRenewalsLoseTheLeaseAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{renewErr: errors.New("unreachable")}
		start := time.Now()
		var lostAfter time.Duration
		var cause error
		_ = lease.Hold(t.Context(), timing, f.primitives(), func(ctx context.Context) error {
			<-ctx.Done()
			lostAfter, cause = time.Since(start), context.Cause(ctx)
			return nil
		})
		if !errors.Is(cause, contract.ErrLeaseLost) {
			t.Fatalf("cause %v, want ErrLeaseLost", cause)
		}
		if want := timing.Lease - timing.Skew; lostAfter != want {
			t.Fatalf("lost after %v, want lease−skew %v (fake time)", lostAfter, want)
		}
		if f.renews.Load() == 0 {
			t.Fatal("no renewal was attempted before the deadline")
		}
	})
}

func TestTakenLeaseIsLostAtTheNextRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		start := time.Now()
		var lostAfter time.Duration
		_ = lease.Hold(t.Context(), timing, f.primitives(), func(ctx context.Context) error {
			f.mu.Lock()
			f.taken = true
			f.mu.Unlock()
			<-ctx.Done()
			lostAfter = time.Since(start)
			if !errors.Is(context.Cause(ctx), contract.ErrLeaseLost) {
				t.Errorf("cause %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return nil
		})
		if lostAfter != timing.Renew {
			t.Fatalf("lost after %v, want at the first renewal (%v)", lostAfter, timing.Renew)
		}
	})
}

func TestWaitBacksOffAndEndsWithCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{held: true}
		cause := errors.New("caller gave up")
		ctx, cancel := context.WithCancelCause(t.Context())
		time.AfterFunc(2*time.Second, func() { cancel(cause) })
		err := lease.Hold(ctx, timing, f.primitives(), func(context.Context) error {
			t.Error("fn ran without the lease")
			return nil
		})
		if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
			t.Fatalf("err %v, want Canceled and the cause", err)
		}
		// 2 s of waiting, backoff capped at 250 ms: more than 8 attempts, far fewer than a spin.
		if n := f.acquires.Load(); n < 8 || n > 40 {
			t.Fatalf("%d acquire attempts in 2 s", n)
		}
		if f.release.Load() != 0 {
			t.Fatal("released a lease never acquired")
		}
	})
}

func TestAcquireErrorEndsTheWait(t *testing.T) {
	boom := errors.New("boom")
	p := lease.Primitives{
		Acquire: func(context.Context, time.Time) (int64, bool, error) { return 0, false, boom },
		Release: func(context.Context) { t.Error("released a lease never acquired") },
	}
	err := lease.Hold(t.Context(), timing, p, func(context.Context) error { return nil })
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want the acquire error", err)
	}
}

func TestReleasedOnPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("panic swallowed")
				}
			}()
			_ = lease.Hold(t.Context(), timing, f.primitives(), func(context.Context) error { panic("boom") })
		}()
		if f.release.Load() != 1 || f.held {
			t.Fatalf("released %d times after a panic, held %v", f.release.Load(), f.held)
		}
	})
}
