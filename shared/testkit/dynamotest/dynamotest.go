// Package dynamotest is test support for code that runs against DynamoDB: the endpoint of
// the local engine (dynalite, started by scripts/test.sh), SDK clients for it, fresh tables
// per test, and a Counter middleware that counts calls per operation.
package dynamotest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
)

// EnvEndpoint names the environment variable holding the local DynamoDB endpoint URL.
const EnvEndpoint = "SANDKEEP_DYNAMODB_ENDPOINT"

// Endpoint returns the local DynamoDB endpoint; when unset the test is skipped locally and
// fails under CI=true (CI must never silently skip the DynamoDB tests).
func Endpoint(t testing.TB) string {
	t.Helper()
	ep := os.Getenv(EnvEndpoint)
	if ep == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set under CI=true: run the tests through `make test`", EnvEndpoint)
		}
		t.Skipf("%s is not set: run `make test` (scripts/test.sh starts dynalite)", EnvEndpoint)
	}
	return ep
}

// NewClient returns a DynamoDB client for a local endpoint: static dummy credentials,
// region us-east-1, no response CRC32 validation (the local engine sends none); opts are
// applied last (e.g. Counter.Attach).
func NewClient(endpoint string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamostore.LocalClient(endpoint, opts...)
}

// Client returns a client for the test's endpoint (skips/fails like Endpoint).
func Client(t testing.TB, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	t.Helper()
	return NewClient(Endpoint(t), opts...)
}

// TableName returns a fresh, unique table name.
func TableName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "sandkeep-test-" + hex.EncodeToString(b[:])
}

// DropAtEnd deletes table when the test ends (best effort: it may never have been made).
func DropAtEnd(t testing.TB, client *dynamodb.Client, table string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
}

// FreshTable creates a uniquely named table with dynamostore.CreateTable and deletes it
// when the test ends; it returns the table name.
func FreshTable(t testing.TB, client *dynamodb.Client) string {
	t.Helper()
	name := TableName()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// CreateTable accepts its own table met by an SDK retry of a create whose response
	// was lost (e.g. a keep-alive connection closed by the engine).
	err := dynamostore.CreateTable(ctx, client, name)
	if err != nil {
		t.Fatalf("create table: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A table already gone is a delete that landed and whose response was lost (the
		// SDK retried it), as the fault proxy's dropped connections can make happen.
		_, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
		var gone *types.ResourceNotFoundException
		if err != nil && !errors.As(err, &gone) {
			t.Errorf("delete table %s: %v", name, err)
		}
	})
	return name
}
