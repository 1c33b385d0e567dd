package dynamostore

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// reaperSource is the Store's cross-tenant contract.ReaperSource view. Each listing queries
// every shard of its global index once (Limit = limit, so at most Shards × limit items are
// read) and merges; the indexes may lag, so callers re-read every hit under its tenant.
type reaperSource struct{ s *Store }

var _ contract.ReaperSource = reaperSource{}

// ReclaimCandidates returns up to limit running runs with reclaimAt <= now, ascending
// reclaimAt (cancelled runs have 0, so they come first); ties by tenant, then run id.
func (v reaperSource) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]contract.Candidate, error) {
	return topK(ctx, v.s, IndexReclaim, attrReclaimShard, attrReclaimAt, &now, limit,
		func(h indexHit) (string, int64) { return h.RunID, h.ReclaimAt },
		func(tenant, id string, at int64) contract.Candidate {
			return contract.Candidate{Tenant: tenant, RunID: id, ReclaimAt: at}
		})
}

// PendingReclaims returns up to limit instance rows carrying a reclaim token, oldest
// updatedAt (as tombstoned) first.
func (v reaperSource) PendingReclaims(ctx context.Context, limit int) ([]contract.InstanceRef, error) {
	return topK(ctx, v.s, IndexPendingReclaims, attrPendingShard, attrPendingAt, nil, limit,
		func(h indexHit) (string, int64) { return h.Key, h.PendingAt }, instanceRef)
}

// IdleInstances returns up to limit instance rows with updatedAt <= before, oldest first.
func (v reaperSource) IdleInstances(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return topK(ctx, v.s, IndexIdleInstances, attrIdleShard, attrIdleAt, &before, limit,
		func(h indexHit) (string, int64) { return h.Key, h.IdleAt }, instanceRef)
}

// StopCandidates returns up to limit running or stopping instance rows with idleSince <=
// before, oldest first.
func (v reaperSource) StopCandidates(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return topK(ctx, v.s, IndexStopCandidates, attrStopShard, attrStopAt, &before, limit,
		func(h indexHit) (string, int64) { return h.Key, h.StopAt }, instanceRef)
}

func instanceRef(tenant, key string, updatedAt int64) contract.InstanceRef {
	return contract.InstanceRef{Tenant: tenant, Key: key, UpdatedAt: updatedAt}
}

// StaleIntents returns up to limit open intents with createdAt <= before, oldest first.
func (v reaperSource) StaleIntents(ctx context.Context, before int64, limit int) ([]contract.IntentRef, error) {
	return topK(ctx, v.s, IndexOpenIntents, attrIntentShard, attrIntentAt, &before, limit,
		func(h indexHit) (string, int64) { return h.Key, h.IntentAt },
		func(tenant, key string, at int64) contract.IntentRef {
			return contract.IntentRef{Tenant: tenant, Key: key, CreatedAt: at}
		})
}

// indexHit is what a global index projects of an item: the item's tenant, its id (runId or
// key) and the index's sort attribute.
type indexHit struct {
	Tenant    string `dynamodbav:"tenant"`
	RunID     string `dynamodbav:"runId"`
	Key       string `dynamodbav:"key"`
	ReclaimAt int64  `dynamodbav:"reclaimAt"`
	IdleAt    int64  `dynamodbav:"idleAt"`
	PendingAt int64  `dynamodbav:"pendingAt"`
	IntentAt  int64  `dynamodbav:"intentAt"`
	StopAt    int64  `dynamodbav:"stopAt"`
}

// hit is one index entry of a global listing.
type hit struct {
	tenant, id string
	at         int64
}

// topK queries each shard of index for up to limit items (key condition on the shard, and
// on the sort attribute <= *upTo unless upTo is nil) and returns the limit smallest by sort
// value, ties by tenant then id; pick reads a hit's id and sort value, ref projects it.
func topK[T any](ctx context.Context, s *Store, index, shardAttr, sortAttr string, upTo *int64, limit int,
	pick func(indexHit) (string, int64), ref func(tenant, id string, at int64) T) ([]T, error) {
	if limit <= 0 {
		return nil, contract.Invalid("limit", "%d is not positive", limit)
	}
	var hits []hit
	for sh := range Shards {
		kc := expression.Key(shardAttr).Equal(expression.Value(shardName(sh)))
		if upTo != nil {
			kc = kc.And(expression.Key(sortAttr).LessThanEqual(expression.Value(*upTo)))
		}
		e, err := expr(expression.NewBuilder().WithKeyCondition(kc))
		if err != nil {
			return nil, err
		}
		out, err := s.cfg.Client.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(s.cfg.Table),
			IndexName:                 aws.String(index),
			KeyConditionExpression:    e.KeyCondition(),
			ExpressionAttributeNames:  e.Names(),
			ExpressionAttributeValues: e.Values(),
			Limit:                     aws.Int32(int32(min(limit, 1<<20))),
		})
		if err != nil {
			return nil, fmt.Errorf("dynamostore: query %s shard %d: %w", index, sh, err)
		}
		for _, item := range out.Items {
			ih, err := decodeItem[indexHit](item)
			if err != nil {
				return nil, err
			}
			h := hit{tenant: ih.Tenant}
			h.id, h.at = pick(*ih)
			hits = append(hits, h)
		}
	}
	slices.SortFunc(hits, func(a, b hit) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.id, b.id))
	})
	out := make([]T, 0, min(len(hits), limit))
	for _, h := range hits[:min(len(hits), limit)] {
		out = append(out, ref(h.tenant, h.id, h.at))
	}
	return out, nil
}
