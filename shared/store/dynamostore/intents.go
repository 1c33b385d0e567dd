package dynamostore

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Intent item <tenant>#INTENT#<key> (sk INTENT). Drop does not delete it: it marks it done
// (gcAt set, out of the open-intents index). A done intent reads as absent everywhere.
const (
	attrToken     = "token"
	attrCreatedAt = "createdAt"
	attrDone      = "done"
)

// intentItem is the stored form of an intent; intentShard and intentAt list it in the
// open-intents index while it is open.
type intentItem struct {
	keyAttrs
	Tenant            string `dynamodbav:"tenant"`
	Key               string `dynamodbav:"key"`
	Token             int64  `dynamodbav:"token"`
	CreatedAt         int64  `dynamodbav:"createdAt"`
	ProviderSandboxID string `dynamodbav:"providerSandboxId,omitempty"`
	Done              bool   `dynamodbav:"done,omitempty"`
	IntentShard       string `dynamodbav:"intentShard,omitempty"`
	IntentAt          int64  `dynamodbav:"intentAt"`
}

// intentRetention is how long a done intent is kept before DynamoDB TTL may remove it.
const intentRetention = 24 * 60 * 60 // seconds

// intentStore is the Store's contract.IntentStore view.
type intentStore struct{ view }

var _ contract.IntentStore = intentStore{}

// Put opens an intent for key with token, replacing a done one or one with a lower token;
// a higher open token is ErrConflict; the same token again is success and changes nothing.
func (v intentStore) Put(ctx context.Context, key string, token, now int64) error {
	item, err := encodeItem(intentItem{
		keyAttrs: singleKey(v.tenant, kindIntent, key), Tenant: v.tenant, Key: key, Token: token, CreatedAt: now,
		IntentShard: shard(v.tenant, key), IntentAt: now,
	})
	if err != nil {
		return err
	}
	e, err := expr(expression.NewBuilder().WithCondition(expression.Or(
		expression.AttributeNotExists(expression.Name(attrPK)),
		expression.AttributeExists(expression.Name(attrDone)),
		expression.Name(attrToken).LessThan(expression.Value(token)),
	)))
	if err != nil {
		return err
	}
	_, err = v.s.cfg.Client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                 aws.String(v.s.cfg.Table),
		Item:                      item,
		ConditionExpression:       e.Condition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
	})
	return v.settle(ctx, key, "put", err, func(in *contract.Intent) bool {
		return in != nil && in.Token == token
	})
}

// Record sets the created sandbox id on the intent only while it is open and carries
// token; else ErrConflict.
func (v intentStore) Record(ctx context.Context, key string, token int64, psid string) error {
	err := v.update(ctx, key, expression.NewBuilder().
		WithUpdate(expression.Set(expression.Name(attrPSID), expression.Value(psid))).
		WithCondition(expression.Name(attrToken).Equal(expression.Value(token)).
			And(expression.AttributeNotExists(expression.Name(attrDone)))))
	return v.settle(ctx, key, "record", err, func(in *contract.Intent) bool {
		return in != nil && in.Token == token && in.ProviderSandboxID == psid
	})
}

// Get returns the open intent of key (consistent read); none or done: (nil, nil).
func (v intentStore) Get(ctx context.Context, key string) (*contract.Intent, error) {
	return v.read(ctx, key)
}

// read returns the open intent (consistent); missing or done: (nil, nil).
func (v intentStore) read(ctx context.Context, key string) (*contract.Intent, error) {
	return readItem(ctx, v.s, v.tenant, kindIntent, key, "intent", decodeIntent)
}

// decodeIntent reads an intent item; a done intent is absent (nil).
func decodeIntent(item map[string]types.AttributeValue) (*contract.Intent, error) {
	it, err := decodeItem[intentItem](item)
	if err != nil || it.Done {
		return nil, err
	}
	return &contract.Intent{Key: it.Key, Token: it.Token, ProviderSandboxID: it.ProviderSandboxID, CreatedAt: it.CreatedAt}, nil
}

// Drop closes the intent only while it carries token (marks it done, with gcAt); a
// missing or done intent is success; another open token is ErrConflict.
func (v intentStore) Drop(ctx context.Context, key string, token int64) error {
	err := v.update(ctx, key, expression.NewBuilder().
		WithUpdate(expression.Set(expression.Name(attrDone), expression.Value(true)).
			Set(expression.Name(attrGCAt), expression.Value(v.s.cfg.Now().Unix()+intentRetention)).
			Remove(expression.Name(attrIntentShard)).Remove(expression.Name(attrIntentAt))).
		// attribute_exists(done) makes a retried drop a no-op instead of a failure.
		WithCondition(expression.Name(attrToken).Equal(expression.Value(token)).
			Or(expression.AttributeExists(expression.Name(attrDone)))))
	return v.settle(ctx, key, "drop", err, func(in *contract.Intent) bool { return in == nil })
}

// update runs one conditional UpdateItem on the intent built by b.
func (v intentStore) update(ctx context.Context, key string, b expression.Builder) error {
	return v.s.updateItem(ctx, itemKey(v.tenant, kindIntent, key), b)
}

// settle finishes a conditional write on the intent (see settle).
func (v intentStore) settle(ctx context.Context, key, op string, err error, mine func(*contract.Intent) bool) error {
	return settle(err, op, "intent", key, func() (*contract.Intent, error) { return v.read(ctx, key) }, mine)
}
