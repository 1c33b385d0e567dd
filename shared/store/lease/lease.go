// Package lease holds a lock lease for the length of one function call (docs/design.md §2.3): the
// wait with jittered backoff, the renewals on their own goroutine, the loss deadline on the
// monotonic clock and the release on return or panic that every contract.LockStore backend
// shares. A backend supplies only its single-item primitives (Primitives), bound to one key
// and one owner token.
package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Acquire backoff: jittered, doubling from minBackoff, capped at maxBackoff so a waiter
// gets in within one step of the lease becoming free (docs/design.md §10: ≤ 1 s).
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = 250 * time.Millisecond
)

// Primitives are one backend's operations on one lease: one key, one owner token. sent is
// the monotonic time the attempt left; a backend may ignore it and stamp its own clock.
type Primitives struct {
	// Waiting prefixes the error that ends a wait for the lease, e.g. `memstore: waiting
	// for lock "k"`.
	Waiting string
	// Acquire makes one attempt to take the lease (free, expired beyond the skew, or
	// already this owner's) and returns its new fence; ok=false: another owner holds it.
	// An error ends the wait, unless ctx is done (then ctx's error is reported).
	Acquire func(ctx context.Context, sent time.Time) (fence int64, ok bool, err error)
	// Renew extends the lease only while this owner holds it; ok=false: it was taken. An
	// error means the renewal did not land (transient, or held back): the loss
	// deadline still guards the holder. ctx ends at that deadline.
	Renew func(ctx context.Context, sent time.Time) (ok bool, err error)
	// Release frees the lease only while this owner holds it (a stale release is a no-op;
	// the fence survives). Best effort: a lease left held expires. ctx is never cancelled.
	Release func(ctx context.Context)
}

// Hold runs fn while holding the lease of p: acquired with jittered backoff until ctx is
// done, renewed every t.Renew, fn's ctx cancelled with cause contract.ErrLeaseLost at (send
// time of the last successful acquire/renew) + t.Lease − t.Skew or as soon as a renewal
// finds the lease taken, and released when fn returns or panics (the panic continues). fn
// sees the fence through contract.LeaseFence. Zero fields of t take the defaults.
func Hold(ctx context.Context, t contract.LockTiming, p Primitives, fn func(ctx context.Context) error) error {
	t = t.WithDefaults()
	fence, sent, err := acquire(ctx, p)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancelCause(ctx)
	done, stopped := make(chan struct{}), make(chan struct{})
	go keep(lctx, t, p, sent, cancel, done, stopped)
	defer func() { // runs on return and on panic, which then continues unwinding
		close(done)
		<-stopped
		cancel(nil)
		p.Release(context.WithoutCancel(ctx))
	}()
	return fn(contract.WithLeaseFence(lctx, fence))
}

// Acquire is Hold's wait alone, for a holder that keeps the lease itself (the lock routes,
// contract.LeaseLocks): p.Acquire with jittered backoff until it succeeds (its fence) or ctx
// is done (the error wraps ctx's). Only p.Waiting and p.Acquire are used.
func Acquire(ctx context.Context, p Primitives) (int64, error) {
	fence, _, err := acquire(ctx, p)
	return fence, err
}

// acquire tries until it holds the lease or ctx is done, returning the new fence and the
// monotonic send time of the successful attempt.
func acquire(ctx context.Context, p Primitives) (int64, time.Time, error) {
	backoff := minBackoff
	for {
		if err := ctx.Err(); err != nil {
			if cause := context.Cause(ctx); cause != nil && cause != err {
				return 0, time.Time{}, fmt.Errorf("%s: %w: %w", p.Waiting, err, cause)
			}
			return 0, time.Time{}, fmt.Errorf("%s: %w", p.Waiting, err)
		}
		sent := time.Now()
		fence, ok, err := p.Acquire(ctx, sent)
		switch {
		case err != nil && ctx.Err() != nil:
			continue // reported at the top of the loop
		case err != nil:
			return 0, time.Time{}, err
		case ok:
			return fence, sent, nil
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, maxBackoff)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
		case <-timer.C:
		}
	}
}

// keep renews the lease every t.Renew and cancels the holder's ctx with ErrLeaseLost once
// the lease can no longer be guaranteed; it exits when done closes.
func keep(ctx context.Context, t contract.LockTiming, p Primitives, sent time.Time,
	cancel context.CancelCauseFunc, done <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	until := sent.Add(t.Lease - t.Skew)
	deadline := time.NewTimer(time.Until(until))
	defer deadline.Stop()
	renew := time.NewTicker(t.Renew)
	defer renew.Stop()
	for {
		select {
		case <-done:
			return
		case <-deadline.C:
			cancel(contract.ErrLeaseLost)
			return
		case <-renew.C:
			at := time.Now()
			// Bounded by the current deadline: past it the lease is lost anyway.
			rctx, stop := context.WithDeadline(ctx, until)
			ok, err := p.Renew(rctx, at)
			stop()
			switch {
			case err != nil:
				continue
			case !ok:
				cancel(contract.ErrLeaseLost)
				return
			}
			until = at.Add(t.Lease - t.Skew)
			deadline.Reset(time.Until(until))
		}
	}
}
