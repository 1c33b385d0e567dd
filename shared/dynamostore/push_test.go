package dynamostore_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/dynamostore"
	"github.com/sandkeep/sandkeep/shared/dynamostore/dynamotest"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// TestPushStoreConformance proves the deployed push's items on dynalite
// (testkit.RunPushStoreConformance), each case on a fresh table.
func TestPushStoreConformance(t *testing.T) {
	client := dynamotest.Client(t)
	testkit.RunPushStoreConformance(t, func(t *testing.T, o testkit.Options) sandbox.Backend {
		return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client), DriverLease: o.DriverLease, Lock: o.Lock})
	})
}
