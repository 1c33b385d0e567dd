package dynamostore

import (
	"cmp"
	"context"
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

func checkLimit(limit int) error {
	if limit <= 0 {
		return sandbox.Invalid("limit", "%d is not positive", limit)
	}
	return nil
}

// hit is one index entry of a global listing.
type hit struct {
	tenant, id string
	at         int64
}

// topK queries each shard of index for up to limit items (key condition on the shard,
// and on the sort attribute <= upTo when hasUpTo) and returns the limit smallest by sort
// value, ties by tenant then id.
func (v reaperSource) topK(ctx context.Context, index, shardAttr, sortAttr, idAttr string, upTo int64, hasUpTo bool, limit int) ([]hit, error) {
	var hits []hit
	for sh := range Shards {
		names := map[string]string{"#s": shardAttr}
		vals := map[string]types.AttributeValue{":s": avS(shardName(sh))}
		kc := "#s = :s"
		if hasUpTo {
			kc += " AND #a <= :a"
			names["#a"] = sortAttr
			vals[":a"] = avN(upTo)
		}
		out, err := v.s.cfg.Client.Query(ctx, &dynamodb.QueryInput{
			TableName:                 aws.String(v.s.cfg.Table),
			IndexName:                 aws.String(index),
			KeyConditionExpression:    aws.String(kc),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: vals,
			Limit:                     aws.Int32(int32(min(limit, 1<<20))),
		})
		if err != nil {
			return nil, err
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
	return hits[:min(len(hits), limit)], nil
}

// ReclaimCandidates returns up to limit running runs with reclaimAt <= now, ascending
// reclaimAt (cancelled runs have 0, so they come first); ties by tenant, then run id.
func (v reaperSource) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]sandbox.Candidate, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	hits, err := v.topK(ctx, IndexReclaim, attrReclaimShard, attrReclaimAt, attrRunID, now, true, limit)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.Candidate, 0, len(hits))
	for _, h := range hits {
		out = append(out, sandbox.Candidate{Tenant: h.tenant, RunID: h.id, ReclaimAt: h.at})
	}
	return out, nil
}

// PendingReclaims returns up to limit instance rows carrying a reclaim token, oldest
// updatedAt (as tombstoned) first.
func (v reaperSource) PendingReclaims(ctx context.Context, limit int) ([]sandbox.InstanceRef, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	return v.instances(ctx, IndexPendingReclaims, attrPendingShard, attrPendingAt, 0, false, limit)
}

// IdleInstances returns up to limit instance rows with updatedAt <= before, oldest first.
func (v reaperSource) IdleInstances(ctx context.Context, before int64, limit int) ([]sandbox.InstanceRef, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	return v.instances(ctx, IndexIdleInstances, attrIdleShard, attrIdleAt, before, true, limit)
}

func (v reaperSource) instances(ctx context.Context, index, shardAttr, sortAttr string, upTo int64, hasUpTo bool, limit int) ([]sandbox.InstanceRef, error) {
	hits, err := v.topK(ctx, index, shardAttr, sortAttr, attrKey, upTo, hasUpTo, limit)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.InstanceRef, 0, len(hits))
	for _, h := range hits {
		out = append(out, sandbox.InstanceRef{Tenant: h.tenant, Key: h.id, UpdatedAt: h.at})
	}
	return out, nil
}

// StaleIntents returns up to limit open intents with createdAt <= before, oldest first.
func (v reaperSource) StaleIntents(ctx context.Context, before int64, limit int) ([]sandbox.IntentRef, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	hits, err := v.topK(ctx, IndexOpenIntents, attrIntentShard, attrIntentAt, attrKey, before, true, limit)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.IntentRef, 0, len(hits))
	for _, h := range hits {
		out = append(out, sandbox.IntentRef{Tenant: h.tenant, Key: h.id, CreatedAt: h.at})
	}
	return out, nil
}
