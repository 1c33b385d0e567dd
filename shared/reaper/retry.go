package reaper

import (
	"context"
	"errors"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Store calls that failed with an infrastructure error (not a sentinel: the store
// answered) are repeated with the same arguments and token, so a write whose response was
// lost is recognised by the store as this call's own landed attempt.
const (
	storeAttempts = 3
	storeBackoff  = 5 * time.Millisecond
)

// answered reports whether err is the store's answer rather than an infrastructure failure.
func answered(err error) bool {
	for _, s := range []error{
		sandbox.ErrUnknownRun, sandbox.ErrTerminalRun, sandbox.ErrSuperseded, sandbox.ErrLogClosed,
		sandbox.ErrLeaseLost, sandbox.ErrSandboxGone, sandbox.ErrConflict, sandbox.ErrInvalid,
		context.Canceled, context.DeadlineExceeded,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// retry calls f (the very same call every time) until it succeeds, is answered, ctx ends
// or storeAttempts calls were made.
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	wait := storeBackoff
	for attempt := 1; ; attempt++ {
		v, err := f()
		if err == nil || answered(err) || ctx.Err() != nil || attempt == storeAttempts {
			return v, err
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
