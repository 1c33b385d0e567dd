package dynamostore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestFailedCallIsNoAnswer: when DynamoDB calls fail (at the client seam, no proxy), every
// primitive returns an error wrapping the failure and never a sentinel answer — so the
// retry policy retries it and no caller mistakes an outage for a refusal or a miss.
func TestFailedCallIsNoAnswer(t *testing.T) {
	client := dynamotest.Client(t)
	table := dynamotest.FreshTable(t, client)
	outage := errors.New("injected: service unavailable")
	var failed atomic.Int64
	broken := dynamostore.New(dynamostore.Config{Table: table, Client: dynamotest.FailingClient{
		Client: client,
		Fail:   func(string) error { failed.Add(1); return outage },
	}})
	ctx := contract.WithTenant(t.Context(), "acme")
	cases := []struct {
		name string
		call func() error
	}{
		{"Instances.GetRow", func() error { _, err := broken.Instances().GetRow(ctx, "k"); return err }},
		{"Instances.CreateRow", func() error {
			return broken.Instances().CreateRow(ctx, contract.InstanceRecord{Key: "k", Provider: "p", ProviderSandboxID: "sb", ThreadID: "th", UpdatedAt: 1}, "inc")
		}},
		{"Runs.State", func() error { _, err := broken.Runs().State(ctx, "r"); return err }},
		{"Runs.FindActiveRun", func() error { _, err := broken.Runs().FindActiveRun(ctx, "th"); return err }},
		{"Runs.Heartbeat", func() error { _, err := broken.Runs().Heartbeat(ctx, "r", 1, 1<<40); return err }},
		{"Intents.Get", func() error { _, err := broken.Intents().Get(ctx, "k"); return err }},
		{"Log.Append", func() error {
			_, err := broken.Log().Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 1}, []contract.Event{{Data: []byte(`1`)}})
			return err
		}},
		{"Log.Read", func() error { _, _, _, err := broken.Log().Read(ctx, "r", 0, 10); return err }},
		{"Log.Fence", func() error { _, err := broken.Log().Fence(ctx, "r", 1); return err }},
		{"Locks.WithLock", func() error {
			return broken.Locks().WithLock(ctx, "k", func(context.Context) error {
				t.Error("fn ran without the lease")
				return nil
			})
		}},
	}
	for _, c := range cases {
		before := failed.Load()
		err := c.call()
		switch {
		case failed.Load() == before:
			t.Errorf("%s: made no DynamoDB call (the fault was never met)", c.name)
		case !errors.Is(err, outage):
			t.Errorf("%s: err %v, want it to wrap the failed call's error", c.name, err)
		case contract.IsSentinel(err):
			t.Errorf("%s: err %v is a sentinel answer: an outage would read as a refusal", c.name, err)
		}
	}
}
