package keeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Retry policy of store calls (§2.1): a call that failed with an infrastructure error (not
// a sentinel: the store answered, so its answer stands) is repeated with the same arguments,
// the same per-call token included, so a write whose response was lost is recognised by the
// store as this call's own landed attempt instead of a lost race.
const (
	storeAttempts  = 3
	storeBackoff   = 5 * time.Millisecond
	clampStartedAt = 5_000 // ms: startedAt is clamped to server time ± this (§4.1)
	// reclaimMarginMs is added to the driver lease before a row counts as idle enough to
	// reclaim (§2.1 mark-reclaiming): clock skew between replicas.
	reclaimMarginMs = 5_000
	// maxStartFailMsg caps the error message a failed start stores on the run.
	maxStartFailMsg = 512
)

// answered reports whether err is an answer of the store (a sentinel or a cancelled
// context) rather than an infrastructure failure worth repeating.
func answered(err error) bool {
	for _, s := range []error{
		sandbox.ErrUnknownRun, sandbox.ErrTerminalRun, sandbox.ErrSuperseded,
		sandbox.ErrLogClosed, sandbox.ErrLeaseLost, sandbox.ErrSandboxGone,
		sandbox.ErrConflict, sandbox.ErrInvalid, context.Canceled, context.DeadlineExceeded,
		ErrUnavailable, ErrUnsupported,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// retry calls f until it succeeds, answers with a sentinel, ctx ends or storeAttempts
// calls were made; f must repeat the very same call (same token) every time. An
// infrastructure error that outlasts the attempts is ErrUnavailable (HTTP 503).
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	wait := storeBackoff
	for attempt := 1; ; attempt++ {
		v, err := f()
		switch {
		case err == nil || answered(err) || ctx.Err() != nil:
			return v, err
		case attempt == storeAttempts:
			return v, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
		wait *= 4
	}
}

// retry0 is retry for calls that return only an error.
func retry0(ctx context.Context, f func() error) error {
	_, err := retry(ctx, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// newToken returns a fresh random per-call token (claim, create, incarnation, reclaim).
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}

// nowMs is the server clock in epoch milliseconds.
func (k *Keeper) nowMs() int64 { return k.cfg.Now().UnixMilli() }

// leaseMs is the driver lease in milliseconds.
func (k *Keeper) leaseMs() int64 { return k.cfg.DriverLease.Milliseconds() }

// detached returns a context that survives ctx's cancellation, bounded by d: cleanup
// (destroy, marking a start failed) must run even when the request was cancelled.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
