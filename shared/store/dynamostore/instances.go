package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Instance item <tenant>#INST#<key> (sk INST): the record, its incarnation, a pending
// reclaim token, and the helpers of the global idle and pending-reclaim indexes.
const (
	attrProvider    = "provider"
	attrPSID        = "providerSandboxId"
	attrSnapshot    = "latestSnapshotId"
	attrThreadID    = "threadId"
	attrLatestRun   = "latestRunId"
	attrUpdatedAt   = "updatedAt"
	attrIncarnation = "incarnation"
	attrReclaiming  = "reclaiming"
	attrReclaimDue  = "reclaimDue"
	attrStaleSnaps  = "staleSnapshots" // SS: superseded snapshots whose delete is pending
	attrLifecycle   = "lifecycle"      // S: absent = running (docs/design.md §5)
	attrLifeSince   = "lifecycleSince"
	attrStopToken   = "stopToken"
)

// instanceRows is the Store's contract.InstanceRows view.
type instanceRows struct{ view }

var _ contract.InstanceRows = instanceRows{}

// instanceItem is the stored form of an instance row. A full write stores the record, a
// fresh incarnation and the idle-index helpers, so it drops a pending or deferred reclaim;
// the conditional updates below maintain the rest.
type instanceItem struct {
	keyAttrs
	Tenant            string   `dynamodbav:"tenant"`
	Key               string   `dynamodbav:"key"`
	Provider          string   `dynamodbav:"provider,omitempty"`
	ProviderSandboxID string   `dynamodbav:"providerSandboxId,omitempty"`
	LatestSnapshotID  string   `dynamodbav:"latestSnapshotId,omitempty"`
	ThreadID          string   `dynamodbav:"threadId,omitempty"`
	LatestRunID       string   `dynamodbav:"latestRunId,omitempty"`
	UpdatedAt         int64    `dynamodbav:"updatedAt"`
	Incarnation       string   `dynamodbav:"incarnation,omitempty"`
	Reclaiming        string   `dynamodbav:"reclaiming,omitempty"`
	ReclaimDue        int64    `dynamodbav:"reclaimDue,omitempty"`
	StaleSnapshots    []string `dynamodbav:"staleSnapshots,omitempty,stringset"`
	IdleShard         string   `dynamodbav:"idleShard,omitempty"`
	IdleAt            int64    `dynamodbav:"idleAt"`
	PendingShard      string   `dynamodbav:"pendingShard,omitempty"`
	PendingAt         int64    `dynamodbav:"pendingAt,omitempty"`
	DestroyOnEnd      bool     `dynamodbav:"destroyOnEnd,omitempty"`
	DestroyOnCancel   bool     `dynamodbav:"destroyOnCancel,omitempty"`
	IdleStopMs        int64    `dynamodbav:"idleStopMs,omitempty"`
	Lifecycle         string   `dynamodbav:"lifecycle,omitempty"`
	LifecycleSince    int64    `dynamodbav:"lifecycleSince,omitempty"`
	StopToken         string   `dynamodbav:"stopToken,omitempty"`
	// StopShard and StopAt (= the row's idleSince) list the row in the stop index while it
	// is running or stopping with no pending reclaim; StopAt stays on a tombstone (its
	// idleSince), StopShard does not.
	StopShard string `dynamodbav:"stopShard,omitempty"`
	StopAt    int64  `dynamodbav:"stopAt,omitempty"`
}

// instanceItemOf renders a full instance row (what every full write puts).
func instanceItemOf(tenant string, rec contract.InstanceRecord, incarnation string) (map[string]types.AttributeValue, error) {
	return encodeItem(instanceItem{
		keyAttrs: singleKey(tenant, kindInst, rec.Key), Tenant: tenant, Key: rec.Key,
		Provider: rec.Provider, ProviderSandboxID: rec.ProviderSandboxID, LatestSnapshotID: rec.LatestSnapshotID,
		ThreadID: rec.ThreadID, LatestRunID: rec.LatestRunID, UpdatedAt: rec.UpdatedAt,
		Incarnation: incarnation, IdleShard: shard(tenant, rec.Key), IdleAt: rec.UpdatedAt,
		DestroyOnEnd: rec.DestroyOnEnd, DestroyOnCancel: rec.DestroyOnCancel, IdleStopMs: rec.IdleStopMs,
		LifecycleSince: rec.UpdatedAt,
		StopShard:      shard(tenant, rec.Key), StopAt: rec.UpdatedAt,
	})
}

func decodeInstance(m map[string]types.AttributeValue) (*contract.InstanceRow, error) {
	it, err := decodeItem[instanceItem](m)
	if err != nil {
		return nil, err
	}
	slices.Sort(it.StaleSnapshots)
	return &contract.InstanceRow{
		InstanceRecord: contract.InstanceRecord{
			Key: it.Key, Provider: it.Provider, ProviderSandboxID: it.ProviderSandboxID,
			LatestSnapshotID: it.LatestSnapshotID, ThreadID: it.ThreadID, LatestRunID: it.LatestRunID,
			UpdatedAt: it.UpdatedAt, DestroyOnEnd: it.DestroyOnEnd, DestroyOnCancel: it.DestroyOnCancel,
			IdleStopMs: it.IdleStopMs,
		},
		Incarnation: it.Incarnation, Reclaiming: it.Reclaiming, ReclaimDue: it.ReclaimDue,
		StaleSnapshots: it.StaleSnapshots,
		Lifecycle:      it.Lifecycle, LifecycleSince: it.LifecycleSince, StopToken: it.StopToken, IdleSince: it.StopAt,
	}, nil
}

// GetRow returns the row of key with its incarnation (consistent read); missing: (nil, nil).
func (v instanceRows) GetRow(ctx context.Context, key string) (*contract.InstanceRow, error) {
	return v.read(ctx, key)
}

// read returns the row (consistent); missing: (nil, nil).
func (v instanceRows) read(ctx context.Context, key string) (*contract.InstanceRow, error) {
	return readItem(ctx, v.s, v.tenant, kindInst, key, "instance", decodeInstance)
}

// CreateRow writes rec stamped with incarnation only if no row exists; a row already
// carrying incarnation is this call's own landed write (success); else ErrConflict.
func (v instanceRows) CreateRow(ctx context.Context, rec contract.InstanceRecord, incarnation string) error {
	item, err := instanceItemOf(v.tenant, rec, incarnation)
	if err != nil {
		return err
	}
	err = v.s.putAbsent(ctx, item)
	return v.settle(ctx, rec.Key, "create", err, func(row *contract.InstanceRow) bool {
		return row != nil && row.Incarnation == incarnation
	})
}

// ReplaceRow fully replaces the row only while it still has incarnation prev and no
// pending reclaim, stamping next; a row already at next is this call's own landed write.
func (v instanceRows) ReplaceRow(ctx context.Context, rec contract.InstanceRecord, prev, next string) error {
	cond := expression.Name(attrIncarnation).Equal(expression.Value(prev)).
		And(expression.AttributeNotExists(expression.Name(attrReclaiming)))
	err := v.put(ctx, rec, next, &cond)
	return v.settle(ctx, rec.Key, "replace", err, func(row *contract.InstanceRow) bool {
		return row != nil && row.Incarnation == next
	})
}

// put writes the full row of rec stamped with incarnation, under cond when not nil; the
// error is the call's own (a failed condition unwrapped, for settle).
func (v instanceRows) put(ctx context.Context, rec contract.InstanceRecord, incarnation string, cond *expression.ConditionBuilder) error {
	item, err := instanceItemOf(v.tenant, rec, incarnation)
	if err != nil {
		return err
	}
	in := &dynamodb.PutItemInput{TableName: aws.String(v.s.cfg.Table), Item: item}
	if cond != nil {
		e, err := expr(expression.NewBuilder().WithCondition(*cond))
		if err != nil {
			return err
		}
		in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.Condition(), e.Names(), e.Values()
	}
	_, err = v.s.cfg.Client.PutItem(ctx, in)
	return err
}

// Touch sets latestRunId and updatedAt only while providerSandboxId is still psid and no
// reclaim is pending; else ErrConflict. Repeating it is harmless, so a failed condition
// needs no re-read.
func (v instanceRows) Touch(ctx context.Context, key, psid, latestRunID string, now int64) error {
	// A run resumed the sandbox: a deferred reclaim is off (a lingering pending-index entry
	// is cleared by the next sweep that lists it).
	upd := expression.Set(expression.Name(attrUpdatedAt), expression.Value(now)).
		Set(expression.Name(attrIdleAt), expression.Value(now))
	if latestRunID != "" {
		upd = upd.Set(expression.Name(attrLatestRun), expression.Value(latestRunID))
	} else {
		upd = upd.Remove(expression.Name(attrLatestRun))
	}
	upd = upd.Remove(expression.Name(attrReclaimDue))
	// Running from now: listed for the idle stop again, no stop token.
	upd = upd.Remove(expression.Name(attrLifecycle)).Remove(expression.Name(attrStopToken)).
		Set(expression.Name(attrLifeSince), expression.Value(now)).
		Set(expression.Name(attrStopShard), expression.Value(shard(v.tenant, key))).
		Set(expression.Name(attrStopAt), expression.Value(now))
	// attribute_exists(pk): an UpdateItem on a missing key would create the row.
	cond := allOf(rowExists(), eqS(attrPSID, psid), noReclaim(),
		expression.Or(expression.AttributeNotExists(expression.Name(attrLifecycle)),
			expression.Name(attrLifecycle).NotEqual(expression.Value(contract.LifecycleStopping))))
	return v.update(ctx, key, "touch", upd, cond)
}

// SetSnapshot replaces latestSnapshotId prev by snapshotID (one conditional UpdateItem)
// only while providerSandboxId is psid and latestSnapshotId is prev; a superseded prev is
// added to staleSnapshots and the row listed in the pending-reclaims index, so the reaper
// retries its delete. A row already at snapshotID is this call's own landed write.
func (v instanceRows) SetSnapshot(ctx context.Context, key, psid, prev, snapshotID string, now int64) error {
	upd := expression.Set(expression.Name(attrSnapshot), expression.Value(snapshotID)).
		Set(expression.Name(attrUpdatedAt), expression.Value(now)).
		Set(expression.Name(attrIdleAt), expression.Value(now))
	if prev != "" {
		upd = upd.Set(expression.Name(attrPendingShard), expression.Value(shard(v.tenant, key))).
			Set(expression.Name(attrPendingAt), expression.Value(now)).
			Add(expression.Name(attrStaleSnaps), expression.Value(&types.AttributeValueMemberSS{Value: []string{prev}}))
	}
	err := v.write(ctx, key, upd, allOf(rowExists(), eqS(attrPSID, psid), eqS(attrSnapshot, prev)))
	return v.settle(ctx, key, "set snapshot", err, func(row *contract.InstanceRow) bool {
		return row != nil && row.ProviderSandboxID == psid && row.LatestSnapshotID == snapshotID
	})
}

// DropStaleSnapshot removes snapshotID from staleSnapshots (an emptied set vanishes; the
// pending listing it leaves is cleared by the next sweep that lists the row); a missing row
// is success.
func (v instanceRows) DropStaleSnapshot(ctx context.Context, key, snapshotID string) error {
	upd := expression.Delete(expression.Name(attrStaleSnaps), expression.Value(&types.AttributeValueMemberSS{Value: []string{snapshotID}}))
	err := v.update(ctx, key, "drop stale snapshot", upd, rowExists())
	if errors.Is(err, contract.ErrConflict) {
		return nil // no row: nothing to drop
	}
	return err
}

// MarkReclaiming tombstones the row with token only while providerSandboxId and updatedAt
// are as read, updatedAt <= idleBefore and no other reclaim is pending; a row already
// carrying token is this call's own landed write.
func (v instanceRows) MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error {
	upd := expression.Set(expression.Name(attrReclaiming), expression.Value(token)).
		Set(expression.Name(attrPendingShard), expression.Value(shard(v.tenant, key))).
		Set(expression.Name(attrPendingAt), expression.Name(attrUpdatedAt)).
		Remove(expression.Name(attrReclaimDue)).
		Remove(expression.Name(attrStopShard)) // a tombstone is never stopped
	cond := allOf(eqS(attrPSID, psid),
		expression.Name(attrUpdatedAt).Equal(expression.Value(updatedAt)),
		expression.Name(attrUpdatedAt).LessThanEqual(expression.Value(idleBefore)),
		noReclaim())
	err := v.write(ctx, key, upd, cond)
	return v.settle(ctx, key, "mark reclaiming", err, func(row *contract.InstanceRow) bool {
		return row != nil && row.Reclaiming == token
	})
}

// DeleteReclaimed deletes the row only while it carries reclaim token; a missing row is
// success (a retried delete); another token or none is ErrConflict.
func (v instanceRows) DeleteReclaimed(ctx context.Context, key, token string) error {
	e, err := expr(expression.NewBuilder().WithCondition(expression.Name(attrReclaiming).Equal(expression.Value(token))))
	if err != nil {
		return err
	}
	_, err = v.s.cfg.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Key:                       itemKey(v.tenant, kindInst, key),
		ConditionExpression:       e.Condition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	})
	return v.settle(ctx, key, "delete reclaimed", err, func(row *contract.InstanceRow) bool {
		return row == nil
	})
}

// DeferReclaim sets reclaimDue and lists the row in the pending-reclaims index at due (0
// removes both) while providerSandboxId is psid and no reclaim is pending; else ErrConflict.
// Repeating it is harmless.
func (v instanceRows) DeferReclaim(ctx context.Context, key, psid string, due int64) error {
	conds := []expression.ConditionBuilder{rowExists(), eqS(attrPSID, psid), noReclaim()}
	if due > 0 {
		upd := expression.Set(expression.Name(attrReclaimDue), expression.Value(due)).
			Set(expression.Name(attrPendingShard), expression.Value(shard(v.tenant, key))).
			Set(expression.Name(attrPendingAt), expression.Value(due))
		return v.update(ctx, key, "defer reclaim", upd, allOf(conds...))
	}
	// Clearing: the listing goes too unless stale snapshots still need it.
	upd := expression.Remove(expression.Name(attrReclaimDue)).
		Remove(expression.Name(attrPendingShard)).Remove(expression.Name(attrPendingAt))
	err := v.update(ctx, key, "clear deferred reclaim", upd,
		allOf(append(conds, expression.AttributeNotExists(expression.Name(attrStaleSnaps)))...))
	if errors.Is(err, contract.ErrConflict) {
		err = v.update(ctx, key, "clear deferred reclaim", expression.Remove(expression.Name(attrReclaimDue)), allOf(conds...))
	}
	return err
}

// MarkStopping marks the row stopping with token (one conditional UpdateItem) while
// providerSandboxId and updatedAt are as read, no reclaim is pending and the row is running
// or stopping; a row stopping with token is this call's own landed write.
func (v instanceRows) MarkStopping(ctx context.Context, key, psid string, updatedAt int64, token string, now int64) error {
	upd := expression.Set(expression.Name(attrLifecycle), expression.Value(contract.LifecycleStopping)).
		Set(expression.Name(attrLifeSince), expression.Value(now)).
		Set(expression.Name(attrStopToken), expression.Value(token))
	cond := allOf(eqS(attrPSID, psid),
		expression.Name(attrUpdatedAt).Equal(expression.Value(updatedAt)),
		noReclaim(),
		expression.Or(expression.AttributeNotExists(expression.Name(attrLifecycle)),
			expression.Name(attrLifecycle).Equal(expression.Value(contract.LifecycleStopping))))
	err := v.write(ctx, key, upd, cond)
	return v.settle(ctx, key, "mark stopping", err, func(row *contract.InstanceRow) bool {
		return row != nil && row.Lifecycle == contract.LifecycleStopping && row.StopToken == token
	})
}

// SettleStop ends the stop carrying token (one conditional UpdateItem): stopped, archived or
// gone leave the stop index; running (the stop failed or was given up) is listed again from now.
// The row keeps token in every end state, so a retry whose first attempt landed (its
// answer lost) is recognised as this call's own (docs/design.md §2.1).
func (v instanceRows) SettleStop(ctx context.Context, key, token, lifecycle string, now int64) error {
	upd := expression.Set(expression.Name(attrLifeSince), expression.Value(now))
	if lifecycle == contract.LifecycleRunning {
		upd = upd.Remove(expression.Name(attrLifecycle)).
			Set(expression.Name(attrStopShard), expression.Value(shard(v.tenant, key))).
			Set(expression.Name(attrStopAt), expression.Value(now))
	} else {
		upd = upd.Set(expression.Name(attrLifecycle), expression.Value(lifecycle)).
			Remove(expression.Name(attrStopShard)).Remove(expression.Name(attrStopAt))
	}
	cond := allOf(rowExists(), eqS(attrStopToken, token),
		expression.Name(attrLifecycle).Equal(expression.Value(contract.LifecycleStopping)))
	err := v.write(ctx, key, upd, cond)
	return v.settle(ctx, key, "settle stop", err, func(row *contract.InstanceRow) bool {
		return row != nil && row.Lifecycle == lifecycle && row.StopToken == token
	})
}

// DeferStop sets the row's idleSince (its stop-index sort key) while providerSandboxId is
// psid, no reclaim is pending and the row is running; else ErrConflict.
func (v instanceRows) DeferStop(ctx context.Context, key, psid string, idleSince int64) error {
	upd := expression.Set(expression.Name(attrStopShard), expression.Value(shard(v.tenant, key))).
		Set(expression.Name(attrStopAt), expression.Value(idleSince))
	cond := allOf(rowExists(), eqS(attrPSID, psid), noReclaim(), expression.AttributeNotExists(expression.Name(attrLifecycle)))
	return v.update(ctx, key, "defer stop", upd, cond)
}

// update runs one conditional UpdateItem on an existing row (cond requires the row); a
// failed condition is ErrConflict.
func (v instanceRows) update(ctx context.Context, key, op string, upd expression.UpdateBuilder, cond expression.ConditionBuilder) error {
	err := v.write(ctx, key, upd, cond)
	switch {
	case isCondFailed(err):
		return fmt.Errorf("dynamostore: %s instance %q: condition failed: %w", op, key, contract.ErrConflict)
	case err != nil:
		return fmt.Errorf("dynamostore: %s instance %q: %w", op, key, err)
	}
	return nil
}

// write runs one UpdateItem of upd under cond; the error is the call's own.
func (v instanceRows) write(ctx context.Context, key string, upd expression.UpdateBuilder, cond expression.ConditionBuilder) error {
	return v.s.updateItem(ctx, itemKey(v.tenant, kindInst, key), expression.NewBuilder().WithUpdate(upd).WithCondition(cond))
}

// settle finishes a conditional write on the row (see settle).
func (v instanceRows) settle(ctx context.Context, key, op string, err error, mine func(*contract.InstanceRow) bool) error {
	return settle(err, op, "instance", key, func() (*contract.InstanceRow, error) { return v.read(ctx, key) }, mine)
}

// rowExists: an UpdateItem on a missing key would create the row.
func rowExists() expression.ConditionBuilder {
	return expression.AttributeExists(expression.Name(attrPK))
}

// noReclaim: no reclaim is pending on the row.
func noReclaim() expression.ConditionBuilder {
	return expression.AttributeNotExists(expression.Name(attrReclaiming))
}

// eqS is the condition that string attribute name equals v ("" = absent, since empty
// strings are never stored).
func eqS(name, v string) expression.ConditionBuilder {
	if v == "" {
		return expression.AttributeNotExists(expression.Name(name))
	}
	return expression.Name(name).Equal(expression.Value(v))
}
