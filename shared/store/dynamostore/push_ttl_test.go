package dynamostore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestPushItemsExpire: a connection's item and its subscriptions carry gcAt, the table's
// TTL attribute (template.yaml), a connection's lifetime and a grace after they were
// written, so a connection API Gateway dropped without a $disconnect leaves nothing for
// ever (docs/design.md §3).
func TestPushItemsExpire(t *testing.T) {
	t.Parallel()
	client := dynamotest.Client(t)
	now := time.Unix(1_900_000_000, 0)
	table := dynamotest.FreshTable(t, client)
	s := dynamostore.New(dynamostore.Config{Client: client, Table: table, Now: func() time.Time { return now }})
	ctx := contract.WithTenant(t.Context(), "acme")
	if err := s.Connect(ctx, "c1=", 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Subscribe(ctx, "c1=", "run-1", 0, 10); err != nil {
		t.Fatal(err)
	}
	conn, sub := dynamostore.PushItemKeysForTest("acme", "run-1", "c1=")
	want := dynamostore.PushGCAtForTest(now.Unix())
	for name, key := range map[string]map[string]types.AttributeValue{"connection": conn, "subscription": sub} {
		out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		n, ok := out.Item["gcAt"].(*types.AttributeValueMemberN)
		if !ok {
			t.Fatalf("the %s item has no numeric gcAt: %v", name, out.Item)
		}
		if got, err := strconv.ParseInt(n.Value, 10, 64); err != nil || got != want {
			t.Fatalf("the %s item's gcAt is %s, want %d (written at %d)", name, n.Value, want, now.Unix())
		}
	}
}
