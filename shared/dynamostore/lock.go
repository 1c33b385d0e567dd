package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/lease"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Lease item <tenant>#LOCK#<key> (sk LOCK): owner and expiresAt (wall ms) while held, and a
// fence that only grows. It is never deleted and never gets gcAt, so the fence survives.
const (
	attrOwner = "owner"
	attrFence = "fence"
)

// releaseTimeout bounds a release, which runs after fn's ctx may already be cancelled.
const releaseTimeout = 5 * time.Second

// lockNames are the expression names of the lock's expressions ("owner" is a reserved
// word); a fresh map per call, so nothing shared is handed to the SDK.
func lockNames() map[string]string { return map[string]string{"#owner": attrOwner} }

// acquireCond: free, or expired beyond the skew margin, or already mine (a retried
// ambiguous acquire).
const acquireCond = "attribute_not_exists(#owner) OR expiresAt < :stale OR #owner = :o"

// lockStore is the Store's sandbox.LockStore view.
type lockStore struct{ s *Store }

var _ sandbox.LockStore = lockStore{}

// WithLock runs fn while holding the lease on key (lease.Hold): acquired by one
// conditional UpdateItem (free, expired beyond the skew, or already mine), renewed by
// another while still mine, released by a third only if still mine.
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

// acquire makes one attempt at the lease; ok=false: held by another owner. The lease's
// expiry is stamped on the store's wall clock (Config.Now).
func (l lockStore) acquire(ctx context.Context, key string, ik map[string]types.AttributeValue, owner string) (int64, bool, error) {
	tm := l.s.cfg.Lock
	now := l.s.nowMs()
	out, err := l.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(l.s.cfg.Table),
		Key:                      ik,
		UpdateExpression:         aws.String("SET #owner = :o, expiresAt = :exp, fence = if_not_exists(fence, :zero) + :one"),
		ConditionExpression:      aws.String(acquireCond),
		ExpressionAttributeNames: lockNames(),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":o": avS(owner), ":exp": avN(now + tm.Lease.Milliseconds()),
			":stale": avN(now - tm.Skew.Milliseconds()), ":zero": avN(0), ":one": avN(1),
		},
		ReturnValues: types.ReturnValueUpdatedNew,
	})
	switch {
	case isCondFailed(err):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("dynamostore: acquire lock %q: %w", key, err)
	}
	fence, _, err := getN(out.Attributes, attrFence)
	if err != nil {
		return 0, false, fmt.Errorf("dynamostore: lock %q: %w", key, err)
	}
	return fence, true, nil
}

// renew extends the lease only while owner still holds it; ok=false means it was taken.
func (l lockStore) renew(ctx context.Context, ik map[string]types.AttributeValue, owner string) (bool, error) {
	_, err := l.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                aws.String(l.s.cfg.Table),
		Key:                      ik,
		UpdateExpression:         aws.String("SET expiresAt = :exp"),
		ConditionExpression:      aws.String("#owner = :o"),
		ExpressionAttributeNames: lockNames(),
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
			ExpressionAttributeNames:  lockNames(),
			ExpressionAttributeValues: map[string]types.AttributeValue{":o": avS(owner)},
		})
		if err == nil || isCondFailed(err) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		// Transient: try again; if all attempts fail, the lease simply expires.
	}
}
