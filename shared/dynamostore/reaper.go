package dynamostore

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// reaperSource is the Store's cross-tenant sandbox.ReaperSource view. Each listing queries
// every shard of its global index once (Limit = limit, so at most Shards × limit items are
// read) and merges; the indexes may lag, so callers re-read every hit under its tenant.
type reaperSource struct{ s *Store }

var _ sandbox.ReaperSource = reaperSource{}

// ReclaimCandidates returns up to limit running runs with reclaimAt <= now, ascending
// reclaimAt (cancelled runs have 0, so they come first); ties by tenant, then run id.
func (v reaperSource) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]sandbox.Candidate, error) {
	return topK(ctx, v.s, IndexReclaim, attrReclaimShard, attrReclaimAt, attrRunID, &now, limit,
		func(tenant, id string, at int64) sandbox.Candidate {
			return sandbox.Candidate{Tenant: tenant, RunID: id, ReclaimAt: at}
		})
}

// PendingReclaims returns up to limit instance rows carrying a reclaim token, oldest
// updatedAt (as tombstoned) first.
func (v reaperSource) PendingReclaims(ctx context.Context, limit int) ([]sandbox.InstanceRef, error) {
	return topK(ctx, v.s, IndexPendingReclaims, attrPendingShard, attrPendingAt, attrKey, nil, limit, instanceRef)
}

// IdleInstances returns up to limit instance rows with updatedAt <= before, oldest first.
func (v reaperSource) IdleInstances(ctx context.Context, before int64, limit int) ([]sandbox.InstanceRef, error) {
	return topK(ctx, v.s, IndexIdleInstances, attrIdleShard, attrIdleAt, attrKey, &before, limit, instanceRef)
}

func instanceRef(tenant, key string, updatedAt int64) sandbox.InstanceRef {
	return sandbox.InstanceRef{Tenant: tenant, Key: key, UpdatedAt: updatedAt}
}

// StaleIntents returns up to limit open intents with createdAt <= before, oldest first.
func (v reaperSource) StaleIntents(ctx context.Context, before int64, limit int) ([]sandbox.IntentRef, error) {
	return topK(ctx, v.s, IndexOpenIntents, attrIntentShard, attrIntentAt, attrKey, &before, limit,
		func(tenant, key string, at int64) sandbox.IntentRef {
			return sandbox.IntentRef{Tenant: tenant, Key: key, CreatedAt: at}
		})
}

// hit is one index entry of a global listing.
type hit struct {
	tenant, id string
	at         int64
}

// topK queries each shard of index for up to limit items (key condition on the shard, and
// on the sort attribute <= *upTo unless upTo is nil) and returns the limit smallest by sort
// value, ties by tenant then id, each projected by ref.
func topK[T any](ctx context.Context, s *Store, index, shardAttr, sortAttr, idAttr string, upTo *int64, limit int,
	ref func(tenant, id string, at int64) T) ([]T, error) {
	if limit <= 0 {
		return nil, sandbox.Invalid("limit", "%d is not positive", limit)
	}
	var hits []hit
	for sh := range Shards {
		names := map[string]string{"#s": shardAttr}
		vals := map[string]types.AttributeValue{":s": avS(shardName(sh))}
		kc := "#s = :s"
		if upTo != nil {
			kc += " AND #a <= :a"
			names["#a"] = sortAttr
			vals[":a"] = avN(*upTo)
		}
		out, err := s.cfg.Client.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(s.cfg.Table),
			IndexName:                 aws.String(index),
			KeyConditionExpression:    aws.String(kc),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: vals,
			Limit:                     aws.Int32(int32(min(limit, 1<<20))),
		})
		if err != nil {
			return nil, fmt.Errorf("dynamostore: query %s shard %d: %w", index, sh, err)
		}
		for _, item := range out.Items {
			var h hit
			var err error
			if h.tenant, err = getS(item, attrTenant); err == nil {
				if h.id, err = getS(item, idAttr); err == nil {
					h.at, _, err = getN(item, sortAttr)
				}
			}
			if err != nil {
				return nil, err
			}
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
