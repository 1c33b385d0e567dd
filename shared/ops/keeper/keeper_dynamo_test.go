package keeper_test

import (
	"fmt"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
)

// TestOpsDynamoBudgets counts the DynamoDB calls of each operation (docs/design.md §11). Call counts are
// assertions; timing is not.
func TestOpsDynamoBudgets(t *testing.T) {
	counter := dynamotest.NewCounter()
	client := dynamotest.Client(t, counter.Attach)
	store := dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
	prov := counting.New(keepertest.ProviderName)
	k := newKeeper(t, keeper.Config{Backend: store, Providers: []contract.Provider{prov}})
	ctx := contract.WithTenant(t.Context(), "budget")
	in := func(runID string) keeper.StartInput {
		return keeper.StartInput{RunID: runID, ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}}
	}
	measure := func(what string, max int, op func() error) {
		t.Helper()
		counter.Reset()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := counter.Total()
		t.Logf("%-40s %2d calls %v", what, got, counter.Snapshot())
		if got > max {
			t.Errorf("%s: %d DynamoDB calls, budget %d", what, got, max)
		}
	}
	var r1, r2 keeper.StartResult
	defer func() { _ = r2 }()
	measure("start, sandbox created", 9, func() (err error) { r1, err = k.Start(ctx, in("r1")); return })
	measure("start, sandbox resumed", 3, func() (err error) { r2, err = k.Start(ctx, in("r2")); return })
	measure("heartbeat", 1, func() error { _, err := k.Heartbeat(ctx, "r1", 1); return err })
	measure("detach (with key)", 1, func() error { _, err := k.DetachWithKey(ctx, "r1", 1, r1.Sandbox.Key); return err })
	measure("detach (keeps the key)", 1, func() error { _, err := k.Detach(ctx, "r1", 1); return err })
	var at contract.Cursor
	measure("append", 1, func() error {
		res, err := k.Append(ctx, "r1", r1.Driver.Cursor, []contract.Event{{Data: []byte(`"x"`)}})
		at = res.Cursor
		return err
	})
	measure("read from next (items there)", 1, func() error {
		page, err := k.Read(ctx, "r1", 0, 10, 0)
		if err == nil && len(page.Events) != 1 {
			err = fmt.Errorf("read %d events, want 1", len(page.Events))
		}
		return err
	})
	measure("read at the tail of a running run", 3, func() error { _, err := k.Read(ctx, "r1", at.Next-1, 10, 0); return err })
	var ar keeper.AttachResult
	measure("attach", 4, func() (err error) { ar, err = k.Attach(ctx, "r1"); return })
	measure("finish", 2, func() error {
		_, err := k.Finish(ctx, "r1", ar.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted})
		return err
	})
	measure("cancel a run", 3, func() error { _, err := k.Cancel(ctx, "r2"); return err })
	measure("cancel the thread's active run", 4, func() error { _, err := k.CancelThread(ctx, "th"); return err })
}
