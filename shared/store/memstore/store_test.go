package memstore_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// fakeClock is a settable wall clock.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }

func TestRetentionDropsExpiredLogsAndRuns(t *testing.T) {
	var clk fakeClock
	clk.ms.Store(1_000_000)
	s := memstore.New(memstore.WithClock(clk.now), memstore.WithLogRetention(time.Hour))
	ctx := tctx(t, "a")
	claimed(t, s.Runs(), ctx, "old")
	_, err := s.Log().Append(ctx, "old", contract.Cursor{Epoch: 1, Next: 1}, evs(1))
	must(t, err, "append")
	_, err = s.Runs().UpdateFenced(ctx, "old", 1, contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
	must(t, err, "finish")

	clk.ms.Add((time.Hour + time.Minute).Milliseconds()) // log items expired, the run not yet
	claimed(t, s.Runs(), ctx, "trigger1")
	if st, _ := s.Runs().State(ctx, "old"); st == nil {
		t.Fatal("the run vanished before its log retention + 1 day")
	}
	got, _, _, err := s.Log().Read(ctx, "old", 0, 10)
	must(t, err, "read")
	if len(got) != 0 {
		t.Fatalf("expired log items still read: %+v", got)
	}

	clk.ms.Add((25 * time.Hour).Milliseconds())
	claimed(t, s.Runs(), ctx, "trigger2")
	if st, _ := s.Runs().State(ctx, "old"); st != nil {
		t.Fatalf("terminal run kept past its gcAt: %+v", st)
	}
	if st, _ := s.Runs().State(ctx, "trigger1"); st == nil {
		t.Fatal("a running run was collected")
	}
}

func TestEventsNeverAlias(t *testing.T) {
	ctx, lg := tctx(t, "a"), memstore.New().Log()
	in := evs(7)
	_, err := lg.Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 1}, in)
	must(t, err, "append")
	in[0].Data[1] = 'X'
	got, _, _, err := lg.Read(ctx, "r", 0, 10)
	must(t, err, "read")
	got[0].Data[2] = 'Y'
	again, _, _, err := lg.Read(ctx, "r", 0, 10)
	must(t, err, "read again")
	if string(again[0].Data) != `{"n":7}` {
		t.Fatalf("stored event aliased a caller's slice: %s", again[0].Data)
	}
}

func TestReaperSourceLagsAndServesTenants(t *testing.T) {
	const lag = 2
	s := memstore.New(memstore.WithIndexLag(lag))
	rows := s.Instances()
	for _, tenant := range []string{"b", "a"} {
		must(t, refstore.Instances(rows).Upsert(tctx(t, tenant), contract.InstanceRecord{Key: "k", Provider: "p",
			ProviderSandboxID: "s", ThreadID: "th", UpdatedAt: 5}), "upsert")
	}
	polls := 0
	var got []contract.InstanceRef
	for ; len(got) < 2; polls++ {
		if polls > 2*lag {
			t.Fatalf("idle rows never appeared: %+v", got)
		}
		var err error
		got, err = s.Reaper().IdleInstances(t.Context(), 5, 10)
		must(t, err, "idle instances")
	}
	if polls == 1 || got[0].Tenant != "a" || got[1].Tenant != "b" {
		t.Fatalf("after %d polls: %+v (want lagged, then tenant a first)", polls, got)
	}
	must(t, rows.MarkReclaiming(tctx(t, "a"), "k", "s", 5, 5, "tok"), "mark")
	pending, err := s.Reaper().PendingReclaims(t.Context(), 10)
	must(t, err, "pending")
	if len(pending) != 0 {
		t.Fatalf("the tombstone appeared before the lag: %+v", pending)
	}
	must(t, rows.DeleteReclaimed(tctx(t, "a"), "k", "tok"), "delete")
	got, err = s.Reaper().IdleInstances(t.Context(), 5, 10)
	must(t, err, "idle instances")
	if len(got) != 2 {
		t.Fatalf("a deleted row did not linger in the lagging index: %+v", got)
	}
	_, err = s.Reaper().PendingReclaims(t.Context(), 0)
	wantErr(t, err, contract.ErrInvalid, "limit 0")
}
