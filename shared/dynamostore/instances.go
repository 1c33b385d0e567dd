package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/sandbox"
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
)

// instanceRows is the Store's sandbox.InstanceRows view.
type instanceRows struct{ s *Store }

var _ sandbox.InstanceRows = instanceRows{}

// instanceItem renders a full instance row (what every full write puts).
func instanceItem(tenant string, rec sandbox.InstanceRecord, incarnation string) map[string]types.AttributeValue {
	m := itemKey(tenant, kindInst, rec.Key)
	m[attrTenant] = avS(tenant)
	m[attrKey] = avS(rec.Key)
	putS(m, attrProvider, rec.Provider)
	putS(m, attrPSID, rec.ProviderSandboxID)
	putS(m, attrSnapshot, rec.LatestSnapshotID)
	putS(m, attrThreadID, rec.ThreadID)
	putS(m, attrLatestRun, rec.LatestRunID)
	m[attrUpdatedAt] = avN(rec.UpdatedAt)
	m[attrIncarnation] = avS(incarnation)
	m[attrIdleShard] = avS(shard(tenant, rec.Key))
	m[attrIdleAt] = avN(rec.UpdatedAt)
	return m
}

func decodeInstance(m map[string]types.AttributeValue) (*sandbox.InstanceRow, error) {
	var row sandbox.InstanceRow
	var err error
	str := func(name string, dst *string) {
		if err == nil {
			*dst, err = getS(m, name)
		}
	}
	str(attrKey, &row.Key)
	str(attrProvider, &row.Provider)
	str(attrPSID, &row.ProviderSandboxID)
	str(attrSnapshot, &row.LatestSnapshotID)
	str(attrThreadID, &row.ThreadID)
	str(attrLatestRun, &row.LatestRunID)
	str(attrIncarnation, &row.Incarnation)
	str(attrReclaiming, &row.Reclaiming)
	if err == nil {
		row.UpdatedAt, _, err = getN(m, attrUpdatedAt)
	}
	if err == nil {
		row.ReclaimDue, _, err = getN(m, attrReclaimDue)
	}
	if v, ok := m[attrStaleSnaps]; ok && err == nil {
		ss, isSS := v.(*types.AttributeValueMemberSS)
		if !isSS {
			return nil, fmt.Errorf("dynamostore: %w: %s is %T, want SS", errAttr, attrStaleSnaps, v)
		}
		row.StaleSnapshots = slices.Sorted(slices.Values(ss.Value))
	}
	if err != nil {
		return nil, err
	}
	return &row, nil
}

// Get returns the record of key; a missing key returns (nil, nil).
func (v instanceRows) Get(ctx context.Context, key string) (*sandbox.InstanceRecord, error) {
	row, err := v.GetRow(ctx, key)
	if err != nil || row == nil {
		return nil, err
	}
	return &row.InstanceRecord, nil
}

// GetRow returns the row of key with its incarnation (consistent read); missing: (nil, nil).
func (v instanceRows) GetRow(ctx context.Context, key string) (*sandbox.InstanceRow, error) {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return nil, err
	}
	return v.read(ctx, tenant, key)
}

// read returns the row (consistent); missing: (nil, nil).
func (v instanceRows) read(ctx context.Context, tenant, key string) (*sandbox.InstanceRow, error) {
	return readItem(ctx, v.s, tenant, kindInst, key, "instance", decodeInstance)
}

// Upsert fully replaces the record at rec.Key (one unconditional PutItem with a fresh
// incarnation): omitted optionals are cleared and a pending reclaim is forgotten.
func (v instanceRows) Upsert(ctx context.Context, rec sandbox.InstanceRecord) error {
	tenant, err := scoped(ctx, "key", rec.Key)
	if err != nil {
		return err
	}
	_, err = v.s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(v.s.cfg.Table),
		Item:      instanceItem(tenant, rec, newToken()),
	})
	if err != nil {
		return fmt.Errorf("dynamostore: upsert instance %q: %w", rec.Key, err)
	}
	return nil
}

// Delete removes key; deleting a missing key is a no-op returning nil.
func (v instanceRows) Delete(ctx context.Context, key string) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	_, err = v.s.cfg.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(v.s.cfg.Table),
		Key:       itemKey(tenant, kindInst, key),
	})
	if err != nil {
		return fmt.Errorf("dynamostore: delete instance %q: %w", key, err)
	}
	return nil
}

// CreateRow writes rec stamped with incarnation only if no row exists; a row already
// carrying incarnation is this call's own landed write (success); else ErrConflict.
func (v instanceRows) CreateRow(ctx context.Context, rec sandbox.InstanceRecord, incarnation string) error {
	tenant, err := scoped(ctx, "key", rec.Key)
	if err != nil {
		return err
	}
	if incarnation == "" {
		return sandbox.Invalid("incarnation", "empty")
	}
	_, err = v.s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:           aws.String(v.s.cfg.Table),
		Item:                instanceItem(tenant, rec, incarnation),
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	return v.settle(ctx, tenant, rec.Key, "create", err, func(row *sandbox.InstanceRow) bool {
		return row != nil && row.Incarnation == incarnation
	})
}

// ReplaceRow fully replaces the row only while it still has incarnation prev and no
// pending reclaim, stamping next; a row already at next is this call's own landed write.
func (v instanceRows) ReplaceRow(ctx context.Context, rec sandbox.InstanceRecord, prev, next string) error {
	tenant, err := scoped(ctx, "key", rec.Key)
	if err != nil {
		return err
	}
	if prev == "" || next == "" {
		return sandbox.Invalid("incarnation", "empty")
	}
	_, err = v.s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Item:                      instanceItem(tenant, rec, next),
		ConditionExpression:       aws.String("incarnation = :prev AND attribute_not_exists(reclaiming)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":prev": avS(prev)},
	})
	return v.settle(ctx, tenant, rec.Key, "replace", err, func(row *sandbox.InstanceRow) bool {
		return row != nil && row.Incarnation == next
	})
}

// Touch sets latestRunId and updatedAt only while providerSandboxId is still psid and no
// reclaim is pending; else ErrConflict. Repeating it is harmless, so a failed condition
// needs no re-read.
func (v instanceRows) Touch(ctx context.Context, key, psid, latestRunID string, now int64) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	vals := map[string]types.AttributeValue{":now": avN(now)}
	// A run resumed the sandbox: a deferred reclaim is off (a lingering pending-index entry
	// is cleared by the next sweep that lists it).
	update := "SET updatedAt = :now, idleAt = :now"
	if latestRunID != "" {
		update += ", latestRunId = :run REMOVE reclaimDue"
		vals[":run"] = avS(latestRunID)
	} else {
		update += " REMOVE latestRunId, reclaimDue"
	}
	// attribute_exists(pk): an UpdateItem on a missing key would create the row.
	cond := "attribute_exists(pk) AND " + eqS(attrPSID, ":psid", psid, vals) + " AND attribute_not_exists(reclaiming)"
	return v.update(ctx, tenant, key, "touch", update, cond, vals)
}

// SetSnapshot replaces latestSnapshotId prev by snapshotID (one conditional UpdateItem)
// only while providerSandboxId is psid and latestSnapshotId is prev; a superseded prev is
// added to staleSnapshots and the row listed in the pending-reclaims index, so the reaper
// retries its delete. A row already at snapshotID is this call's own landed write.
func (v instanceRows) SetSnapshot(ctx context.Context, key, psid, prev, snapshotID string, now int64) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	if snapshotID == "" {
		return sandbox.Invalid("snapshotId", "empty")
	}
	vals := map[string]types.AttributeValue{":now": avN(now), ":snap": avS(snapshotID)}
	update := "SET latestSnapshotId = :snap, updatedAt = :now, idleAt = :now"
	if prev != "" {
		update += ", pendingShard = :shard, pendingAt = :now ADD staleSnapshots :stale"
		vals[":shard"] = avS(shard(tenant, key))
		vals[":stale"] = &types.AttributeValueMemberSS{Value: []string{prev}}
	}
	cond := "attribute_exists(pk) AND " + eqS(attrPSID, ":psid", psid, vals) + " AND " + eqS(attrSnapshot, ":prev", prev, vals)
	_, err = v.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Key:                       itemKey(tenant, kindInst, key),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeValues: vals,
	})
	return v.settle(ctx, tenant, key, "set snapshot", err, func(row *sandbox.InstanceRow) bool {
		return row != nil && row.ProviderSandboxID == psid && row.LatestSnapshotID == snapshotID
	})
}

// DropStaleSnapshot removes snapshotID from staleSnapshots (an emptied set vanishes; the
// pending listing it leaves is cleared by the next sweep that lists the row); a missing row
// is success.
func (v instanceRows) DropStaleSnapshot(ctx context.Context, key, snapshotID string) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	if snapshotID == "" {
		return sandbox.Invalid("snapshotId", "empty")
	}
	vals := map[string]types.AttributeValue{":s": &types.AttributeValueMemberSS{Value: []string{snapshotID}}}
	err = v.update(ctx, tenant, key, "drop stale snapshot", "DELETE staleSnapshots :s", "attribute_exists(pk)", vals)
	if errors.Is(err, sandbox.ErrConflict) {
		return nil // no row: nothing to drop
	}
	return err
}

// MarkReclaiming tombstones the row with token only while providerSandboxId and updatedAt
// are as read, updatedAt <= idleBefore and no other reclaim is pending; a row already
// carrying token is this call's own landed write.
func (v instanceRows) MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	if token == "" {
		return sandbox.Invalid("token", "empty")
	}
	vals := map[string]types.AttributeValue{
		":tok": avS(token), ":shard": avS(shard(tenant, key)), ":u": avN(updatedAt), ":ib": avN(idleBefore),
	}
	cond := eqS(attrPSID, ":psid", psid, vals) +
		" AND updatedAt = :u AND updatedAt <= :ib AND attribute_not_exists(reclaiming)"
	_, err = v.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Key:                       itemKey(tenant, kindInst, key),
		UpdateExpression:          aws.String("SET reclaiming = :tok, pendingShard = :shard, pendingAt = updatedAt REMOVE reclaimDue"),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeValues: vals,
	})
	return v.settle(ctx, tenant, key, "mark reclaiming", err, func(row *sandbox.InstanceRow) bool {
		return row != nil && row.Reclaiming == token
	})
}

// DeleteReclaimed deletes the row only while it carries reclaim token; a missing row is
// success (a retried delete); another token or none is ErrConflict.
func (v instanceRows) DeleteReclaimed(ctx context.Context, key, token string) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	if token == "" {
		return sandbox.Invalid("token", "empty")
	}
	_, err = v.s.cfg.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Key:                       itemKey(tenant, kindInst, key),
		ConditionExpression:       aws.String("reclaiming = :tok"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":tok": avS(token)},
	})
	return v.settle(ctx, tenant, key, "delete reclaimed", err, func(row *sandbox.InstanceRow) bool {
		return row == nil
	})
}

// DeferReclaim sets reclaimDue and lists the row in the pending-reclaims index at due (0
// removes both) while providerSandboxId is psid and no reclaim is pending; else ErrConflict.
// Repeating it is harmless.
func (v instanceRows) DeferReclaim(ctx context.Context, key, psid string, due int64) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	if due < 0 {
		return sandbox.Invalid("due", "negative")
	}
	vals := map[string]types.AttributeValue{}
	cond := "attribute_exists(pk) AND " + eqS(attrPSID, ":psid", psid, vals) + " AND attribute_not_exists(reclaiming)"
	if due > 0 {
		vals[":due"], vals[":shard"] = avN(due), avS(shard(tenant, key))
		return v.update(ctx, tenant, key, "defer reclaim", "SET reclaimDue = :due, pendingShard = :shard, pendingAt = :due", cond, vals)
	}
	// Clearing: the listing goes too unless stale snapshots still need it.
	err = v.update(ctx, tenant, key, "clear deferred reclaim", "REMOVE reclaimDue, pendingShard, pendingAt",
		cond+" AND attribute_not_exists(staleSnapshots)", vals)
	if errors.Is(err, sandbox.ErrConflict) {
		err = v.update(ctx, tenant, key, "clear deferred reclaim", "REMOVE reclaimDue", cond, vals)
	}
	return err
}

// update runs one conditional UpdateItem on an existing row (cond requires the row).
func (v instanceRows) update(ctx context.Context, tenant, key, op, update, cond string, vals map[string]types.AttributeValue) error {
	_, err := v.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Key:                       itemKey(tenant, kindInst, key),
		UpdateExpression:          aws.String(update),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeValues: vals,
	})
	switch {
	case isCondFailed(err):
		return fmt.Errorf("dynamostore: %s instance %q: condition failed: %w", op, key, sandbox.ErrConflict)
	case err != nil:
		return fmt.Errorf("dynamostore: %s instance %q: %w", op, key, err)
	}
	return nil
}

// settle finishes a conditional write on the row (see settle).
func (v instanceRows) settle(ctx context.Context, tenant, key, op string, err error, mine func(*sandbox.InstanceRow) bool) error {
	return settle(err, op, "instance", key, func() (*sandbox.InstanceRow, error) { return v.read(ctx, tenant, key) }, mine)
}

// eqS returns a condition requiring string attribute name to equal v ("" = absent, since
// empty strings are never stored), adding the placeholder's value to vals.
func eqS(name, placeholder, v string, vals map[string]types.AttributeValue) string {
	if v == "" {
		return "attribute_not_exists(" + name + ")"
	}
	vals[placeholder] = avS(v)
	return name + " = " + placeholder
}
