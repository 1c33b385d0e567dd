package dynamostore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestCreateTableLostResponse: the engine creates the table but CreateTable's response is
// lost (the proxy drops the connection) and the SDK retries, meeting its own table
// (ResourceInUseException): CreateTable still succeeds once the table is ACTIVE.
func TestCreateTableLostResponse(t *testing.T) {
	proxy := dynamotest.NewProxy(dynamotest.Endpoint(t))
	t.Cleanup(proxy.Close)
	client := dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(5))
	table := dynamotest.TableName()
	dynamotest.DropAtEnd(t, client, table)
	rule := proxy.Inject(dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Op: "CreateTable", Times: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := dynamostore.CreateTable(ctx, client, table); err != nil {
		t.Fatalf("create table whose first response was lost: %v", err)
	}
	if rule.Hits() != 1 {
		t.Fatalf("the fault fired %d times, want 1", rule.Hits())
	}
	desc, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil || desc.Table.TableStatus != types.TableStatusActive {
		t.Fatalf("table after create: %+v, %v", desc, err)
	}
	// Creating it again is the same success: it exists with the right schema.
	if err := dynamostore.CreateTable(ctx, client, table); err != nil {
		t.Fatalf("create of an existing table with the right schema: %v", err)
	}
}

// TestCreateTableWrongSchema: a table of that name with other keys or indexes is a clear
// error (ErrTableSchema) naming each difference; it is never used as if it were ours.
func TestCreateTableWrongSchema(t *testing.T) {
	client := dynamotest.Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cases := []struct {
		name  string
		alter func(in *dynamodb.CreateTableInput)
		want  []string // substrings of the error
	}{
		{"hash key only", func(in *dynamodb.CreateTableInput) {
			in.KeySchema = in.KeySchema[:1]
		}, []string{"key schema", "sk"}},
		{"index missing", func(in *dynamodb.CreateTableInput) {
			in.GlobalSecondaryIndexes = in.GlobalSecondaryIndexes[:len(in.GlobalSecondaryIndexes)-1]
		}, []string{"index " + dynamostore.IndexStopCandidates, "missing"}},
		{"index projection", func(in *dynamodb.CreateTableInput) {
			for i := range in.GlobalSecondaryIndexes {
				if *in.GlobalSecondaryIndexes[i].IndexName == dynamostore.IndexRunsByThread {
					in.GlobalSecondaryIndexes[i].Projection = &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}
				}
			}
		}, []string{"index " + dynamostore.IndexRunsByThread, "projection"}},
		{"key type", func(in *dynamodb.CreateTableInput) {
			for i := range in.AttributeDefinitions {
				if *in.AttributeDefinitions[i].AttributeName == "sk" {
					in.AttributeDefinitions[i].AttributeType = types.ScalarAttributeTypeN
				}
			}
		}, []string{"attribute sk", "type"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			table := dynamotest.TableName()
			dynamotest.DropAtEnd(t, client, table)
			in := dynamostore.CreateTableInput(table)
			c.alter(in)
			if _, err := client.CreateTable(ctx, in); err != nil {
				t.Fatalf("create the wrong table: %v", err)
			}
			err := dynamostore.CreateTable(ctx, client, table)
			if !errors.Is(err, dynamostore.ErrTableSchema) {
				t.Fatalf("create over a table with the wrong schema: %v, want ErrTableSchema", err)
			}
			for _, w := range append(c.want, table) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}
