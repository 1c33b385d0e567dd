package reaper

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

// Store calls that failed with an infrastructure error (not a sentinel: the store
// answered) are repeated with the same arguments and token under the shared policy, so a
// write whose response was lost is recognised by the store as this call's own landed
// attempt. The reaper keeps the last error as it is (its report names it).

// retry calls f (the very same call every time) under the shared store-call policy.
func retry[T any](ctx context.Context, f func() (T, error)) (T, error) {
	return storecall.Do(ctx, storecall.Policy{}, f)
}

// retry0 is retry for calls that return only an error.
func retry0(ctx context.Context, f func() error) error {
	return storecall.Do0(ctx, storecall.Policy{}, f)
}
