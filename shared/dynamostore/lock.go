package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Lease item <tenant>#LOCK#<key> (sk LOCK): owner and expiresAt (wall ms) while held, and a
// fence that only grows. It is never deleted and never gets gcAt, so the fence survives.
const (
	attrOwner     = "owner"
	attrExpiresAt = "expiresAt"
	attrFence     = "fence"
)

// Acquire backoff: jittered, doubling from minBackoff, capped at maxBackoff so a waiter
// gets in within one step of the lease becoming free (§10: ≤ 1 s).
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = 250 * time.Millisecond
)

// releaseTimeout bounds a release, which runs after fn's ctx may already be cancelled.
const releaseTimeout = 5 * time.Second

var lockNames = map[string]string{"#owner": attrOwner}

// acquireCond: free, or expired beyond the skew margin, or already mine (a retried
// ambiguous acquire).
const acquireCond = "attribute_not_exists(#owner) OR expiresAt < :stale OR #owner = :o"

// lockStore is the Store's sandbox.LockStore view.
type lockStore struct{ s *Store }

var _ sandbox.LockStore = lockStore{}

// WithLock runs fn while holding the lease on key: acquired by one conditional UpdateItem
// (free, expired beyond the skew, or already mine), renewed every Renew on its own
// goroutine, and fn's ctx cancelled with cause ErrLeaseLost at (send time of the last
// successful acquire/renew)+Lease−Skew on the monotonic clock, or at once when a renewal
// finds the lease taken. Released (only if still mine) when fn returns or panics.
func (l lockStore) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	if fn == nil {
		return sandbox.Invalid("fn", "nil")
	}
	owner := newToken()
	ik := itemKey(tenant, kindLock, key)
	fence, sent, err := l.acquire(ctx, key, ik, owner)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancelCause(ctx)
	done, stopped := make(chan struct{}), make(chan struct{})
	go l.keep(lctx, key, ik, owner, sent, cancel, done, stopped)
	defer func() { // runs on return and on panic, which then continues unwinding
		close(done)
		<-stopped
		cancel(nil)
		l.release(context.WithoutCancel(ctx), ik, owner)
	}()
	return fn(sandbox.WithLeaseFence(lctx, fence))
}

// acquire tries until it holds the lease or ctx is done, returning the new fence and the
// monotonic send time of the successful attempt.
func (l lockStore) acquire(ctx context.Context, key string, ik map[string]types.AttributeValue, owner string) (int64, time.Time, error) {
	tm := l.s.cfg.Lock
	backoff := minBackoff
	for {
		if err := ctx.Err(); err != nil {
			if cause := context.Cause(ctx); cause != nil && cause != err {
				return 0, time.Time{}, fmt.Errorf("dynamostore: waiting for lock %q: %w: %w", key, err, cause)
			}
			return 0, time.Time{}, fmt.Errorf("dynamostore: waiting for lock %q: %w", key, err)
		}
		sent := time.Now()
		now := l.s.nowMs()
		cond := aws.String(acquireCond)
		if l.s.brokenUnconditionalLease {
			cond = aws.String("attribute_not_exists(#owner) OR attribute_exists(#owner) OR :stale = :o")
		}
		out, err := l.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                aws.String(l.s.cfg.Table),
			Key:                      ik,
			UpdateExpression:         aws.String("SET #owner = :o, expiresAt = :exp, fence = if_not_exists(fence, :zero) + :one"),
			ConditionExpression:      cond,
			ExpressionAttributeNames: lockNames,
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":o": avS(owner), ":exp": avN(now + tm.Lease.Milliseconds()),
				":stale": avN(now - tm.Skew.Milliseconds()), ":zero": avN(0), ":one": avN(1),
			},
			ReturnValues: types.ReturnValueUpdatedNew,
		})
		switch {
		case err == nil:
			fence, _, ferr := getN(out.Attributes, attrFence)
			if ferr != nil {
				return 0, time.Time{}, fmt.Errorf("dynamostore: lock %q: %w", key, ferr)
			}
			return fence, sent, nil
		case isCondFailed(err):
			// Held by someone else: wait and try again.
		case ctx.Err() != nil:
			continue // reported at the top of the loop
		default:
			return 0, time.Time{}, fmt.Errorf("dynamostore: acquire lock %q: %w", key, err)
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, maxBackoff)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// keep renews the lease every Renew and cancels the holder's ctx with ErrLeaseLost once
// the lease can no longer be guaranteed; it exits when done closes.
func (l lockStore) keep(ctx context.Context, key string, ik map[string]types.AttributeValue, owner string, sent time.Time,
	cancel context.CancelCauseFunc, done <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	tm := l.s.cfg.Lock
	deadline := time.NewTimer(time.Until(sent.Add(tm.Lease - tm.Skew)))
	defer deadline.Stop()
	renew := time.NewTicker(tm.Renew)
	defer renew.Stop()
	for {
		select {
		case <-done:
			return
		case <-deadline.C:
			cancel(sandbox.ErrLeaseLost)
			return
		case <-renew.C:
			if hook := l.s.cfg.RenewHook; hook != nil && !hook(key) {
				continue // test hook: this renewal is stalled
			}
			if l.stalled(key) {
				continue // test capability: this key's renewals are stalled
			}
			at := time.Now()
			ok, err := l.renew(ctx, ik, owner, sent.Add(tm.Lease-tm.Skew))
			switch {
			case err != nil:
				continue // transient: the deadline still guards the holder
			case !ok:
				cancel(sandbox.ErrLeaseLost)
				return
			}
			sent = at
			deadline.Reset(time.Until(sent.Add(tm.Lease - tm.Skew)))
		}
	}
}

// renew extends the lease only while owner still holds it; ok=false means it was taken.
// The call is bounded by the current deadline: past it the lease is lost anyway.
func (l lockStore) renew(ctx context.Context, ik map[string]types.AttributeValue, owner string, until time.Time) (bool, error) {
	ctx, stop := context.WithDeadline(ctx, until)
	defer stop()
	_, err := l.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(l.s.cfg.Table),
		Key:                      ik,
		UpdateExpression:         aws.String("SET expiresAt = :exp"),
		ConditionExpression:      aws.String("#owner = :o"),
		ExpressionAttributeNames: lockNames,
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":o": avS(owner), ":exp": avN(l.s.nowMs() + l.s.cfg.Lock.Lease.Milliseconds()),
		},
	})
	if isCondFailed(err) {
		return false, nil
	}
	return err == nil, err
}

// release frees the lease only while owner holds it; the item and its fence survive. A
// failed condition means it is no longer mine (stale, or a retried release whose first
// attempt landed): released either way.
func (l lockStore) release(ctx context.Context, ik map[string]types.AttributeValue, owner string) {
	ctx, stop := context.WithTimeout(ctx, releaseTimeout)
	defer stop()
	for attempt := 0; attempt < 3; attempt++ {
		_, err := l.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(l.s.cfg.Table),
			Key:                       ik,
			UpdateExpression:          aws.String("REMOVE #owner, expiresAt"),
			ConditionExpression:       aws.String("#owner = :o"),
			ExpressionAttributeNames:  lockNames,
			ExpressionAttributeValues: map[string]types.AttributeValue{":o": avS(owner)},
		})
		if err == nil || isCondFailed(err) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		// Transient: try again; if all attempts fail, the lease simply expires.
	}
}

// StallRenewals is a TEST CAPABILITY (testkit.RenewStaller): every renewal of key's lease,
// in any tenant, is skipped from now until resume is called, so a test can watch a holder
// lose its lease. resume is idempotent.
func (l lockStore) StallRenewals(key string) (resume func()) {
	s := l.s
	s.stallMu.Lock()
	s.stalls[key]++
	s.stallMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.stallMu.Lock()
			defer s.stallMu.Unlock()
			if s.stalls[key]--; s.stalls[key] <= 0 {
				delete(s.stalls, key)
			}
		})
	}
}

func (l lockStore) stalled(key string) bool {
	l.s.stallMu.Lock()
	defer l.s.stallMu.Unlock()
	return l.s.stalls[key] > 0
}
