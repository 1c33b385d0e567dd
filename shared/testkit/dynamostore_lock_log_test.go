package testkit_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/dynamostore"
	"github.com/sandkeep/sandkeep/shared/dynamostore/dynamotest"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// lkDynamoBackend is the dynamostore factory of these suites: a fresh table per case on the
// local engine (skipped when SANDKEEP_DYNAMODB_ENDPOINT is unset, failed under CI), with
// renewals stallable at the store's client (dynamotest.StallingClient).
func lkDynamoBackend(t *testing.T, o testkit.Options) sandbox.Backend {
	client := dynamotest.Client(t)
	return dynamotest.NewStallable(dynamostore.Config{
		Client:      client,
		Table:       dynamotest.FreshTable(t, client),
		Lock:        o.Lock,
		DriverLease: o.DriverLease,
	})
}

func TestDynamostoreLockStoreConformance(t *testing.T) {
	testkit.RunLockStoreConformance(t, lkDynamoBackend)
}

func TestDynamostoreEventLogConformance(t *testing.T) {
	testkit.RunEventLogConformance(t, lkDynamoBackend)
}
