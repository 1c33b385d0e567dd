package dynamostore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// maxListExamined bounds the index items one filtered listing page reads: a status filter
// that matches few runs answers a short page with a Next instead of reading a tenant's
// whole history in one request.
const maxListExamined = 1000

var (
	_ contract.RunLister  = fencedRuns{}
	_ contract.RowsReader = (*Store)(nil)
)

// tenantRunsRef is the value of byTenant: never empty (an index key cannot be), even for
// the empty tenant.
func tenantRunsRef(tenant string) string { return tenant + "#" }

// parseThreadSort inverts threadSortKey.
func parseThreadSort(v string) (contract.RunPos, error) {
	n, id, ok := strings.Cut(v, "#")
	u, err := strconv.ParseUint(n, 10, 64)
	if !ok || err != nil || len(n) != 20 || id == "" {
		return contract.RunPos{}, fmt.Errorf("dynamostore: %w: threadSort %q", errAttr, v)
	}
	return contract.RunPos{StartedAt: int64(u ^ (1 << 63)), RunID: id}, nil
}

// ListRuns returns up to limit runs of the caller's tenant matching f, newest first
// (contract.RunLister): one Query on runsByThread (a thread given) or runsByTenant, newest
// first and strictly below after's sort key, the status filtered in the index, then one
// consistent BatchGetItem of the hits; a hit whose item no longer matches (the index
// lags) is left out.
func (v fencedRuns) ListRuns(ctx context.Context, f contract.RunFilter, after *contract.RunPos, limit int) (contract.RunPage, error) {
	part := expression.Key(attrByTenant).Equal(expression.Value(tenantRunsRef(v.tenant)))
	index := IndexRunsByTenant
	if f.ThreadID != "" {
		index, part = IndexRunsByThread, expression.Key(attrByThread).Equal(expression.Value(threadRef(v.tenant, f.ThreadID)))
	}
	kc := part
	if after != nil {
		kc = part.And(expression.Key(attrThreadSort).LessThan(expression.Value(threadSortKey(after.StartedAt, after.RunID))))
	}
	b := expression.NewBuilder().WithKeyCondition(kc)
	if f.Status != "" {
		b = b.WithFilter(expression.Name(attrStatus).Equal(expression.Value(string(f.Status))))
	}
	e, err := expr(b)
	if err != nil {
		return contract.RunPage{}, err
	}
	q := &dynamodb.QueryInput{
		TableName:                 aws.String(v.s.cfg.Table),
		IndexName:                 aws.String(index),
		KeyConditionExpression:    e.KeyCondition(),
		FilterExpression:          e.Filter(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
		ScanIndexForward:          aws.Bool(false),
	}
	var (
		ids      []string
		next     *contract.RunPos
		examined int
	)
	for {
		// The filter applies after Limit: a filtered query reads a larger slice per call.
		q.Limit = aws.Int32(int32(limit - len(ids)))
		if f.Status != "" {
			q.Limit = aws.Int32(int32(min(maxListExamined-examined, max(limit, 100))))
		}
		out, err := v.s.cfg.Client.Query(ctx, q)
		if err != nil {
			return contract.RunPage{}, fmt.Errorf("dynamostore: query %s: %w", index, err)
		}
		examined += int(out.ScannedCount)
		for i, item := range out.Items {
			id, err := runIDOf(item, v.tenant)
			if err != nil {
				return contract.RunPage{}, err
			}
			ids = append(ids, id)
			if len(ids) < limit {
				continue
			}
			if i < len(out.Items)-1 || len(out.LastEvaluatedKey) > 0 {
				if next, err = posOf(item); err != nil {
					return contract.RunPage{}, err
				}
			}
			break
		}
		if len(ids) == limit || len(out.LastEvaluatedKey) == 0 {
			break
		}
		if examined >= maxListExamined {
			if next, err = posOf(out.LastEvaluatedKey); err != nil {
				return contract.RunPage{}, err
			}
			break
		}
		q.ExclusiveStartKey = out.LastEvaluatedKey
	}
	runs, err := v.s.batchReadRuns(ctx, v.tenant, ids)
	if err != nil {
		return contract.RunPage{}, err
	}
	byID := make(map[string]contract.RunState, len(runs))
	for _, r := range runs {
		byID[r.st.RunID] = r.st
	}
	page := contract.RunPage{Runs: make([]contract.RunState, 0, len(ids)), Next: next}
	for _, id := range ids {
		if st, ok := byID[id]; ok && f.Matches(st.RunRecord) {
			page.Runs = append(page.Runs, st)
		}
	}
	return page, nil
}

// posOf reads the listing position of an index item or key.
func posOf(item map[string]types.AttributeValue) (*contract.RunPos, error) {
	it, err := decodeItem[runItem](item)
	if err != nil {
		return nil, err
	}
	pos, err := parseThreadSort(it.ThreadSort)
	return &pos, err
}

// GetRows returns the instance rows of keys that exist, read consistently in one
// BatchGetItem per 100 keys (contract.RowsReader).
func (s *Store) GetRows(ctx context.Context, keys []string) (map[string]*contract.InstanceRow, error) {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return nil, err
	}
	req := make([]map[string]types.AttributeValue, 0, len(keys))
	seen := map[string]bool{}
	for _, key := range keys {
		if err := contract.CheckStoreID("key", key); err != nil {
			return nil, err
		}
		if !seen[key] {
			seen[key] = true
			req = append(req, itemKey(tenant, kindInst, key))
		}
	}
	out := map[string]*contract.InstanceRow{}
	err = s.batchEach(ctx, req, func(item map[string]types.AttributeValue) error {
		row, err := decodeInstance(item)
		if err != nil {
			return fmt.Errorf("dynamostore: instance: %w", err)
		}
		out[row.Key] = row
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
