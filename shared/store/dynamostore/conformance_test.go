package dynamostore_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestConformance proves dynamostore on dynalite in one call (testkit.RunAll: store,
// operation, takeover, journal and reaper suites), each case on a fresh table, lock
// renewals stallable at the client (the lease-loss cases run).
func TestConformance(t *testing.T) {
	client := dynamotest.Client(t)
	testkit.RunAll(t, func(t *testing.T, o testkit.Options) contract.Backend {
		return dynamotest.NewStallable(dynamostore.Config{
			Client:      client,
			Table:       dynamotest.FreshTable(t, client),
			DriverLease: o.DriverLease,
			Lock:        o.Lock,
		})
	}, func(t *testing.T) contract.Provider { return localprocess.New(t.TempDir()) })
}

// TestConformanceThroughFaultProxy runs the store suites (testkit.RunStoreSuites) again
// with the client behind the fault proxy: a seeded tenth of conditional writes is applied by the engine and then its
// response dropped, so the SDK retries a write that already landed. Every store must
// recognise its own landed attempt (its token) and pass unchanged.
func TestConformanceThroughFaultProxy(t *testing.T) {
	proxy := dynamotest.NewProxy(dynamotest.Endpoint(t))
	t.Cleanup(proxy.Close)
	proxy.Seed(7)
	var rules []*dynamotest.Rule
	for _, op := range []string{"PutItem", "UpdateItem", "DeleteItem"} {
		rules = append(rules, proxy.Inject(dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Op: op, Probability: 0.1}))
	}
	// No client-side retry quota: a storm of dropped connections must not turn into errors.
	client := dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(8))
	t.Run("suites", func(t *testing.T) {
		testkit.RunStoreSuites(t, func(t *testing.T, o testkit.Options) contract.Backend {
			return dynamostore.New(dynamostore.Config{
				Client:      client,
				Table:       dynamotest.FreshTable(t, client),
				DriverLease: o.DriverLease,
				Lock:        o.Lock,
			})
		})
	})
	var hits int64
	for _, r := range rules {
		hits += r.Hits()
	}
	t.Logf("ambiguous writes injected: %d of %d forwarded requests", hits, proxy.Forwarded())
	if hits == 0 {
		t.Fatal("no ambiguous write was injected: the suites did not meet the dangerous path")
	}
}
