package dynamotest_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestFreshTableAndCounter proves a fresh table has the schema's indexes and the Counter
// counts calls, condition failures, ScannedCount and actions.
func TestFreshTableAndCounter(t *testing.T) {
	ctr := dynamotest.NewCounter()
	client := dynamotest.Client(t, ctr.Attach)
	table := dynamotest.FreshTable(t, client)
	ctx := t.Context()

	desc, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil {
		t.Fatal(err)
	}
	want := dynamostore.CreateTableInput(table)
	if got, w := len(desc.Table.GlobalSecondaryIndexes), len(want.GlobalSecondaryIndexes); got != w {
		t.Fatalf("table has %d indexes, schema declares %d", got, w)
	}

	ctr.Reset()
	item := map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "t#X#1"},
		"sk": &types.AttributeValueMemberS{Value: "X"},
	}
	put := &dynamodb.PutItemInput{TableName: aws.String(table), Item: item, ConditionExpression: aws.String("attribute_not_exists(pk)")}
	if _, err := client.PutItem(ctx, put); err != nil {
		t.Fatal(err)
	}
	if _, err := client.PutItem(ctx, put); err == nil {
		t.Fatal("second conditional put succeeded")
	}
	q, err := client.Query(ctx, &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("pk = :p"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":p": &types.AttributeValueMemberS{Value: "t#X#1"}},
		ConsistentRead:            aws.Bool(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	if q.ScannedCount != 1 {
		t.Fatalf("ScannedCount = %d, want 1", q.ScannedCount)
	}
	if got := ctr.Calls("PutItem"); got != 2 {
		t.Errorf("PutItem calls = %d, want 2", got)
	}
	if got := ctr.ConditionFailures("PutItem"); got != 1 {
		t.Errorf("PutItem condition failures = %d, want 1", got)
	}
	if got := ctr.Scanned(); got != 1 {
		t.Errorf("Scanned = %d, want 1", got)
	}
	if got := ctr.Total(); got != 3 {
		t.Errorf("Total = %d, want 3 (%v)", got, ctr.Snapshot())
	}
	acts := ctr.Actions()
	wantActs := map[string]bool{"dynamodb:CreateTable": true, "dynamodb:DescribeTable": true, "dynamodb:PutItem": true, "dynamodb:Query": true}
	for _, a := range acts {
		delete(wantActs, a)
	}
	if len(wantActs) != 0 {
		t.Errorf("Actions() = %v lacks %v", acts, wantActs)
	}
}
