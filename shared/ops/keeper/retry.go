package keeper

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

// Store calls go through the store layer (shared/store), which applies the one retry policy
// (storecall, docs/design.md §2.1): a call that failed with an infrastructure error is
// repeated with the same arguments and token. Here ErrUnavailable and ErrUnsupported count
// as answers, and an infrastructure error that outlasts the attempts is ErrUnavailable
// (HTTP 503).
var storePolicy = storecall.Policy{Answers: []error{ErrUnavailable, ErrUnsupported}, Exhausted: ErrUnavailable}

const (
	clampStartedAt = 5_000 // ms: startedAt is clamped to server time ± this (docs/design.md §4.1)
	// maxStartFailMsg caps the error message a failed start stores on the run.
	maxStartFailMsg = 512
)

// newToken returns a fresh random per-call token (claim, create, incarnation, reclaim).
func newToken() string { return storecall.Token() }

// nowMs is the server clock in epoch milliseconds.
func (k *Keeper) nowMs() int64 { return k.cfg.Now().UnixMilli() }

// leaseMs is the driver lease in milliseconds.
func (k *Keeper) leaseMs() int64 { return k.cfg.DriverLease.Milliseconds() }

// detached returns a context that survives ctx's cancellation, bounded by d: cleanup
// (destroy, marking a start failed) must run even when the request was cancelled.
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
