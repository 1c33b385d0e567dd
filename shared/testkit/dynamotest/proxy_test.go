package dynamotest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// proxied returns a proxy in front of the local engine, a client through it with the
// given number of attempts, and a fresh table created directly (not through the proxy).
func proxied(t *testing.T, attempts int) (*dynamotest.Proxy, *dynamodb.Client, string) {
	t.Helper()
	table := dynamotest.FreshTable(t, dynamotest.Client(t))
	p := dynamotest.NewProxy(dynamotest.Endpoint(t))
	t.Cleanup(p.Close)
	return p, dynamotest.NewClient(p.URL(), dynamotest.FastRetries(attempts)), table
}

func putIfAbsent(table, pk string) *dynamodb.PutItemInput {
	return &dynamodb.PutItemInput{
		TableName: aws.String(table),
		Item: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: pk},
			"sk": &types.AttributeValueMemberS{Value: "X"},
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	}
}

func getItem(table, pk string) *dynamodb.GetItemInput {
	return &dynamodb.GetItemInput{
		TableName: aws.String(table),
		Key: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: pk},
			"sk": &types.AttributeValueMemberS{Value: "X"},
		},
		ConsistentRead: aws.Bool(true),
	}
}

// TestProxyForwards: without faults every call reaches the engine and answers normally.
func TestProxyForwards(t *testing.T) {
	p, c, table := proxied(t, 1)
	ctx := t.Context()
	if _, err := c.PutItem(ctx, putIfAbsent(table, "a")); err != nil {
		t.Fatal(err)
	}
	out, err := c.GetItem(ctx, getItem(table, "a"))
	if err != nil || out.Item == nil {
		t.Fatalf("get through the proxy: %v %v", out, err)
	}
	if p.Forwarded() != 2 {
		t.Fatalf("forwarded %d, want 2", p.Forwarded())
	}
}

// TestProxyApplyThenDrop: the write lands, the client sees a connection error (or 500),
// and the SDK's retry of the conditional put meets the item its own first attempt wrote.
func TestProxyApplyThenDrop(t *testing.T) {
	for _, as500 := range []bool{false, true} {
		p, c, table := proxied(t, 3)
		ctx := t.Context()
		r := p.Inject(dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Op: "PutItem", Times: 1, As500: as500})
		_, err := c.PutItem(ctx, putIfAbsent(table, "a"))
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			t.Fatalf("as500=%v: retried put = %v, want a condition failure (its first attempt landed)", as500, err)
		}
		if r.Hits() != 1 || p.Injected(dynamotest.ApplyThenDrop) != 1 || p.Forwarded() != 2 {
			t.Fatalf("as500=%v: hits %d, injected %d, forwarded %d", as500, r.Hits(), p.Injected(dynamotest.ApplyThenDrop), p.Forwarded())
		}
		if out, err := c.GetItem(ctx, getItem(table, "a")); err != nil || out.Item == nil {
			t.Fatalf("as500=%v: the dropped write is not stored: %v", as500, err)
		}
	}
}

// TestProxyThrottleAndServerError: throttles and 5xx are never forwarded, are real
// DynamoDB errors, and the SDK retries them.
func TestProxyThrottleAndServerError(t *testing.T) {
	p, c, table := proxied(t, 1)
	ctx := t.Context()
	p.Inject(dynamotest.Fault{Kind: dynamotest.Throttle, Op: "GetItem", Times: 1, ProvisionedThroughput: true})
	p.Inject(dynamotest.Fault{Kind: dynamotest.Throttle, Op: "GetItem", Times: 1})
	p.Inject(dynamotest.Fault{Kind: dynamotest.ServerError, Op: "GetItem", Times: 1})
	_, err := c.GetItem(ctx, getItem(table, "a"))
	var pte *types.ProvisionedThroughputExceededException
	if !errors.As(err, &pte) {
		t.Fatalf("first call = %v, want ProvisionedThroughputExceededException", err)
	}
	_, err = c.GetItem(ctx, getItem(table, "a"))
	var api smithy.APIError
	if !errors.As(err, &api) || api.ErrorCode() != "ThrottlingException" {
		t.Fatalf("second call = %v, want ThrottlingException", err)
	}
	_, err = c.GetItem(ctx, getItem(table, "a"))
	var re *smithyhttp.ResponseError
	if !errors.As(err, &re) || re.HTTPStatusCode() != 500 {
		t.Fatalf("third call = %v, want HTTP 500", err)
	}
	if p.Forwarded() != 0 {
		t.Fatalf("%d faulted requests were forwarded", p.Forwarded())
	}

	// With retries the same faults are absorbed.
	p2 := dynamotest.NewProxy(dynamotest.Endpoint(t))
	t.Cleanup(p2.Close)
	c2 := dynamotest.NewClient(p2.URL(), dynamotest.FastRetries(5))
	p2.Inject(dynamotest.Fault{Kind: dynamotest.Throttle, Times: 2})
	p2.Inject(dynamotest.Fault{Kind: dynamotest.ServerError, Times: 1})
	if _, err := c2.GetItem(ctx, getItem(table, "a")); err != nil {
		t.Fatalf("retried call: %v", err)
	}
	if p2.Injected(dynamotest.Throttle) != 2 || p2.Injected(dynamotest.ServerError) != 1 || p2.Forwarded() != 1 {
		t.Fatalf("injected throttle %d, server error %d, forwarded %d",
			p2.Injected(dynamotest.Throttle), p2.Injected(dynamotest.ServerError), p2.Forwarded())
	}
}

// TestProxySelection: Op and Match select requests; Delay forwards after waiting; a seeded
// Probability fires on the same requests every time.
func TestProxySelection(t *testing.T) {
	p, c, table := proxied(t, 1)
	ctx := t.Context()
	p.Inject(dynamotest.Fault{Kind: dynamotest.ServerError, Op: "PutItem",
		Match: func(_ string, body []byte) bool { return strings.Contains(string(body), `"S":"bad"`) }})
	if _, err := c.PutItem(ctx, putIfAbsent(table, "good")); err != nil {
		t.Fatalf("unmatched put: %v", err)
	}
	if _, err := c.PutItem(ctx, putIfAbsent(table, "bad")); err == nil {
		t.Fatal("matched put was not faulted")
	}
	if _, err := c.GetItem(ctx, getItem(table, "bad")); err != nil {
		t.Fatalf("other operation faulted: %v", err)
	}
	p.Clear()

	d := p.Inject(dynamotest.Fault{Kind: dynamotest.Delay, Delay: 5 * time.Millisecond, Times: 1})
	if out, err := c.GetItem(ctx, getItem(table, "good")); err != nil || out.Item == nil || d.Hits() != 1 {
		t.Fatalf("delayed get: %v, hits %d", err, d.Hits())
	}
	p.Clear()

	pattern := func() string {
		p.Seed(42)
		r := p.Inject(dynamotest.Fault{Kind: dynamotest.Delay, Probability: 0.5})
		defer p.Clear()
		var b strings.Builder
		for range 32 {
			before := r.Hits()
			if _, err := c.GetItem(ctx, getItem(table, "good")); err != nil {
				t.Fatal(err)
			}
			if r.Hits() > before {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	first, second := pattern(), pattern()
	if first != second || !strings.Contains(first, "x") || !strings.Contains(first, ".") {
		t.Fatalf("seeded patterns %s and %s: want equal and mixed", first, second)
	}
}
