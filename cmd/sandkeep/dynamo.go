package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
)

// tableSetupTimeout bounds creating a table and waiting for it to become ACTIVE.
const tableSetupTimeout = 2 * time.Minute

// dynamoFlags selects a DynamoDB table: a local endpoint (dynalite, DynamoDB Local) or,
// without --dynamodb-endpoint, AWS through the default credential chain.
type dynamoFlags struct {
	endpoint string
	table    string
	// driverLease is the deployment's driver lease (its DriverLeaseMs): the table's
	// reclaimAt steps and lapses are derived from it, so an operator command must use the
	// one its deployment uses.
	driverLease time.Duration
}

func (d *dynamoFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.endpoint, "dynamodb-endpoint", "", "DynamoDB endpoint URL of a local engine (e.g. http://127.0.0.1:8000); empty = AWS")
	fs.StringVar(&d.table, "table", "", "DynamoDB table name")
}

// registerLease adds --driver-lease, for the commands that judge or write leases.
func (d *dynamoFlags) registerLease(fs *flag.FlagSet) {
	fs.DurationVar(&d.driverLease, "driver-lease", contract.DefaultDriverLease*time.Millisecond, "the deployment's driver lease (template.yaml's DriverLeaseMs)")
}

// check validates the pair; tableRequired for the commands that only work on a table.
func (d dynamoFlags) check(tableRequired bool) error {
	switch {
	case d.table == "" && tableRequired:
		return usageErr("--table is required")
	case d.table == "" && d.endpoint != "":
		return usageErr("--dynamodb-endpoint needs --table")
	case d.driverLease < 0:
		return usageErr("--driver-lease must not be negative")
	}
	return nil
}

func (d dynamoFlags) endpointOrDefault() string {
	if d.endpoint == "" {
		return "AWS (default endpoint)"
	}
	return d.endpoint
}

// client returns a DynamoDB client: for a local endpoint, dynamostore.LocalClient (static
// dummy credentials, region us-east-1); for AWS, the SDK's default configuration.
func (d dynamoFlags) client(ctx context.Context) (*dynamodb.Client, error) {
	if d.endpoint == "" {
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("aws config: %w", err)
		}
		return dynamodb.NewFromConfig(cfg, dynamostore.Retries), nil
	}
	return dynamostore.LocalClient(d.endpoint), nil
}

// ensureTable creates table when it is missing and waits until it is ACTIVE; created
// reports whether this call created it.
func ensureTable(ctx context.Context, client *dynamodb.Client, table string) (created bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, tableSetupTimeout)
	defer cancel()
	_, err = client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	var notFound *types.ResourceNotFoundException
	switch {
	case errors.As(err, &notFound):
		// Someone creating it meanwhile is fine: CreateTable accepts a table with our schema.
		err = dynamostore.CreateTable(ctx, client, table)
		return err == nil, err
	case err != nil:
		return false, fmt.Errorf("describe table %q: %w", table, err)
	}
	return false, dynamostore.VerifyTable(ctx, client, table)
}

// newDynamoBackend returns the DynamoDB backend over d's table (driver lease 0: the default).
func newDynamoBackend(client *dynamodb.Client, d dynamoFlags) (contract.Backend, error) {
	return dynamostore.New(dynamostore.Config{Client: client, Table: d.table, DriverLease: d.driverLease}), nil
}

func parseTable(args []string, w io.Writer) (dynamoFlags, error) {
	var d dynamoFlags
	fs := newFlags("sandkeep table create", w)
	d.register(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return d, err
	}
	if len(pos) > 0 {
		return d, usageErr("unexpected argument %q", pos[0])
	}
	return d, d.check(true)
}

// runTableCreate creates the table with its indexes (a table that exists is left as is).
func runTableCreate(ctx context.Context, d dynamoFlags, out io.Writer) error {
	client, err := d.client(ctx)
	if err != nil {
		return err
	}
	created, err := ensureTable(ctx, client, d.table)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(out, "created table %q at %s\n", d.table, d.endpointOrDefault())
	} else {
		fmt.Fprintf(out, "table %q already exists at %s (left as is)\n", d.table, d.endpointOrDefault())
	}
	return nil
}
