package dynamostore_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/dynamostore"
	"github.com/sandkeep/sandkeep/shared/dynamostore/dynamotest"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// TestConformance runs every testkit suite against dynamostore on dynalite, each case on a
// fresh table.
func TestConformance(t *testing.T) {
	client := dynamotest.Client(t)
	testkit.RunAll(t, func(t *testing.T, o testkit.Options) sandbox.Backend {
		return dynamostore.New(dynamostore.Config{
			Client:      client,
			Table:       dynamotest.FreshTable(t, client),
			DriverLease: o.DriverLease,
			Lock:        o.Lock,
		})
	})
}
