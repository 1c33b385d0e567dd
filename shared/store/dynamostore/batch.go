package dynamostore

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// GetRowAndIntent returns the instance row and the open intent of key, both read
// consistently in one BatchGetItem (contract.RowIntentReader); missing items are nil.
func (s *Store) GetRowAndIntent(ctx context.Context, key string) (*contract.InstanceRow, *contract.Intent, error) {
	tenant, err := contract.Scope(ctx, "key", key)
	if err != nil {
		return nil, nil, err
	}
	rowKey, intentKey := itemKey(tenant, kindInst, key), itemKey(tenant, kindIntent, key)
	items, err := s.batchGet(ctx, rowKey, intentKey)
	if err != nil {
		return nil, nil, err
	}
	var row *contract.InstanceRow
	var in *contract.Intent
	if item := items[partition(tenant, kindInst, key)]; item != nil {
		if row, err = decodeInstance(item); err != nil {
			return nil, nil, fmt.Errorf("dynamostore: instance %q: %w", key, err)
		}
	}
	if item := items[partition(tenant, kindIntent, key)]; item != nil {
		if in, err = decodeIntent(item); err != nil {
			return nil, nil, fmt.Errorf("dynamostore: intent %q: %w", key, err)
		}
	}
	return row, in, nil
}

// GetStateAndRow returns a run's state and the instance row of key, both read
// consistently in one BatchGetItem (contract.StateRowReader); missing items are nil.
func (s *Store) GetStateAndRow(ctx context.Context, runID, key string) (*contract.RunState, *contract.InstanceRow, error) {
	tenant, err := contract.Scope(ctx, "runId", runID)
	if err != nil {
		return nil, nil, err
	}
	if err := contract.CheckStoreID("key", key); err != nil {
		return nil, nil, err
	}
	items, err := s.batchGet(ctx, itemKey(tenant, kindRun, runID), itemKey(tenant, kindInst, key))
	if err != nil {
		return nil, nil, err
	}
	var st *contract.RunState
	var row *contract.InstanceRow
	if item := items[partition(tenant, kindRun, runID)]; item != nil {
		r, err := decodeRun(item)
		if err != nil {
			return nil, nil, fmt.Errorf("dynamostore: run %q: %w", runID, err)
		}
		st = &r.st
	}
	if item := items[partition(tenant, kindInst, key)]; item != nil {
		if row, err = decodeInstance(item); err != nil {
			return nil, nil, fmt.Errorf("dynamostore: instance %q: %w", key, err)
		}
	}
	return st, row, nil
}

// batchGet reads a few items consistently (batchEach), returning them by partition key.
func (s *Store) batchGet(ctx context.Context, keys ...map[string]types.AttributeValue) (map[string]map[string]types.AttributeValue, error) {
	out := map[string]map[string]types.AttributeValue{}
	err := s.batchEach(ctx, keys, func(item map[string]types.AttributeValue) error {
		k, err := decodeItem[keyAttrs](item)
		if err != nil {
			return err
		}
		out[k.PK] = item
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// batchEach reads items consistently with BatchGetItem, 100 keys a call and again for
// unprocessed keys, calling each for every item that exists, in no particular order.
func (s *Store) batchEach(ctx context.Context, keys []map[string]types.AttributeValue, each func(map[string]types.AttributeValue) error) error {
	for len(keys) > 0 {
		n := min(len(keys), 100)
		req := map[string]types.KeysAndAttributes{s.cfg.Table: {Keys: keys[:n], ConsistentRead: aws.Bool(true)}}
		keys = keys[n:]
		for attempt := 0; len(req) > 0; attempt++ {
			if attempt > 0 {
				if err := sleepCtx(ctx, backoffStep(attempt)); err != nil {
					return err
				}
			}
			res, err := s.cfg.Client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				return fmt.Errorf("dynamostore: batch get: %w", err)
			}
			for _, item := range res.Responses[s.cfg.Table] {
				if err := each(item); err != nil {
					return err
				}
			}
			req = res.UnprocessedKeys
		}
	}
	return nil
}
