package memstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/memstoretest"
)

var timing = contract.LockTiming{Lease: 3 * time.Second, Renew: time.Second, Skew: 500 * time.Millisecond}

func TestLockExcludesAndFencesIncrease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locks := memstore.New(memstore.WithLockTiming(timing)).Locks()
		ctx := tctx(t, "a")
		var inside, overlaps, contended, other atomic.Int64
		var mu sync.Mutex
		var fences []int64
		firstIn := make(chan struct{})
		var once sync.Once
		hold := func() {
			err := locks.WithLock(ctx, "k", func(ctx context.Context) error {
				if inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				mu.Lock()
				fences = append(fences, contract.LeaseFence(ctx))
				mu.Unlock()
				once.Do(func() { close(firstIn) })
				time.Sleep(50 * time.Millisecond) // fake time: holds the lease while others wait
				inside.Add(-1)
				return nil
			})
			if err != nil {
				t.Errorf("with lock: %v", err)
			}
		}
		var wg sync.WaitGroup
		wg.Go(hold)
		<-firstIn
		for range 7 {
			wg.Go(func() {
				if inside.Load() > 0 {
					contended.Add(1) // this caller must wait: the dangerous path
				}
				hold()
			})
		}
		// A different key is never blocked by the contention above.
		must(t, locks.WithLock(ctx, "other", func(context.Context) error { other.Add(1); return nil }), "other key")
		if inside.Load() != 1 {
			t.Fatalf("the other key was acquired while %d held k, want 1", inside.Load())
		}
		wg.Wait()
		t.Logf("%d of 7 callers met a held lock; %d overlaps", contended.Load(), overlaps.Load())
		if overlaps.Load() != 0 {
			t.Fatalf("%d overlapping holders", overlaps.Load())
		}
		if contended.Load() == 0 {
			t.Fatal("no caller ever met a held lock: contention was never exercised")
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fences not strictly increasing: %v", fences)
			}
		}
		if len(fences) != 8 || other.Load() != 1 {
			t.Fatalf("%d holders, other key %d", len(fences), other.Load())
		}
	})
}

func TestStalledHolderLosesItsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Renewals are held back at the lease table (the seam), as by a partition.
		leases := memstoretest.NewStallingLeases(memstore.NewLeases())
		s := memstore.New(memstore.WithLockTiming(timing), memstore.WithLeases(leases))
		ctx := tctx(t, "a")
		acquired := make(chan time.Time)
		proceed, holderDone := make(chan struct{}), make(chan struct{})
		var lost error
		go func() {
			defer close(holderDone)
			_ = s.Locks().WithLock(ctx, "k", func(ctx context.Context) error {
				defer leases.StallRenewals("k")()
				acquired <- time.Now()
				<-ctx.Done()
				lost = context.Cause(ctx)
				<-proceed // a stuck holder: it does not return when told
				return nil
			})
		}()
		start := <-acquired
		var stolenAt time.Time
		must(t, s.Locks().WithLock(ctx, "k", func(ctx context.Context) error {
			stolenAt = time.Now()
			close(proceed)
			<-holderDone // the stale holder's release runs now and must be a no-op
			wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			err := s.Locks().WithLock(wctx, "k", func(context.Context) error { return nil })
			wantErr(t, err, context.DeadlineExceeded, "third caller while the second holds")
			return nil
		}), "second caller")
		synctest.Wait()
		if !errors.Is(lost, contract.ErrLeaseLost) {
			t.Fatalf("stalled holder's ctx cause %v, want ErrLeaseLost", lost)
		}
		if leases.Held() == 0 {
			t.Fatal("the lease table never held back a renewal")
		}
		// The next caller gets in after lease+skew, within one backoff step.
		if d := stolenAt.Sub(start); d < timing.Lease+timing.Skew || d > timing.Lease+timing.Skew+time.Second {
			t.Fatalf("lease taken over after %v", d)
		}
	})
}

func TestLockReleasesOnPanicAndDeadlineBoundsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locks := memstore.New(memstore.WithLockTiming(timing)).Locks()
		ctx := tctx(t, "a")
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("panic swallowed")
				}
			}()
			_ = locks.WithLock(ctx, "k", func(context.Context) error { panic("boom") })
		}()
		sentinel := errors.New("fn failed")
		err := locks.WithLock(ctx, "k", func(context.Context) error { return sentinel })
		wantErr(t, err, sentinel, "fn's error after a panicking holder")

		release := make(chan struct{})
		held := make(chan struct{})
		go func() {
			_ = locks.WithLock(ctx, "k", func(context.Context) error {
				close(held)
				<-release
				return nil
			})
		}()
		<-held
		dctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
		defer cancel()
		start := time.Now()
		err = locks.WithLock(dctx, "k", func(context.Context) error { return nil })
		wantErr(t, err, context.DeadlineExceeded, "wait past the deadline")
		if d := time.Since(start); d > time.Second {
			t.Fatalf("waited %v past a 700ms deadline", d)
		}
		close(release)
	})
}
