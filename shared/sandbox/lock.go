package sandbox

import (
	"context"
	"time"
)

// LockStore hands out mutually exclusive leases on keys, scoped by the context's tenant.
type LockStore interface {
	// WithLock runs fn while holding the lease on key. Same key: mutually exclusive;
	// different keys: independent. Waits (jittered backoff) until acquired or ctx done.
	// fn's ctx is cancelled with cause ErrLeaseLost once ownership can no longer be
	// guaranteed. Released when fn returns, errors or panics. Not re-entrant.
	WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error
}

// LockTiming configures lock leases; zero fields take the defaults.
type LockTiming struct {
	Lease time.Duration // default 15 s
	Renew time.Duration // default 5 s
	Skew  time.Duration // default 1 s
}

// Defaults of LockTiming (docs/design.md §2.3).
const (
	DefaultLockLease = 15 * time.Second
	DefaultLockRenew = 5 * time.Second
	DefaultLockSkew  = time.Second
)

// WithDefaults returns t with zero fields set to the defaults.
func (t LockTiming) WithDefaults() LockTiming {
	if t.Lease <= 0 {
		t.Lease = DefaultLockLease
	}
	if t.Renew <= 0 {
		t.Renew = DefaultLockRenew
	}
	if t.Skew <= 0 {
		t.Skew = DefaultLockSkew
	}
	return t
}

type fenceKey struct{}

// WithLeaseFence is used by lock stores to expose the lease fence to fn.
func WithLeaseFence(ctx context.Context, fence int64) context.Context {
	return context.WithValue(ctx, fenceKey{}, fence)
}

// LeaseFence returns the fence of the lease held by ctx's WithLock; 0 outside one.
func LeaseFence(ctx context.Context) int64 {
	f, _ := ctx.Value(fenceKey{}).(int64)
	return f
}
