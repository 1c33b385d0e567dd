package dynamostore

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// LocalClient returns a DynamoDB client for a local engine at endpoint (dynalite): static
// dummy credentials, region us-east-1 (local engines accept any), and no response CRC32
// validation (local engines send none); opts are applied last (e.g. a call counter).
func LocalClient(endpoint string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	base := []func(*dynamodb.Options){func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.DisableValidateResponseChecksum = true
	}}
	return dynamodb.New(dynamodb.Options{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider("sandkeep", "sandkeep", ""),
	}, append(base, opts...)...)
}
