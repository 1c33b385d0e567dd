package dynamostore_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestPushStoreConformance proves the deployed push's items on dynalite
// (testkit.RunPushStoreConformance), each case on a fresh table.
func TestPushStoreConformance(t *testing.T) {
	client := dynamotest.Client(t)
	testkit.RunPushStoreConformance(t, func(t *testing.T, o testkit.Options) contract.Backend {
		return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client), DriverLease: o.DriverLease, Lock: o.Lock})
	})
}
