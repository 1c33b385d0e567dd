package dynamostore

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Intent item <tenant>#INTENT#<key> (sk INTENT). Drop does not delete it: it marks it done
// (gcAt set, out of the open-intents index). A done intent reads as absent everywhere.
const (
	attrToken     = "token"
	attrCreatedAt = "createdAt"
	attrDone      = "done"
)

// intentRetention is how long a done intent is kept before DynamoDB TTL may remove it.
const intentRetention = 24 * 60 * 60 // seconds

// intentStore is the Store's sandbox.IntentStore view.
type intentStore struct{ s *Store }

var _ sandbox.IntentStore = intentStore{}

// Put opens an intent for key with token, replacing a done one or one with a lower token;
// a higher open token is ErrConflict; the same token again is success and changes nothing.
func (v intentStore) Put(ctx context.Context, key string, token, now int64) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	item := itemKey(tenant, kindIntent, key)
	item[attrTenant] = avS(tenant)
	item[attrKey] = avS(key)
	item[attrToken] = avN(token)
	item[attrCreatedAt] = avN(now)
	item[attrIntentShard] = avS(shard(tenant, key))
	item[attrIntentAt] = avN(now)
	_, err = v.s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Item:                      item,
		ConditionExpression:       aws.String("attribute_not_exists(pk) OR attribute_exists(done) OR #token < :tok"),
		ExpressionAttributeNames:  map[string]string{"#token": attrToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{":tok": avN(token)},
	})
	return v.settle(ctx, tenant, key, "put", err, func(in *sandbox.Intent) bool {
		return in != nil && in.Token == token
	})
}

// Record sets the created sandbox id on the intent only while it is open and carries
// token; else ErrConflict.
func (v intentStore) Record(ctx context.Context, key string, token int64, psid string) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	if psid == "" {
		return sandbox.Invalid("providerSandboxId", "empty")
	}
	_, err = v.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Key:                       itemKey(tenant, kindIntent, key),
		UpdateExpression:          aws.String("SET providerSandboxId = :psid"),
		ConditionExpression:       aws.String("#token = :tok AND attribute_not_exists(done)"),
		ExpressionAttributeNames:  map[string]string{"#token": attrToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{":tok": avN(token), ":psid": avS(psid)},
	})
	return v.settle(ctx, tenant, key, "record", err, func(in *sandbox.Intent) bool {
		return in != nil && in.Token == token && in.ProviderSandboxID == psid
	})
}

// Get returns the open intent of key (consistent read); none or done: (nil, nil).
func (v intentStore) Get(ctx context.Context, key string) (*sandbox.Intent, error) {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return nil, err
	}
	return v.read(ctx, tenant, key)
}

// read returns the open intent (consistent); missing or done: (nil, nil).
func (v intentStore) read(ctx context.Context, tenant, key string) (*sandbox.Intent, error) {
	return readItem(ctx, v.s, tenant, kindIntent, key, "intent", decodeIntent)
}

// decodeIntent reads an intent item; a done intent is absent (nil).
func decodeIntent(item map[string]types.AttributeValue) (*sandbox.Intent, error) {
	if done, _, err := getBool(item, attrDone); err != nil || done {
		return nil, err
	}
	in := &sandbox.Intent{}
	var err error
	if in.Key, err = getS(item, attrKey); err == nil {
		if in.ProviderSandboxID, err = getS(item, attrPSID); err == nil {
			if in.Token, _, err = getN(item, attrToken); err == nil {
				in.CreatedAt, _, err = getN(item, attrCreatedAt)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return in, nil
}

// Drop closes the intent only while it carries token (marks it done, with gcAt); a
// missing or done intent is success; another open token is ErrConflict.
func (v intentStore) Drop(ctx context.Context, key string, token int64) error {
	tenant, err := scoped(ctx, "key", key)
	if err != nil {
		return err
	}
	_, err = v.s.cfg.Client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:        aws.String(v.s.cfg.Table),
		Key:              itemKey(tenant, kindIntent, key),
		UpdateExpression: aws.String("SET done = :true, gcAt = :gc REMOVE intentShard, intentAt"),
		// attribute_exists(done) makes a retried drop a no-op instead of a failure.
		ConditionExpression:      aws.String("#token = :tok OR attribute_exists(done)"),
		ExpressionAttributeNames: map[string]string{"#token": attrToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":tok": avN(token), ":true": avBool(true), ":gc": avN(v.s.cfg.Now().Unix() + intentRetention),
		},
	})
	return v.settle(ctx, tenant, key, "drop", err, func(in *sandbox.Intent) bool { return in == nil })
}

// settle finishes a conditional write on the intent (see settle).
func (v intentStore) settle(ctx context.Context, tenant, key, op string, err error, mine func(*sandbox.Intent) bool) error {
	return settle(err, op, "intent", key, func() (*sandbox.Intent, error) { return v.read(ctx, tenant, key) }, mine)
}
