package dynamostore

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

// LocalClient returns a DynamoDB client for a local engine at endpoint (dynalite): static
// dummy credentials, region us-east-1 (local engines accept any), and no response CRC32
// validation (local engines send none); opts are applied last (e.g. a call counter).
func LocalClient(endpoint string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	base := []func(*dynamodb.Options){Retries, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.DisableValidateResponseChecksum = true
	}}
	return dynamodb.New(dynamodb.Options{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("sandkeep", "sandkeep", ""),
	}, append(base, opts...)...)
}

// Retries is the option every DynamoDB client of sandkeep is built with: the SDK's own
// retryer tries a request storecall.SDKAttempts times, the inner loop of the one retry
// policy (storecall; docs/design.md §2.1), so the total number of tries is written down.
func Retries(o *dynamodb.Options) { o.RetryMaxAttempts = storecall.SDKAttempts }

// Client is the part of the DynamoDB API a Store calls: single-item reads and conditional
// writes, Query on the table and its sparse indexes, and BatchGetItem of consistent reads
// (it has no scan and no transaction: docs/design.md §3). *dynamodb.Client implements it;
// tests wrap it to fail, stall or rewrite any call (the seam for fault injection).
type Client interface {
	// GetItem reads one item; a Store always asks for a consistent read.
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	// PutItem writes one whole item, under the input's condition when it has one.
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	// UpdateItem changes one item's attributes, under the input's condition when it has one.
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	// DeleteItem removes one item, under the input's condition when it has one.
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	// Query reads one partition of the table or of an index, a page at a time.
	Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	// BatchGetItem reads up to 100 items by key; unprocessed keys come back for a retry.
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
}

var _ Client = (*dynamodb.Client)(nil)
