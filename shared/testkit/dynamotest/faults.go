package dynamotest

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/stalltest"
)

// Faults at the dynamostore.Client seam: the tests wrap the SDK client so a store meets a
// stalled or rewritten call, with nothing in the store knowing a test is running. The
// wrappers read a call's key and resolved expressions, never the store's own constants,
// so they hold however the store spells its expressions.

// StallingClient is a dynamostore.Client whose lock renewals can be stalled per lock key
// (any tenant): a stalled renewal is held back — it never reaches DynamoDB — until its
// context ends or the stall is lifted, and then fails, as over a partition between the
// holder and its lease item. Every other call, acquires and releases included, passes
// through. Safe for concurrent use.
type StallingClient struct {
	dynamostore.Client
	stalls stalltest.Set
}

// NewStallingClient wraps inner with no stall in force.
func NewStallingClient(inner dynamostore.Client) *StallingClient {
	return &StallingClient{Client: inner}
}

// StallRenewals holds back every renewal of key's lease from its return until resume is
// called; stalls nest and resume is idempotent (the shape of testkit.RenewStaller).
func (c *StallingClient) StallRenewals(key string) (resume func()) { return c.stalls.Stall(key) }

// Held returns how many renewals were held back so far (a stall test proves with it that
// the stall path was taken).
func (c *StallingClient) Held() int64 { return c.stalls.Held() }

// UpdateItem holds back a stalled key's renewal; everything else goes to the inner client.
func (c *StallingClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if key, ok := lockKey(in.Key); ok && lockWrite(in) == lockRenew {
		if err := c.stalls.Hold(ctx, key); err != nil {
			return nil, fmt.Errorf("dynamotest: renewal of lock %q: %w", key, err)
		}
	}
	return c.Client.UpdateItem(ctx, in, opts...)
}

// UnconditionalLocks returns inner with every lock acquire's condition made always true,
// so an acquire takes a lease another owner holds: the deliberate defect the lock tests'
// negative controls must detect. Renewals and releases keep their conditions.
func UnconditionalLocks(inner dynamostore.Client) dynamostore.Client {
	return unconditionalLocks{inner}
}

type unconditionalLocks struct{ dynamostore.Client }

// UpdateItem sends an acquire with its condition defeated (every placeholder stays used,
// as DynamoDB requires).
func (c unconditionalLocks) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if _, ok := lockKey(in.Key); ok && lockWrite(in) == lockAcquire && in.ConditionExpression != nil {
		cp := *in
		names := map[string]string{"#dynamotestPK": "pk"}
		for k, v := range in.ExpressionAttributeNames {
			names[k] = v
		}
		cond := "(" + *in.ConditionExpression + ") OR attribute_exists(#dynamotestPK) OR attribute_not_exists(#dynamotestPK)"
		cp.ConditionExpression, cp.ExpressionAttributeNames = &cond, names
		in = &cp
	}
	return c.Client.UpdateItem(ctx, in, opts...)
}

// lockKey returns the lock key of a lease item's key (pk <tenant>#LOCK#<key>, sk LOCK;
// a tenant never contains '#').
func lockKey(key map[string]types.AttributeValue) (string, bool) {
	sk, ok := key["sk"].(*types.AttributeValueMemberS)
	if !ok || sk.Value != "LOCK" {
		return "", false
	}
	pk, ok := key["pk"].(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	_, rest, ok := strings.Cut(pk.Value, "#")
	if !ok {
		return "", false
	}
	return strings.CutPrefix(rest, "LOCK#")
}

// The lock writes, told apart by what their update expression assigns.
const (
	lockOther   = iota
	lockAcquire // sets the owner
	lockRenew   // sets the expiry alone
)

var placeholder = regexp.MustCompile(`#[A-Za-z0-9_]+`)

// lockWrite classifies an UpdateItem of a lease item by the attributes its SET clause
// assigns (names resolved): the owner — an acquire; the expiry without the owner — a
// renewal; anything else (a REMOVE: a release) — other.
func lockWrite(in *dynamodb.UpdateItemInput) int {
	if in.UpdateExpression == nil {
		return lockOther
	}
	expr := placeholder.ReplaceAllStringFunc(*in.UpdateExpression, func(p string) string {
		if n, ok := in.ExpressionAttributeNames[p]; ok {
			return n
		}
		return p
	})
	set, ok := strings.CutPrefix(strings.TrimSpace(expr), "SET ")
	if !ok {
		return lockOther
	}
	assigned := map[string]bool{}
	for _, a := range strings.Split(set, ",") {
		if lhs, _, ok := strings.Cut(a, "="); ok {
			assigned[strings.TrimSpace(lhs)] = true
		}
	}
	switch {
	case assigned["owner"]:
		return lockAcquire
	case assigned["expiresAt"]:
		return lockRenew
	}
	return lockOther
}

// Stallable is a dynamostore.Store over a StallingClient whose Locks() also has
// StallRenewals (testkit.RenewStaller, keepertest.RenewStaller), so the lease-loss proofs
// run on it. Every other method, the optional capabilities included, is the store's own.
type Stallable struct {
	*dynamostore.Store
	Client *StallingClient
}

// NewStallable returns a Store over cfg with cfg.Client wrapped in a StallingClient.
func NewStallable(cfg dynamostore.Config) *Stallable {
	c := NewStallingClient(cfg.Client)
	cfg.Client = c
	return &Stallable{Store: dynamostore.New(cfg), Client: c}
}

// Locks returns the store's lock store with StallRenewals attached.
func (s *Stallable) Locks() contract.LockStore {
	return stallableLocks{s.Store.Locks().(leaseLockStore), s.Client}
}

// leaseLockStore is the store's lock view with its step-by-step lease (contract.LeaseLocks),
// which the wrapper keeps.
type leaseLockStore interface {
	contract.LockStore
	contract.LeaseLocks
}

type stallableLocks struct {
	leaseLockStore
	client *StallingClient
}

// StallRenewals holds back key's renewals at the store's client until resume is called.
func (l stallableLocks) StallRenewals(key string) (resume func()) { return l.client.StallRenewals(key) }

// FailingClient is a dynamostore.Client failing calls chosen by Fail: each call first asks
// Fail(op) ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "BatchGetItem"),
// and a non-nil answer is returned as the call's error without reaching DynamoDB — a
// failure at the client, no proxy needed (use the Proxy where the wire is the point:
// a lost response, the SDK's retries). Fail must be safe for concurrent use.
type FailingClient struct {
	dynamostore.Client
	Fail func(op string) error
}

func (c FailingClient) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if err := c.Fail("GetItem"); err != nil {
		return nil, err
	}
	return c.Client.GetItem(ctx, in, opts...)
}

func (c FailingClient) PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	if err := c.Fail("PutItem"); err != nil {
		return nil, err
	}
	return c.Client.PutItem(ctx, in, opts...)
}

func (c FailingClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if err := c.Fail("UpdateItem"); err != nil {
		return nil, err
	}
	return c.Client.UpdateItem(ctx, in, opts...)
}

func (c FailingClient) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	if err := c.Fail("DeleteItem"); err != nil {
		return nil, err
	}
	return c.Client.DeleteItem(ctx, in, opts...)
}

func (c FailingClient) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	if err := c.Fail("Query"); err != nil {
		return nil, err
	}
	return c.Client.Query(ctx, in, opts...)
}

func (c FailingClient) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	if err := c.Fail("BatchGetItem"); err != nil {
		return nil, err
	}
	return c.Client.BatchGetItem(ctx, in, opts...)
}
