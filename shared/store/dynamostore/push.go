package dynamostore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The deployed push's items (docs/design.md §3.1, §8.1):
//
//	connection    ~CONN#<connId>            CONN       tenant, slot, runs (string set), gcAt
//	slots         <tenant>#PUSH#conns       PUSH       slots (string set of "<expires s>|<connId>")
//	subscription  <tenant>#SUB#<runId>      <connId>   next, gcAt
//
// A connection item is the one key without a tenant prefix: the push service names a
// connection by its own id only ($disconnect and messages carry no authentication), and
// '~' never begins a tenant, so it cannot meet a tenant's key. Subscriptions have their
// own partition per run (not the log's: a log read queries its partition's tail).
const (
	kindPush   = "PUSH"
	kindSub    = "SUB"
	connPrefix = "~CONN#"
	connSK     = "CONN"
	attrSlot   = "slot"
	attrSlots  = "slots"
	attrRuns   = "runs"
)

// pushGrace is how long after PushLifetime the items of a connection are kept (gcAt).
const pushGrace = 3600 // seconds

var _ contract.PushStore = (*Store)(nil)

type subItem struct {
	keyAttrs
	Next int64 `dynamodbav:"next"`
	GCAt int64 `dynamodbav:"gcAt"`
}

type connItem struct {
	keyAttrs
	Tenant string   `dynamodbav:"tenant"`
	Slot   string   `dynamodbav:"slot"`
	Runs   []string `dynamodbav:"runs,stringset,omitempty"`
	GCAt   int64    `dynamodbav:"gcAt"`
}

func connKey(connID string) keyAttrs { return keyAttrs{PK: connPrefix + connID, SK: connSK} }

func subKey(tenant, runID, connID string) keyAttrs {
	return keyAttrs{PK: partition(tenant, kindSub, runID), SK: connID}
}

func slotsKey(tenant string) keyAttrs { return singleKey(tenant, kindPush, "conns") }

func sval(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
func nval(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func ssval(s ...string) types.AttributeValue { return &types.AttributeValueMemberSS{Value: s} }

// update runs one UpdateItem with literal expressions (names #-prefixed in names).
func (s *Store) update(ctx context.Context, key keyAttrs, upd, cond string, names map[string]string,
	values map[string]types.AttributeValue, ret types.ReturnValue) (*dynamodb.UpdateItemOutput, error) {
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(s.cfg.Table), Key: key.attrs(), UpdateExpression: aws.String(upd),
		ExpressionAttributeNames: names, ExpressionAttributeValues: values, ReturnValues: ret,
	}
	if cond != "" {
		in.ConditionExpression = aws.String(cond)
	}
	if len(values) == 0 {
		in.ExpressionAttributeValues = nil
	}
	return s.cfg.Client.UpdateItem(ctx, in)
}

// Connect puts the connection item unless it exists, then takes its slot in the tenant's
// set (ADD under a size condition: one item, so the bound holds under any concurrency),
// freeing lapsed slots once when it is full. A repeated $connect finds the item and
// re-adds the very slot it names, which a set holds once: the connection keeps one slot
// and its runs however often, or concurrently, it connects. A full tenant's refusal
// deletes the item again (while it names that slot).
func (s *Store) Connect(ctx context.Context, connID string, max int) error {
	return s.connect(ctx, connID, max, 1)
}

// connect is Connect, starting over at most again times when the item it found is gone.
func (s *Store) connect(ctx context.Context, connID string, max, again int) error {
	tenant, err := contract.PushScope(ctx, connID, "")
	if err != nil {
		return err
	}
	now := s.cfg.Now().Unix()
	expires := now + int64(contract.PushLifetime.Seconds())
	slot := strconv.FormatInt(expires, 10) + "|" + connID
	item, err := encodeItem(connItem{keyAttrs: connKey(connID), Tenant: tenant, Slot: slot, GCAt: expires + pushGrace})
	if err != nil {
		return err
	}
	_, err = s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.cfg.Table), Item: item,
		ConditionExpression: aws.String("attribute_not_exists(pk)")})
	if isCondFailed(err) {
		c, rerr := s.readConn(ctx, connID)
		switch {
		case rerr != nil:
			return rerr
		case c == nil && again > 0: // removed meanwhile (a refusal or a disconnect): anew
			return s.connect(ctx, connID, max, again-1)
		case c == nil:
			return fmt.Errorf("dynamostore: connect %q: removed while connecting: %w", connID, contract.ErrConflict)
		case c.Tenant != tenant:
			return fmt.Errorf("dynamostore: connect %q: open in another tenant: %w", connID, contract.ErrConflict)
		}
		slot, err = c.Slot, nil
	}
	if err != nil {
		return fmt.Errorf("dynamostore: connect %q: %w", connID, err)
	}
	take := func() error {
		_, err := s.update(ctx, slotsKey(tenant), "ADD #s :slot", "attribute_not_exists(#s) OR size(#s) < :max OR contains(#s, :one)",
			map[string]string{"#s": attrSlots}, map[string]types.AttributeValue{":slot": ssval(slot), ":one": sval(slot), ":max": nval(int64(max))}, "")
		return err
	}
	err = take()
	if isCondFailed(err) {
		if err = s.freeLapsedSlots(ctx, tenant, now); err == nil {
			err = take()
		}
	}
	switch {
	case isCondFailed(err):
		_, derr := s.cfg.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName: aws.String(s.cfg.Table), Key: connKey(connID).attrs(),
			ConditionExpression:       aws.String("#sl = :one"),
			ExpressionAttributeNames:  map[string]string{"#sl": attrSlot},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": sval(slot)},
		})
		if derr != nil && !isCondFailed(derr) {
			return fmt.Errorf("dynamostore: connect %q: remove the refused connection: %w", connID, derr)
		}
		return fmt.Errorf("dynamostore: connect %q: the tenant holds %d push connections: %w", connID, max, contract.ErrConflict)
	case err != nil:
		return fmt.Errorf("dynamostore: connect %q: %w", connID, err)
	}
	return nil
}

// freeLapsedSlots removes the tenant's slots whose connection outlived PushLifetime (its
// $disconnect never came).
func (s *Store) freeLapsedSlots(ctx context.Context, tenant string, now int64) error {
	out, err := s.cfg.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.cfg.Table),
		Key: slotsKey(tenant).attrs(), ConsistentRead: aws.Bool(true)})
	if err != nil || out.Item == nil {
		return err
	}
	var slots []string
	if err := attributevalue.Unmarshal(out.Item[attrSlots], &slots); err != nil {
		return fmt.Errorf("dynamostore: %w: slots: %w", errAttr, err)
	}
	var lapsed []string
	for _, sl := range slots {
		if exp, _, _ := strings.Cut(sl, "|"); mustInt(exp) < now {
			lapsed = append(lapsed, sl)
		}
	}
	if len(lapsed) == 0 {
		return nil
	}
	_, err = s.update(ctx, slotsKey(tenant), "DELETE #s :gone", "attribute_exists(pk)",
		map[string]string{"#s": attrSlots}, map[string]types.AttributeValue{":gone": ssval(lapsed...)}, "")
	if isCondFailed(err) {
		return nil
	}
	return err
}

func mustInt(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// ConnectionTenant reads the connection item.
func (s *Store) ConnectionTenant(ctx context.Context, connID string) (string, bool, error) {
	if err := contract.CheckStoreID("connId", connID); err != nil {
		return "", false, err
	}
	c, err := s.readConn(ctx, connID)
	if err != nil || c == nil {
		return "", false, err
	}
	return c.Tenant, true, nil
}

func (s *Store) readConn(ctx context.Context, connID string) (*connItem, error) {
	out, err := s.cfg.Client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(s.cfg.Table),
		Key: connKey(connID).attrs(), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("dynamostore: get connection %q: %w", connID, err)
	}
	if out.Item == nil {
		return nil, nil
	}
	return decodeItem[connItem](out.Item)
}

// Disconnect deletes the connection item (its old image names its runs and slot), then
// each subscription, then the slot: a crash between leaves items that expire (gcAt) and a
// slot that lapses.
func (s *Store) Disconnect(ctx context.Context, connID string) error {
	tenant, err := contract.PushScope(ctx, connID, "")
	if err != nil {
		return err
	}
	out, err := s.cfg.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: aws.String(s.cfg.Table), Key: connKey(connID).attrs(),
		ConditionExpression:       aws.String("#t = :t"),
		ExpressionAttributeNames:  map[string]string{"#t": attrTenant},
		ExpressionAttributeValues: map[string]types.AttributeValue{":t": sval(tenant)},
		ReturnValues:              types.ReturnValueAllOld,
	})
	switch {
	case isCondFailed(err):
		return nil // absent, or not this tenant's: nothing of ours to remove
	case err != nil:
		return fmt.Errorf("dynamostore: disconnect %q: %w", connID, err)
	}
	c, err := decodeItem[connItem](out.Attributes)
	if err != nil {
		return err
	}
	for _, run := range c.Runs {
		if _, err := s.cfg.Client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName: aws.String(s.cfg.Table), Key: subKey(tenant, run, connID).attrs()}); err != nil {
			return fmt.Errorf("dynamostore: disconnect %q: subscription to %q: %w", connID, run, err)
		}
	}
	_, err = s.update(ctx, slotsKey(tenant), "DELETE #s :slot", "attribute_exists(pk)",
		map[string]string{"#s": attrSlots}, map[string]types.AttributeValue{":slot": ssval(c.Slot)}, "")
	if err != nil && !isCondFailed(err) {
		return fmt.Errorf("dynamostore: disconnect %q: slot: %w", connID, err)
	}
	return nil
}

// Subscribe adds the run to the connection's set under the bound (one conditional
// UpdateItem), then puts the subscription item, replacing an earlier one (a restart).
func (s *Store) Subscribe(ctx context.Context, connID, runID string, after int64, max int) error {
	tenant, err := contract.PushScope(ctx, connID, runID)
	if err != nil {
		return err
	}
	_, err = s.update(ctx, connKey(connID), "ADD #r :rs",
		"attribute_exists(pk) AND #t = :t AND (attribute_not_exists(#r) OR size(#r) < :max OR contains(#r, :run))",
		map[string]string{"#r": attrRuns, "#t": attrTenant},
		map[string]types.AttributeValue{":rs": ssval(runID), ":run": sval(runID), ":t": sval(tenant), ":max": nval(int64(max))}, "")
	if isCondFailed(err) {
		c, rerr := s.readConn(ctx, connID)
		switch {
		case rerr != nil:
			return rerr
		case c == nil || c.Tenant != tenant:
			return fmt.Errorf("dynamostore: subscribe %q: connection not open: %w", connID, contract.ErrUnknownRun)
		}
		return fmt.Errorf("dynamostore: subscribe %q: the connection holds %d subscriptions: %w", connID, max, contract.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("dynamostore: subscribe %q to %q: %w", connID, runID, err)
	}
	item, err := encodeItem(subItem{keyAttrs: subKey(tenant, runID, connID), Next: after,
		GCAt: s.cfg.Now().Unix() + int64(contract.PushLifetime.Seconds()) + pushGrace})
	if err != nil {
		return err
	}
	if _, err := s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(s.cfg.Table), Item: item}); err != nil {
		return fmt.Errorf("dynamostore: subscribe %q to %q: %w", connID, runID, err)
	}
	return nil
}

// Unsubscribe deletes the subscription item, then takes the run out of the connection's
// set.
func (s *Store) Unsubscribe(ctx context.Context, connID, runID string) error {
	tenant, err := contract.PushScope(ctx, connID, runID)
	if err != nil {
		return err
	}
	in := &dynamodb.DeleteItemInput{TableName: aws.String(s.cfg.Table), Key: subKey(tenant, runID, connID).attrs()}
	if _, err := s.cfg.Client.DeleteItem(ctx, in); err != nil {
		return fmt.Errorf("dynamostore: unsubscribe %q from %q: %w", connID, runID, err)
	}
	_, err = s.update(ctx, connKey(connID), "DELETE #r :rs", "attribute_exists(pk) AND #t = :t",
		map[string]string{"#r": attrRuns, "#t": attrTenant}, map[string]types.AttributeValue{":rs": ssval(runID), ":t": sval(tenant)}, "")
	if err != nil && !isCondFailed(err) {
		return fmt.Errorf("dynamostore: unsubscribe %q from %q: %w", connID, runID, err)
	}
	return nil
}

// Subscriptions queries the run's subscription partition, consistently.
func (s *Store) Subscriptions(ctx context.Context, runID string) ([]contract.Subscription, error) {
	tenant, err := contract.Scope(ctx, "runId", runID)
	if err != nil {
		return nil, err
	}
	var out []contract.Subscription
	in := &dynamodb.QueryInput{
		TableName: aws.String(s.cfg.Table), ConsistentRead: aws.Bool(true),
		KeyConditionExpression:    aws.String("pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": sval(partition(tenant, kindSub, runID))},
	}
	for {
		page, err := s.cfg.Client.Query(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("dynamostore: subscriptions of %q: %w", runID, err)
		}
		for _, m := range page.Items {
			it, err := decodeItem[subItem](m)
			if err != nil {
				return nil, err
			}
			out = append(out, it.subscription(runID))
		}
		if len(page.LastEvaluatedKey) == 0 {
			return out, nil
		}
		in.ExclusiveStartKey = page.LastEvaluatedKey
	}
}

func (it *subItem) subscription(runID string) contract.Subscription {
	return contract.Subscription{RunID: runID, ConnID: it.SK, Next: it.Next}
}
