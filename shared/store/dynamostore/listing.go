package dynamostore

import (
	"cmp"
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

// Index queries are never ConsistentRead (DynamoDB offers none on global indexes), so
// every listing that feeds a decision re-reads its hits from the base items.

// queryAll queries index (key condition kc, filter when not nil) to exhaustion, in
// descending sort order when desc, limit items a page (0: no limit), calling each for
// every item.
func (s *Store) queryAll(ctx context.Context, index string, kc expression.KeyConditionBuilder, filter *expression.ConditionBuilder,
	desc bool, limit int32, each func(map[string]types.AttributeValue) error) error {
	b := expression.NewBuilder().WithKeyCondition(kc)
	if filter != nil {
		b = b.WithFilter(*filter)
	}
	e, err := expr(b)
	if err != nil {
		return err
	}
	q := &dynamodb.QueryInput{
		TableName:                 aws.String(s.cfg.Table),
		IndexName:                 aws.String(index),
		KeyConditionExpression:    e.KeyCondition(),
		FilterExpression:          e.Filter(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	}
	if desc {
		q.ScanIndexForward = aws.Bool(false)
	}
	if limit > 0 {
		q.Limit = aws.Int32(limit)
	}
	for {
		out, err := s.cfg.Client.Query(ctx, q)
		if err != nil {
			return fmt.Errorf("dynamostore: query %s: %w", aws.ToString(q.IndexName), err)
		}
		for _, item := range out.Items {
			if err := each(item); err != nil {
				return err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		q.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// runIDOf returns the run id of a run item's (or index projection's) partition key.
func runIDOf(item map[string]types.AttributeValue, tenant string) (string, error) {
	k, err := decodeItem[keyAttrs](item)
	if err != nil {
		return "", err
	}
	pk := k.PK
	t, id, ok := parsePartition(pk, kindRun)
	if !ok || t != tenant {
		return "", fmt.Errorf("dynamostore: %w: run key %q outside tenant %q", errAttr, pk, tenant)
	}
	return id, nil
}

// FindActiveRun returns the thread's running run with the greatest startedAt (ties:
// greatest runId); none: (nil, nil). Index hits are walked newest first and each is
// re-read (consistent) until one is still running: typically one Query and one GetItem.
func (v fencedRuns) FindActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	var found *contract.RunRecord
	errFound := errors.New("found") // ends the walk at the first live hit
	kc := expression.Key(attrActiveThread).Equal(expression.Value(threadRef(v.tenant, threadID)))
	err := v.s.queryAll(ctx, IndexActiveByThread, kc, nil, true, 4, func(item map[string]types.AttributeValue) error {
		id, err := runIDOf(item, v.tenant)
		if err != nil {
			return err
		}
		r, err := v.read(ctx, id)
		if err != nil {
			return err
		}
		if r != nil && r.st.Status == contract.StatusRunning && r.st.ThreadID == threadID {
			found = &r.st.RunRecord
			return errFound
		}
		return nil // a stale hit: skip it
	})
	if err != nil && err != errFound {
		return nil, err
	}
	return found, nil
}

// ListByThread returns every run of the thread, finished ones included, ascending
// startedAt (ties: runId), from the runsByThread index (a listing, not a decision).
func (v fencedRuns) ListByThread(ctx context.Context, threadID string) ([]contract.RunRecord, error) {
	out := []contract.RunRecord{}
	kc := expression.Key(attrByThread).Equal(expression.Value(threadRef(v.tenant, threadID)))
	err := v.s.queryAll(ctx, IndexRunsByThread, kc, nil, false, 0, func(item map[string]types.AttributeValue) error {
		r, err := decodeRun(item)
		if err != nil {
			return err
		}
		out = append(out, r.st.RunRecord)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b contract.RunRecord) int {
		return cmp.Or(cmp.Compare(a.StartedAt, b.StartedAt), cmp.Compare(a.RunID, b.RunID))
	})
	return out, nil
}

// ListReclaimable returns the tenant's running runs with detachedSince <= now-ttlMs,
// oldest detachment first: every shard of the reclaim index is queried for reclaimAt <=
// the cutoff (a detached run's reclaimAt is its detachedSince, or 0 when cancelled), the
// hits are filtered to the tenant and re-read consistently.
func (v fencedRuns) ListReclaimable(ctx context.Context, now, ttlMs int64) ([]contract.RunRecord, error) {
	cutoff := now - ttlMs
	var ids []string
	for sh := range Shards {
		kc := expression.Key(attrReclaimShard).Equal(expression.Value(shardName(sh))).
			And(expression.Key(attrReclaimAt).LessThanEqual(expression.Value(cutoff)))
		mine := expression.Name(attrTenant).Equal(expression.Value(v.tenant))
		err := v.s.queryAll(ctx, IndexReclaim, kc, &mine, false, 0, func(item map[string]types.AttributeValue) error {
			h, err := decodeItem[indexHit](item)
			if err != nil {
				return err
			}
			ids = append(ids, h.RunID)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	runs, err := v.s.batchReadRuns(ctx, v.tenant, ids)
	if err != nil {
		return nil, err
	}
	out := []contract.RunRecord{}
	for _, r := range runs {
		st := r.st
		if st.Status == contract.StatusRunning && st.DetachedSince != nil && *st.DetachedSince <= cutoff {
			out = append(out, st.RunRecord)
		}
	}
	slices.SortFunc(out, func(a, b contract.RunRecord) int {
		return cmp.Or(cmp.Compare(*a.DetachedSince, *b.DetachedSince), cmp.Compare(a.RunID, b.RunID))
	})
	return out, nil
}

// batchReadRuns re-reads runs consistently (batchEach); runs that no longer exist are left
// out.
func (s *Store) batchReadRuns(ctx context.Context, tenant string, ids []string) ([]*storedRun, error) {
	keys := make([]map[string]types.AttributeValue, 0, len(ids))
	for _, id := range ids {
		keys = append(keys, itemKey(tenant, kindRun, id))
	}
	var out []*storedRun
	err := s.batchEach(ctx, keys, func(item map[string]types.AttributeValue) error {
		r, err := decodeRun(item)
		out = append(out, r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RunsUsingKey returns the ids of non-terminal runs stamped with sandbox key, from the
// runsByKey index, which may lag: callers re-read each before acting on it.
func (v fencedRuns) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	ids := []string{}
	kc := expression.Key(attrKeyRef).Equal(expression.Value(keyRefOf(v.tenant, key)))
	err := v.s.queryAll(ctx, IndexRunsByKey, kc, nil, false, 0, func(item map[string]types.AttributeValue) error {
		id, err := runIDOf(item, v.tenant)
		ids = append(ids, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return ids, nil
}
