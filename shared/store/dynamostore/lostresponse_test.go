package dynamostore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestLostResponses: every conditional write, applied by the engine but with its response
// lost (the fault proxy drops the connection, the SDK retries), still reports success —
// the retry meets its own landed write and the store recognises its token. Each case
// asserts the fault fired, and where the retry must fail its condition, that it did (the
// recognition path ran).
func TestLostResponses(t *testing.T) {
	proxy := dynamotest.NewProxy(dynamotest.Endpoint(t))
	t.Cleanup(proxy.Close)
	ctr := dynamotest.NewCounter()
	client := dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(5), ctr.Attach)
	table := dynamotest.FreshTable(t, client)
	store := dynamostore.New(dynamostore.Config{Client: client, Table: table})
	ctx := contract.WithTenant(t.Context(), "acme")
	runs, inst, intents := store.Runs(), store.Instances(), store.Intents()
	now := time.Now().UnixMilli()

	newRun := func(t *testing.T, id string) contract.RunState {
		t.Helper()
		st, _, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
			NewRun: contract.NewRun{RunID: id, ThreadID: "th", StartedAt: now}, SandboxKey: "sk_" + id, LeaseUntil: now + 60_000, Token: "setup-" + id})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	rec := func(key, psid string, at int64) contract.InstanceRecord {
		return contract.InstanceRecord{Key: key, Provider: "p", ProviderSandboxID: psid, ThreadID: "th", UpdatedAt: at}
	}

	cases := []struct {
		name     string
		op       string // the operation whose response is lost
		match    string // substring of the request body selecting it ("" = any)
		condFail bool   // the retry must fail its condition (and be recognised)
		setup    func(t *testing.T)
		run      func(t *testing.T) error
	}{
		{name: "create-claimed", op: "PutItem", condFail: true, run: func(t *testing.T) error {
			_, created, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
				NewRun: contract.NewRun{RunID: "cc", ThreadID: "th", StartedAt: now}, SandboxKey: "sk", LeaseUntil: now + 1, Token: "tok-cc"})
			if err == nil && !created {
				return errors.New("own landed create reported as created=false")
			}
			return err
		}},
		{name: "claim", op: "UpdateItem", condFail: true, setup: func(t *testing.T) {
			st := newRun(t, "cl")
			if _, err := runs.Detach(ctx, "cl", st.Epoch(), "sk_cl", now); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T) error {
			ds := now
			st, err := runs.Claim(ctx, "cl", contract.Claim{Token: "tok-cl", LeaseUntil: now + 5, ClearDetached: true, If: contract.ClaimCond{DetachedSince: &ds}})
			if err == nil && st.Epoch() != 2 {
				return errors.New("epoch after one claim is not 2")
			}
			return err
		}},
		{name: "update-fenced terminal", op: "UpdateItem", condFail: true, setup: func(t *testing.T) { newRun(t, "fin") }, run: func(t *testing.T) error {
			st, err := runs.UpdateFenced(ctx, "fin", 1, contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set(now)})
			if err == nil && st.Status != contract.StatusCompleted {
				return errors.New("not completed")
			}
			return err
		}},
		{name: "lapse", op: "UpdateItem", condFail: true, setup: func(t *testing.T) { newRun(t, "lap") }, run: func(t *testing.T) error {
			return runs.Lapse(ctx, "lap", 1, now+60_000)
		}},
		{name: "plain update (versioned put)", op: "PutItem", condFail: true, setup: func(t *testing.T) {
			if _, err := refstore.Runs(runs).CreateOrResume(ctx, contract.NewRun{RunID: "up", ThreadID: "th", StartedAt: now}); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T) error {
			if err := refstore.Runs(runs).Update(ctx, "up", contract.RunPatch{SandboxKey: contract.Set("sk_up")}); err != nil {
				return err
			}
			r, err := refstore.Runs(runs).Get(ctx, "up")
			if err == nil && (r.SandboxKey == nil || *r.SandboxKey != "sk_up") {
				return errors.New("patch not applied")
			}
			return err
		}},
		{name: "instance create-row", op: "PutItem", condFail: true, run: func(t *testing.T) error {
			return inst.CreateRow(ctx, rec("k1", "p1", now), "inc-1")
		}},
		{name: "instance replace-row", op: "PutItem", condFail: true, setup: func(t *testing.T) {
			if err := inst.CreateRow(ctx, rec("k2", "p1", now), "inc-a"); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T) error {
			return inst.ReplaceRow(ctx, rec("k2", "p2", now), "inc-a", "inc-b")
		}},
		{name: "instance mark-reclaiming", op: "UpdateItem", condFail: true, setup: func(t *testing.T) {
			if err := inst.CreateRow(ctx, rec("k3", "p1", now-10), "inc-c"); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T) error {
			return inst.MarkReclaiming(ctx, "k3", "p1", now-10, now, "rt")
		}},
		{name: "instance delete-reclaimed", op: "DeleteItem", condFail: true, setup: func(t *testing.T) {
			if err := inst.CreateRow(ctx, rec("k4", "p1", now-10), "inc-d"); err != nil {
				t.Fatal(err)
			}
			if err := inst.MarkReclaiming(ctx, "k4", "p1", now-10, now, "rt4"); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T) error {
			return inst.DeleteReclaimed(ctx, "k4", "rt4")
		}},
		{name: "intent put", op: "PutItem", condFail: true, run: func(t *testing.T) error {
			return intents.Put(ctx, "ik", 7, now)
		}},
		{name: "intent record", op: "UpdateItem", setup: func(t *testing.T) {
			if err := intents.Put(ctx, "ik2", 7, now); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T) error {
			return intents.Record(ctx, "ik2", 7, "psid")
		}},
		{name: "intent drop", op: "UpdateItem", setup: func(t *testing.T) {
			if err := intents.Put(ctx, "ik3", 7, now); err != nil {
				t.Fatal(err)
			}
		}, run: func(t *testing.T) error {
			if err := intents.Drop(ctx, "ik3", 7); err != nil {
				return err
			}
			if in, err := intents.Get(ctx, "ik3"); err != nil || in != nil {
				return errors.New("intent still open")
			}
			return nil
		}},
		{name: "lock release", op: "UpdateItem", match: "REMOVE", condFail: true, run: func(t *testing.T) error {
			if err := store.Locks().WithLock(ctx, "lk", func(context.Context) error { return nil }); err != nil {
				return err
			}
			// Released despite the lost response: the next caller gets in at once, not
			// after the 15 s lease.
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			return store.Locks().WithLock(wctx, "lk", func(context.Context) error { return nil })
		}},
		{name: "lock acquire", op: "UpdateItem", match: "if_not_exists", run: func(t *testing.T) error {
			var fence int64
			err := store.Locks().WithLock(ctx, "lk2", func(ctx context.Context) error {
				fence = contract.LeaseFence(ctx)
				return nil
			})
			if err == nil && fence != 2 { // the retried acquire ("already mine") bumped it again
				return errors.New("retried acquire did not take the already-mine path")
			}
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup(t)
			}
			f := dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Op: c.op, Times: 1}
			if c.match != "" {
				f.Match = func(_ string, body []byte) bool { return strings.Contains(string(body), c.match) }
			}
			rule := proxy.Inject(f)
			defer proxy.Clear()
			ctr.Reset()
			if err := c.run(t); err != nil {
				t.Fatalf("after a lost response: %v", err)
			}
			if rule.Hits() != 1 {
				t.Fatalf("the fault fired %d times, want 1", rule.Hits())
			}
			if fails := ctr.ConditionFailures(c.op); c.condFail && fails == 0 {
				t.Errorf("the retried %s never failed its condition: recognition not exercised (%v)", c.op, ctr.Snapshot())
			}
		})
	}
}
