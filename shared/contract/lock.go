package contract

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

// LeaseLocks (optional, on Backend.Locks()): the lease WithLock holds, one step at a time,
// for a holder that is not this process — the lock routes of the reference store surface
// (docs/design.md §2.3, §8). The holder keeps the timing itself: it renews every
// Timing().Renew and counts the lease lost at (send time of its last successful acquire or
// renew) + Lease − Skew, exactly as WithLock does.
type LeaseLocks interface {
	// TryAcquire makes one attempt to give key's lease to owner (free, expired beyond the
	// skew, or already owner's) and returns its new fence, which only grows; ok=false:
	// another owner holds it.
	TryAcquire(ctx context.Context, key, owner string) (fence int64, ok bool, err error)
	// Renew extends owner's lease by Timing().Lease only while owner holds it; ok=false:
	// owner does not hold it (never did, released it, or it was taken after expiring).
	Renew(ctx context.Context, key, owner string) (ok bool, err error)
	// Release frees key's lease only while owner holds it; anything else is a no-op (nil).
	Release(ctx context.Context, key, owner string) error
	// Timing is the lease timing of the store, defaults applied.
	Timing() LockTiming
}

// MaxOwnerLen bounds a lease owner token.
const MaxOwnerLen = 64

// CheckOwner is the rule for a lease owner token: 1–MaxOwnerLen of [A-Za-z0-9._-].
func CheckOwner(owner string) error {
	if owner == "" || len(owner) > MaxOwnerLen {
		return Invalid("token", "must be 1-%d characters", MaxOwnerLen)
	}
	for i := 0; i < len(owner); i++ {
		if !isTenantByte(owner[i]) {
			return Invalid("token", "character %q outside [A-Za-z0-9._-]", owner[i])
		}
	}
	return nil
}
