package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
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

// lockItem is what an acquire reads back of the lease item (only conditional updates
// write it: owner and expiresAt while held, and the fence, which only grows).
type lockItem struct {
	Fence int64 `dynamodbav:"fence"`
}

const attrExpiresAt = "expiresAt"

// mine is the condition that owner holds the lease.
func mine(owner string) expression.ConditionBuilder {
	return expression.Name(attrOwner).Equal(expression.Value(owner))
}

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
	// Free, or expired beyond the skew margin, or already mine (a retried ambiguous acquire).
	cond := expression.AttributeNotExists(expression.Name(attrOwner)).
		Or(expression.Name(attrExpiresAt).LessThan(expression.Value(now-tm.Skew.Milliseconds())), mine(owner))
	upd := expression.Set(expression.Name(attrOwner), expression.Value(owner)).
		Set(expression.Name(attrExpiresAt), expression.Value(now+tm.Lease.Milliseconds())).
		Set(expression.Name(attrFence), expression.Plus(expression.Name(attrFence).IfNotExists(expression.Value(0)), expression.Value(1)))
	out, err := l.update(ctx, ik, upd, cond, types.ReturnValueUpdatedNew)
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
	upd := expression.Set(expression.Name(attrExpiresAt), expression.Value(l.s.nowMs()+l.s.cfg.Lock.Lease.Milliseconds()))
	_, err := l.update(ctx, ik, upd, mine(owner), types.ReturnValueNone)
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
		upd := expression.Remove(expression.Name(attrOwner)).Remove(expression.Name(attrExpiresAt))
		_, err := l.update(ctx, ik, upd, mine(owner), types.ReturnValueNone)
		if err == nil || isCondFailed(err) || errors.Is(err, context.DeadlineExceeded) {
			return
		}
		// Transient: try again; if all attempts fail, the lease simply expires.
	}
}

// update runs one UpdateItem of upd on the lease item under cond.
func (l lockStore) update(ctx context.Context, ik map[string]types.AttributeValue, upd expression.UpdateBuilder,
	cond expression.ConditionBuilder, rv types.ReturnValue) (*dynamodb.UpdateItemOutput, error) {
	e, err := expr(expression.NewBuilder().WithUpdate(upd).WithCondition(cond))
	if err != nil {
		return nil, err
	}
	return l.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(l.s.cfg.Table),
		Key:                       ik,
		UpdateExpression:          e.Update(),
		ConditionExpression:       e.Condition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
		ReturnValues:              rv,
	})
}
