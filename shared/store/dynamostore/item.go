package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Item kinds: the middle part of every base partition key, <tenant>#<KIND>#<id>. A tenant
// never contains '#' (contract.CheckTenant), so the tenant prefix is unambiguous.
const (
	kindRun    = "RUN"
	kindInst   = "INST"
	kindLock   = "LOCK"
	kindIntent = "INTENT"
	kindLog    = "LOG"
)

// Record attribute names shared by several item kinds (the JSON names of the contracts).
const (
	attrRunID = "runId"
	attrKey   = "key"
)

// partition returns the base partition key <tenant>#<kind>#<id>.
func partition(tenant, kind, id string) string { return tenant + "#" + kind + "#" + id }

// keyAttrs is the primary key of an item; every item type embeds it.
type keyAttrs struct {
	PK string `dynamodbav:"pk"`
	SK string `dynamodbav:"sk"`
}

// singleKey is the key of a single-item kind (run, instance, lock, intent): its sort key is
// the kind itself.
func singleKey(tenant, kind, id string) keyAttrs {
	return keyAttrs{PK: partition(tenant, kind, id), SK: kind}
}

// itemKey returns the primary key of a single-item kind as request attributes.
func itemKey(tenant, kind, id string) map[string]types.AttributeValue {
	return singleKey(tenant, kind, id).attrs()
}

// attrs renders the key; two strings always encode.
func (k keyAttrs) attrs() map[string]types.AttributeValue {
	m, _ := attributevalue.MarshalMap(k)
	return m
}

// encodeItem renders a typed item (a struct of the item types below) for a write.
func encodeItem(v any) (map[string]types.AttributeValue, error) {
	m, err := attributevalue.MarshalMap(v)
	if err != nil {
		return nil, fmt.Errorf("dynamostore: encode %T: %w", v, err)
	}
	return m, nil
}

// decodeItem reads a stored item into its typed form; an attribute of the wrong type is
// errAttr.
func decodeItem[T any](m map[string]types.AttributeValue) (*T, error) {
	v := new(T)
	if err := attributevalue.UnmarshalMap(m, v); err != nil {
		return nil, fmt.Errorf("dynamostore: %w: %w", errAttr, err)
	}
	return v, nil
}

// expr renders the built expression b (names and values as placeholders); the builders
// here are fixed names and plain values, so an error is a programming error reported as
// one.
func expr(b expression.Builder) (expression.Expression, error) {
	e, err := b.Build()
	if err != nil {
		return expression.Expression{}, fmt.Errorf("dynamostore: build expression: %w", err)
	}
	return e, nil
}

// updateItem runs one UpdateItem of the item at key with the update and condition of b;
// the error is the call's own (callers settle a failed condition).
func (s *Store) updateItem(ctx context.Context, key map[string]types.AttributeValue, b expression.Builder) error {
	e, err := expr(b)
	if err != nil {
		return err
	}
	_, err = s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.cfg.Table),
		Key:                       key,
		UpdateExpression:          e.Update(),
		ConditionExpression:       e.Condition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	})
	return err
}

// allOf is the conjunction of conds (one or more).
func allOf(conds ...expression.ConditionBuilder) expression.ConditionBuilder {
	if len(conds) == 1 {
		return conds[0]
	}
	return expression.And(conds[0], conds[1], conds[2:]...)
}

// parsePartition splits <tenant>#<kind>#<id>; ok is false for any other shape.
func parsePartition(pk, kind string) (tenant, id string, ok bool) {
	tenant, rest, found := strings.Cut(pk, "#")
	if !found {
		return "", "", false
	}
	id, found = strings.CutPrefix(rest, kind+"#")
	return tenant, id, found
}

// shard places (tenant, id) on one of the Shards partitions of a global index.
func shard(tenant, id string) string {
	h := fnv.New32a()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(id))
	return shardName(int(h.Sum32() % Shards))
}

// shardName is the stored value of shard number n.
func shardName(n int) string { return fmt.Sprintf("%02d", n) }

// backoffStep is a jittered delay growing with attempt, capped at 200 ms.
func backoffStep(attempt int) time.Duration {
	d := min(time.Duration(1<<min(attempt, 8))*time.Millisecond, 200*time.Millisecond)
	return d/2 + rand.N(d/2+1)
}

// pad renders a non-negative number for a sort key (log slots): zero-padded to 20 digits
// so string order is numeric order.
func pad(n int64) string { return fmt.Sprintf("%020d", n) }

// sortInt renders any int64 so that string order is numeric order (negative values too):
// the sign bit is flipped and the result zero-padded to 20 digits.
func sortInt(n int64) string { return fmt.Sprintf("%020d", uint64(n)^(1<<63)) }

// errAttr reports a stored attribute of the wrong type or form.
var errAttr = errors.New("malformed attribute")

// putAbsent writes item only if no item has its key (attribute_not_exists(pk)); the error
// is the call's own (a failed condition unwrapped).
func (s *Store) putAbsent(ctx context.Context, item map[string]types.AttributeValue) error {
	_, err := s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                aws.String(s.cfg.Table),
		Item:                     item,
		ConditionExpression:      s.absent.Condition(),
		ExpressionAttributeNames: maps.Clone(s.absent.Names()), // a fresh map per call: nothing shared goes to the SDK
	})
	return err
}

// isCondFailed reports whether err is a failed ConditionExpression.
func isCondFailed(err error) bool {
	var ccf *types.ConditionalCheckFailedException
	return errors.As(err, &ccf)
}
