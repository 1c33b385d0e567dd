package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/lease"
)

// Lease item <tenant>#LOCK#<key> (sk LOCK): owner and expiresAt (wall ms) while held, and a
// fence that only grows. It is never deleted and never gets gcAt, so the fence survives.
const (
	attrOwner = "owner"
	attrFence = "fence"
)

// releaseTimeout bounds a release, which runs after fn's ctx may already be cancelled.
const releaseTimeout = 5 * time.Second

// lockItem is what an acquire reads back of the lease item (only conditional updates
// write it: owner and expiresAt while held, and the fence, which only grows).
type lockItem struct {
	Fence int64 `dynamodbav:"fence"`
}

// The lease's expressions are fixed text, written here rather than built per call with
// feature/dynamodb/expression: every start and every sweep takes a lease, and building these
// three expressions (docs/bench.md, typed items) cost more than the rest of the lock's code.
// "owner" is a reserved word, hence #owner; the values are marshalled by attributevalue.
const (
	// acquireCond: free, or expired beyond the skew margin, or already mine (a retried
	// ambiguous acquire).
	acquireCond   = "attribute_not_exists(#owner) OR expiresAt < :stale OR #owner = :o"
	acquireUpdate = "SET #owner = :o, expiresAt = :exp, fence = if_not_exists(fence, :zero) + :one"
	mineCond      = "#owner = :o"
	renewUpdate   = "SET expiresAt = :exp"
	releaseUpdate = "REMOVE #owner, expiresAt"
)

// lockStore is the Store's contract.LockStore and contract.LeaseLocks view.
type lockStore struct{ view }

var (
	_ contract.LockStore  = lockStore{}
	_ contract.LeaseLocks = lockStore{}
)

// WithLock runs fn while holding the lease on key (lease.Hold): acquired by one
// conditional UpdateItem (free, expired beyond the skew, or already mine), renewed by
// another while still mine, released by a third only if still mine.
func (l lockStore) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	owner := newToken()
	ik := l.leaseItemKey(key)
	return lease.Hold(ctx, l.s.cfg.Lock, lease.Primitives{
		Waiting: fmt.Sprintf("dynamostore: waiting for lock %q", key),
		Acquire: func(ctx context.Context, _ time.Time) (int64, bool, error) {
			return l.acquire(ctx, key, ik, owner)
		},
		Renew: func(ctx context.Context, _ time.Time) (bool, error) {
			return l.renew(ctx, ik, owner)
		},
		Release: func(ctx context.Context) { l.release(ctx, ik, owner) },
	}, fn)
}

// leaseItemKey is the item of key's lease in the view's tenant.
func (l lockStore) leaseItemKey(key string) map[string]types.AttributeValue {
	return itemKey(l.tenant, kindLock, key)
}

// TryAcquire is contract.LeaseLocks's: one attempt of WithLock's acquire (one UpdateItem).
func (l lockStore) TryAcquire(ctx context.Context, key, owner string) (int64, bool, error) {
	ik := l.leaseItemKey(key)
	return l.acquire(ctx, key, ik, owner)
}

// Renew is contract.LeaseLocks's: one renewal of WithLock's (one UpdateItem).
func (l lockStore) Renew(ctx context.Context, key, owner string) (bool, error) {
	ik := l.leaseItemKey(key)
	return l.renew(ctx, ik, owner)
}

// Release is contract.LeaseLocks's: one conditional UpdateItem freeing the lease only while
// owner holds it; a failed condition (not owner's) is the no-op answer.
func (l lockStore) Release(ctx context.Context, key, owner string) error {
	ik := l.leaseItemKey(key)
	_, err := l.update(ctx, ik, releaseUpdate, mineCond, map[string]any{":o": owner}, types.ReturnValueNone)
	if err != nil && !isCondFailed(err) {
		return fmt.Errorf("dynamostore: release lock %q: %w", key, err)
	}
	return nil
}

// Timing is contract.LeaseLocks's.
func (l lockStore) Timing() contract.LockTiming { return l.s.cfg.Lock }

// acquire makes one attempt at the lease; ok=false: held by another owner. The lease's
// expiry is stamped on the store's wall clock (Config.Now).
func (l lockStore) acquire(ctx context.Context, key string, ik map[string]types.AttributeValue, owner string) (int64, bool, error) {
	tm := l.s.cfg.Lock
	now := l.s.nowMs()
	out, err := l.update(ctx, ik, acquireUpdate, acquireCond, map[string]any{
		":o": owner, ":exp": now + tm.Lease.Milliseconds(), ":stale": now - tm.Skew.Milliseconds(), ":zero": 0, ":one": 1,
	}, types.ReturnValueUpdatedNew)
	switch {
	case isCondFailed(err):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("dynamostore: acquire lock %q: %w", key, err)
	}
	it, err := decodeItem[lockItem](out.Attributes)
	if err != nil {
		return 0, false, fmt.Errorf("dynamostore: lock %q: %w", key, err)
	}
	return it.Fence, true, nil
}

// renew extends the lease only while owner still holds it; ok=false means it was taken.
func (l lockStore) renew(ctx context.Context, ik map[string]types.AttributeValue, owner string) (bool, error) {
	_, err := l.update(ctx, ik, renewUpdate, mineCond, map[string]any{
		":o": owner, ":exp": l.s.nowMs() + l.s.cfg.Lock.Lease.Milliseconds(),
	}, types.ReturnValueNone)
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
		_, err := l.update(ctx, ik, releaseUpdate, mineCond, map[string]any{":o": owner}, types.ReturnValueNone)
		if err == nil || isCondFailed(err) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		// Transient: try again; if all attempts fail, the lease simply expires.
	}
}

// update runs one UpdateItem of the lease item: expression upd under cond, with vals.
func (l lockStore) update(ctx context.Context, ik map[string]types.AttributeValue, upd, cond string,
	vals map[string]any, rv types.ReturnValue) (*dynamodb.UpdateItemOutput, error) {
	av, err := attributevalue.MarshalMap(vals)
	if err != nil {
		return nil, fmt.Errorf("dynamostore: lock values: %w", err)
	}
	return l.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(l.s.cfg.Table),
		Key:                       ik,
		UpdateExpression:          aws.String(upd),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeNames:  map[string]string{"#owner": attrOwner}, // a fresh map per call
		ExpressionAttributeValues: av,
		ReturnValues:              rv,
	})
}
