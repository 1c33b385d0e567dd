// Package storecall holds the policy by which sandkeep repeats a store call that failed
// with an infrastructure error (docs/design.md §2.1): the very same call, carrying the very same per-call
// token, so a conditional write whose response was lost is recognised by the store as the
// caller's own landed attempt instead of a lost race. The keeper and the reaper share it.
package storecall

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The retry schedule: Attempts calls at most, waiting FirstBackoff, then 4× longer each time.
//
// It is the outer of two loops, and SDKAttempts is the inner one: the AWS SDK's standard
// retryer, which every DynamoDB client sandkeep builds carries (dynamostore.Retries), tries
// each request up to SDKAttempts times (throttles and transient errors, its own jittered
// backoff) before an error reaches the store call. A DynamoDB request that keeps failing is
// therefore sent at most Attempts × SDKAttempts = 9 times (docs/design.md §2.1).
const (
	Attempts     = 3
	FirstBackoff = 5 * time.Millisecond
	SDKAttempts  = 3
)

// Policy adapts the shared schedule to a caller; the zero value repeats every error that is
// not a sandbox sentinel or a context error and returns the last one as it is.
type Policy struct {
	// Answers are further errors (matched with errors.Is) that are answers, not failures.
	Answers []error
	// Exhausted, when set, wraps the last infrastructure error once the attempts ran out
	// ("<Exhausted>: <err>"), e.g. so the HTTP layer answers 503.
	Exhausted error
}

// Answered reports whether err is an answer under p rather than an infrastructure failure:
// a sandbox sentinel (the store's answer), the caller's own cancellation, or one of p.Answers.
func (p Policy) Answered(err error) bool {
	if contract.IsSentinel(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	for _, s := range p.Answers {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// Do calls f until it succeeds, is answered, ctx ends or Attempts calls were made; f must
// repeat the very same call (same token) every time.
func Do[T any](ctx context.Context, p Policy, f func() (T, error)) (T, error) {
	wait := FirstBackoff
	for attempt := 1; ; attempt++ {
		v, err := f()
		switch {
		case err == nil || p.Answered(err) || ctx.Err() != nil:
			return v, err
		case attempt == Attempts:
			if p.Exhausted != nil {
				err = fmt.Errorf("%w: %w", p.Exhausted, err)
			}
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

// Do0 is Do for calls that return only an error.
func Do0(ctx context.Context, p Policy, f func() error) error {
	_, err := Do(ctx, p, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// Token returns a fresh random per-call token (128 bits, hex): the mark by which a store
// recognises a retried conditional write as the caller's own.
func Token() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b[:])
}
