package dynamostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// fixture is a store on a fresh table with a counting client.
type fixture struct {
	store  *dynamostore.Store
	ctr    *dynamotest.Counter
	client *dynamodb.Client
	table  string
}

func newFixture(t *testing.T, cfg dynamostore.Config, opts ...func(*dynamodb.Options)) fixture {
	t.Helper()
	ctr := dynamotest.NewCounter()
	client := dynamotest.Client(t, append([]func(*dynamodb.Options){ctr.Attach}, opts...)...)
	table := dynamotest.FreshTable(t, client)
	cfg.Client, cfg.Table = client, table
	return fixture{store: dynamostore.New(cfg), ctr: ctr, client: client, table: table}
}

// calls runs fn and returns the DynamoDB calls it issued.
func (f fixture) calls(t *testing.T, fn func() error) map[string]int {
	t.Helper()
	f.ctr.Reset()
	if err := fn(); err != nil {
		t.Fatal(err)
	}
	return f.ctr.Snapshot()
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func rawRun(t *testing.T, f fixture, tenant, runID string) map[string]types.AttributeValue {
	t.Helper()
	out, err := f.client.GetItem(t.Context(), &dynamodb.GetItemInput{
		TableName:      aws.String(f.table),
		Key:            map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: tenant + "#RUN#" + runID}, "sk": &types.AttributeValueMemberS{Value: "RUN"}},
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// TestCallBudgets asserts the docs/design.md §11 call budgets of the store primitives with the counting
// middleware, and logs the calls of every other primitive.
func TestCallBudgets(t *testing.T) {
	f := newFixture(t, dynamostore.Config{})
	ctx := contract.WithTenant(t.Context(), "acme")
	runs, inst, intents := f.store.Runs(), f.store.Instances(), f.store.Intents()
	// A step's start (reclaimAt's step is the store's driver lease, 60 s): the first
	// heartbeat renews inside the created lease's step, the second crosses it.
	now := contract.LeaseReclaimAt(time.Now().UnixMilli(), contract.DefaultDriverLease)

	type budget struct {
		name string
		max  int // 0 = report only
		fn   func() error
	}
	var epoch int64 = 1
	steps := []budget{
		{"create-claimed (new run)", 1, func() error {
			_, created, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
				NewRun: contract.NewRun{RunID: "r1", ThreadID: "th", StartedAt: now}, SandboxKey: "sk_1", LeaseUntil: now + 50_000, Token: "c1"})
			if err == nil && !created {
				err = errors.New("not created")
			}
			return err
		}},
		{"create-claimed (existing run)", 2, func() error {
			_, created, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
				NewRun: contract.NewRun{RunID: "r1", ThreadID: "th", StartedAt: now}, SandboxKey: "sk_1", LeaseUntil: now + 50_000, Token: "c2"})
			if err == nil && created {
				err = errors.New("created twice")
			}
			return err
		}},
		{"record sandbox", 1, func() error { _, err := runs.RecordSandbox(ctx, "r1", epoch, "psid-1"); return err }},
		{"heartbeat (inside the lease's step)", 1, func() error { _, err := runs.Heartbeat(ctx, "r1", epoch, now+55_000); return err }},
		{"heartbeat (crossing the step)", 2, func() error { _, err := runs.Heartbeat(ctx, "r1", epoch, now+70_000); return err }},
		{"detach", 1, func() error { _, err := runs.Detach(ctx, "r1", epoch, "sk_1", now+1); return err }},
		{"detach again", 1, func() error { _, err := runs.Detach(ctx, "r1", epoch, "sk_1", now+2); return err }},
		{"claim (attach)", 1, func() error {
			st, err := runs.Claim(ctx, "r1", contract.Claim{Token: "k1", LeaseUntil: now + 80_000, ClearDetached: true})
			epoch = st.Epoch()
			return err
		}},
		{"lapse", 1, func() error { return runs.Lapse(ctx, "r1", epoch, now+80_000) }},
		{"heartbeat (lapsed: general path)", 0, func() error { _, err := runs.Heartbeat(ctx, "r1", epoch, now+90_000); return err }},
		{"heartbeat (superseded: refusal)", 0, func() error {
			_, err := runs.Heartbeat(ctx, "r1", epoch-1, now+90_000)
			if errors.Is(err, contract.ErrSuperseded) {
				return nil
			}
			return fmt.Errorf("want ErrSuperseded, got %v", err)
		}},
		{"request cancel", 1, func() error { _, err := runs.RequestCancel(ctx, "r1"); return err }},
		{"claim (reaper cancel path)", 1, func() error {
			st, err := runs.Claim(ctx, "r1", contract.Claim{Token: "k2", LeaseUntil: now + 80_000, If: contract.ClaimCond{Cancelled: true}})
			epoch = st.Epoch()
			return err
		}},
		{"update-fenced (finish)", 1, func() error {
			_, err := runs.UpdateFenced(ctx, "r1", epoch, contract.RunPatch{
				Status: contract.Set(contract.StatusAborted), FinishedAt: contract.Set(now + 3)})
			return err
		}},
		{"update-fenced (retried finish)", 2, func() error {
			_, err := runs.UpdateFenced(ctx, "r1", epoch, contract.RunPatch{
				Status: contract.Set(contract.StatusAborted), FinishedAt: contract.Set(now + 3)})
			return err
		}},
		{"create-or-resume (new)", 1, func() error {
			_, err := refstore.Runs(runs).CreateOrResume(ctx, contract.NewRun{RunID: "r2", ThreadID: "th", StartedAt: now})
			return err
		}},
		{"update (plain)", 2, func() error {
			return refstore.Runs(runs).Update(ctx, "r2", contract.RunPatch{SandboxKey: contract.Set("sk_2")})
		}},
		{"find active run", 2, func() error {
			r, err := runs.FindActiveRun(ctx, "th")
			if err == nil && (r == nil || r.RunID != "r2") {
				err = fmt.Errorf("active run %v, want r2", r)
			}
			return err
		}},
		{"get", 1, func() error { _, err := refstore.Runs(runs).Get(ctx, "r2"); return err }},
		{"runs using key", 1, func() error { _, err := runs.RunsUsingKey(ctx, "sk_2"); return err }},
		{"list by thread", 1, func() error { _, err := refstore.Runs(runs).ListByThread(ctx, "th"); return err }},
		{"instance create-row", 1, func() error {
			return inst.CreateRow(ctx, contract.InstanceRecord{Key: "sk_1", Provider: "p", ProviderSandboxID: "psid-1", ThreadID: "th", UpdatedAt: now}, "inc1")
		}},
		{"instance get-row", 1, func() error { _, err := inst.GetRow(ctx, "sk_1"); return err }},
		{"instance touch", 1, func() error { return inst.Touch(ctx, "sk_1", "psid-1", "r1", now+5) }},
		{"instance replace-row", 1, func() error {
			return inst.ReplaceRow(ctx, contract.InstanceRecord{Key: "sk_1", Provider: "p", ProviderSandboxID: "psid-1", ThreadID: "th", UpdatedAt: now + 6}, "inc1", "inc2")
		}},
		{"instance set-snapshot", 1, func() error { return inst.SetSnapshot(ctx, "sk_1", "psid-1", "", "snap", now+7) }},
		{"instance mark-reclaiming", 1, func() error { return inst.MarkReclaiming(ctx, "sk_1", "psid-1", now+7, now+7, "rt") }},
		{"instance delete-reclaimed", 1, func() error { return inst.DeleteReclaimed(ctx, "sk_1", "rt") }},
		{"intent put", 1, func() error { return intents.Put(ctx, "sk_1", 3, now) }},
		{"intent record", 1, func() error { return intents.Record(ctx, "sk_1", 3, "psid-9") }},
		{"intent drop", 1, func() error { return intents.Drop(ctx, "sk_1", 3) }},
		{"with lock (uncontended)", 2, func() error {
			return f.store.Locks().WithLock(ctx, "k", func(context.Context) error { return nil })
		}},
		{"reclaim candidates", 0, func() error { _, err := f.store.Reaper().ReclaimCandidates(ctx, now, 25); return err }},
		{"list reclaimable", 0, func() error { _, err := refstore.Runs(runs).ListReclaimable(ctx, now, 0); return err }},
	}
	var report strings.Builder
	for _, s := range steps {
		got := f.calls(t, s.fn)
		fmt.Fprintf(&report, "\n  %-34s %d %v", s.name, total(got), got)
		if s.max > 0 && total(got) > s.max {
			t.Errorf("%s: %d calls %v, budget %d", s.name, total(got), got, s.max)
		}
	}
	t.Logf("calls per store operation:%s", report.String())
}

// TestReclaimListingScannedCount: with 10,000 terminal runs and 20 detached ones, the
// reaper's listing reads at most 25 items (docs/design.md §11): terminal runs are not in its index.
func TestReclaimListingScannedCount(t *testing.T) {
	f := newFixture(t, dynamostore.Config{})
	ctx := contract.WithTenant(t.Context(), "acme")
	now := time.Now().UnixMilli()

	// 10,000 terminal runs, written as the store writes them, 25 per BatchWriteItem (test
	// setup only; the store itself never batches writes).
	const terminal, detached = 10_000, 20
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for b := 0; b < terminal/25; b++ {
		g.Go(func() error {
			var reqs []types.WriteRequest
			for i := b * 25; i < (b+1)*25; i++ {
				fin := now - 1000
				st := contract.RunState{RunRecord: contract.RunRecord{
					RunID: fmt.Sprintf("done-%05d", i), ThreadID: fmt.Sprintf("t-%d", i%100),
					Status: contract.StatusCompleted, StartedAt: now - 5000, FinishedAt: &fin,
				}}
				reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: dynamostore.RunItemForTest(f.store, "acme", st)}})
			}
			req := map[string][]types.WriteRequest{f.table: reqs}
			for len(req) > 0 {
				out, err := f.client.BatchWriteItem(gctx, &dynamodb.BatchWriteItemInput{RequestItems: req})
				if err != nil {
					return err
				}
				req = out.UnprocessedItems
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	runs := f.store.Runs()
	for i := range detached {
		id := fmt.Sprintf("det-%02d", i)
		st, _, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
			NewRun: contract.NewRun{RunID: id, ThreadID: "t-x", StartedAt: now - 4000}, SandboxKey: "sk", LeaseUntil: now + 60_000, Token: id})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := runs.Detach(ctx, id, st.Epoch(), "sk", now-3000+int64(i)); err != nil {
			t.Fatal(err)
		}
	}

	f.ctr.Reset()
	cands, err := f.store.Reaper().ReclaimCandidates(ctx, now, 25)
	if err != nil {
		t.Fatal(err)
	}
	scanned, queries := f.ctr.Scanned(), f.ctr.Calls("Query")
	t.Logf("ReclaimCandidates over %d terminal + %d detached runs: %d candidates, ScannedCount %d, %d Query calls",
		terminal, detached, len(cands), scanned, queries)
	if len(cands) != detached {
		t.Errorf("got %d candidates, want %d", len(cands), detached)
	}
	for i := 1; i < len(cands); i++ {
		if cands[i-1].ReclaimAt > cands[i].ReclaimAt {
			t.Errorf("candidates out of order at %d: %v", i, cands)
		}
	}
	if scanned > 25 {
		t.Errorf("ScannedCount %d, budget 25", scanned)
	}

	f.ctr.Reset()
	rec, err := refstore.Runs(runs).ListReclaimable(ctx, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ListReclaimable: %d runs, ScannedCount %d, calls %v", len(rec), f.ctr.Scanned(), f.ctr.Snapshot())
	if len(rec) != detached || f.ctr.Scanned() > 25 {
		t.Errorf("ListReclaimable: %d runs (want %d), ScannedCount %d (budget 25)", len(rec), detached, f.ctr.Scanned())
	}
}

// TestHelpersFollowEveryWrite drives runs through every write path (fast and general) and
// checks after each that the stored index helpers equal what docs/design.md §3.1 derives from the stored
// state.
func TestHelpersFollowEveryWrite(t *testing.T) {
	f := newFixture(t, dynamostore.Config{})
	const tenant = "t1"
	ctx := contract.WithTenant(t.Context(), tenant)
	runs := f.store.Runs()
	now := time.Now().UnixMilli()
	checks := 0
	check := func(step, runID string) {
		t.Helper()
		item := rawRun(t, f, tenant, runID)
		want, err := dynamostore.WantHelpersForTest(f.store, tenant, item)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		for _, name := range dynamostore.HelperAttrs {
			got, has := item[name]
			w, wants := want[name]
			switch {
			case has != wants:
				t.Errorf("%s: helper %s present=%v, want %v", step, name, has, wants)
			case has && name != "gcAt" && !reflect.DeepEqual(got, w):
				t.Errorf("%s: helper %s = %v, want %v", step, name, got, w)
			}
		}
		checks++
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	st := func(s contract.RunState, err error) contract.RunState {
		t.Helper()
		must(err)
		return s
	}

	st3 := func(s contract.RunState, _ bool, err error) contract.RunState {
		t.Helper()
		must(err)
		return s
	}

	// Reference writes.
	_, err := refstore.Runs(runs).CreateOrResume(ctx, contract.NewRun{RunID: "a", ThreadID: "th", StartedAt: now})
	must(err)
	check("create-or-resume running", "a")
	_, err = refstore.Runs(runs).CreateOrResume(ctx, contract.NewRun{RunID: "b", ThreadID: "th", StartedAt: now, Status: contract.StatusInterrupted})
	must(err)
	check("create-or-resume interrupted", "b")
	must(refstore.Runs(runs).Update(ctx, "a", contract.RunPatch{SandboxKey: contract.Set("sk_a"), DetachedSince: contract.Set(now - 5)}))
	check("update detach", "a")
	must(refstore.Runs(runs).Update(ctx, "a", contract.RunPatch{CancelRequested: contract.Set(true)}))
	check("update cancel", "a")
	must(refstore.Runs(runs).Update(ctx, "a", contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)}))
	check("update interrupt", "a")
	must(refstore.Runs(runs).Update(ctx, "a", contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set(now)}))
	check("update complete", "a")
	must(refstore.Runs(runs).Update(ctx, "a", contract.RunPatch{Status: contract.Set(contract.StatusRunning), CancelRequested: contract.Clear[bool]()}))
	check("update revive (plain writes may)", "a")

	// Fenced writes, fast and general paths.
	c := st3(runs.CreateClaimed(ctx, contract.CreateClaimedRun{NewRun: contract.NewRun{RunID: "c", ThreadID: "th", StartedAt: now}, SandboxKey: "sk_c", LeaseUntil: now + 100, Token: "tc"}))
	check("create-claimed", "c")
	c = st(runs.Heartbeat(ctx, "c", c.Epoch(), now+200))
	check("heartbeat", "c")
	c = st(runs.Detach(ctx, "c", c.Epoch(), "sk_c", now+10))
	check("detach", "c")
	_ = st(runs.Heartbeat(ctx, "c", c.Epoch(), now+300))
	check("heartbeat detached", "c")
	c = st(runs.Claim(ctx, "c", contract.Claim{Token: "k1", LeaseUntil: now + 400, ClearDetached: true}))
	check("claim attach", "c")
	must(runs.Lapse(ctx, "c", c.Epoch(), now+400))
	check("lapse", "c")
	c = st(runs.Heartbeat(ctx, "c", c.Epoch(), now+500))
	check("heartbeat undoes lapse", "c")
	c = st(runs.UpdateFenced(ctx, "c", c.Epoch(), contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)}))
	check("update-fenced interrupt", "c")
	_ = st(runs.Heartbeat(ctx, "c", c.Epoch(), now+600))
	check("heartbeat interrupted", "c")
	_ = st(runs.RequestCancel(ctx, "c"))
	check("cancel interrupted", "c")
	c = st(runs.Claim(ctx, "c", contract.Claim{Token: "k2", LeaseUntil: now + 700}))
	check("claim cancelled interrupted (general path)", "c")
	c = st(runs.Heartbeat(ctx, "c", c.Epoch(), now+800))
	check("heartbeat cancelled", "c")
	c = st(runs.Detach(ctx, "c", c.Epoch(), "sk_c2", now+20))
	check("detach cancelled", "c")
	c = st(runs.Claim(ctx, "c", contract.Claim{Token: "k3", LeaseUntil: now + 900, If: contract.ClaimCond{Cancelled: true, DetachedSince: c.DetachedSince}}))
	check("claim reaper cancel path", "c")
	c = st(runs.UpdateFenced(ctx, "c", c.Epoch(), contract.RunPatch{Usage: contract.Set(json.RawMessage(`{"tokens":1}`))}))
	check("update-fenced neutral", "c")
	c = st(runs.UpdateFenced(ctx, "c", c.Epoch(), contract.RunPatch{DetachedSince: contract.Clear[int64](), CancelRequested: contract.Set(false)}))
	check("update-fenced general", "c")
	c = st(runs.RecordSandbox(ctx, "c", c.Epoch(), "psid"))
	check("record sandbox", "c")
	c = st(runs.RequestCancel(ctx, "c"))
	check("cancel running", "c")
	c = st(runs.UpdateFenced(ctx, "c", c.Epoch(), contract.RunPatch{Status: contract.Set(contract.StatusAborted), FinishedAt: contract.Set(now + 1000)}))
	check("update-fenced terminal", "c")

	d := st3(runs.CreateClaimed(ctx, contract.CreateClaimedRun{NewRun: contract.NewRun{RunID: "d", ThreadID: "th", StartedAt: now, Status: contract.StatusInterrupted}, SandboxKey: "sk_d", Token: "td"}))
	check("create-claimed interrupted", "d")
	_ = st(runs.Detach(ctx, "d", d.Epoch(), "sk_d", now))
	check("detach interrupted", "d")
	_ = st(runs.Claim(ctx, "d", contract.Claim{Token: "k4", LeaseUntil: now + 5}))
	check("claim interrupted", "d")
	if checks != 29 {
		t.Fatalf("only %d checks ran", checks)
	}
}

// TestTenantFirstKeys: every base key of a run, instance, lock and intent starts with the
// tenant, the same id under two tenants is two items, and a malformed tenant is refused.
func TestTenantFirstKeys(t *testing.T) {
	f := newFixture(t, dynamostore.Config{})
	now := time.Now().UnixMilli()
	for _, tenant := range []string{"a", "b"} {
		ctx := contract.WithTenant(t.Context(), tenant)
		if _, err := refstore.Runs(f.store.Runs()).CreateOrResume(ctx, contract.NewRun{RunID: "same", ThreadID: "th", StartedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := refstore.Instances(f.store.Instances()).Upsert(ctx, contract.InstanceRecord{Key: "same", ProviderSandboxID: "p-" + tenant}); err != nil {
			t.Fatal(err)
		}
		if err := f.store.Intents().Put(ctx, "same", 1, now); err != nil {
			t.Fatal(err)
		}
		if err := f.store.Locks().WithLock(ctx, "same", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for _, tenant := range []string{"a", "b"} {
		for _, kind := range []string{"RUN", "INST", "INTENT", "LOCK"} {
			out, err := f.client.GetItem(t.Context(), &dynamodb.GetItemInput{
				TableName: aws.String(f.table), ConsistentRead: aws.Bool(true),
				Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: tenant + "#" + kind + "#same"}, "sk": &types.AttributeValueMemberS{Value: kind}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if out.Item == nil {
				t.Errorf("no %s item under key %s#%s#same", kind, tenant, kind)
			}
			seen[tenant+kind] = true
		}
	}
	if len(seen) != 8 {
		t.Errorf("saw %d distinct items, want 8", len(seen))
	}
	bad := contract.WithTenant(t.Context(), "x#RUN#y")
	if _, err := refstore.Runs(f.store.Runs()).Get(bad, "same"); !errors.Is(err, contract.ErrInvalid) {
		t.Errorf("tenant with a separator: %v, want ErrInvalid", err)
	}
}

// contention is what contend measured.
type contention struct {
	entered, overlaps, fenceDrops, retries int
	lastFence                              int64
}

// contend runs workers goroutines × sections lock sections on one key over the stores
// (round robin), counting overlapping sections and refused acquires (ctr counts all).
func contend(t *testing.T, stores []*dynamostore.Store, ctr *dynamotest.Counter, workers, sections int, hold time.Duration) contention {
	t.Helper()
	ctx := contract.WithTenant(t.Context(), "acme")
	ctr.Reset()
	var mu sync.Mutex
	var c contention
	inside := 0
	g, gctx := errgroup.WithContext(ctx)
	for w := range workers {
		locks := stores[w%len(stores)].Locks()
		g.Go(func() error {
			for range sections {
				err := locks.WithLock(gctx, "hot", func(ctx context.Context) error {
					mu.Lock()
					inside++
					c.entered++
					if inside > 1 {
						c.overlaps++
					}
					fence := contract.LeaseFence(ctx)
					if fence <= c.lastFence {
						c.fenceDrops++
					}
					c.lastFence = max(c.lastFence, fence)
					mu.Unlock()
					time.Sleep(hold) // hold it across scheduling points
					mu.Lock()
					inside--
					mu.Unlock()
					return nil
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	c.retries = ctr.ConditionFailures("UpdateItem")
	return c
}

// replicas returns n stores over n separate clients sharing one fresh table, each client
// wrapped by wrap when given (a fault at the client seam).
func replicas(t *testing.T, n int, ctr *dynamotest.Counter, cfg dynamostore.Config, wrap ...func(dynamostore.Client) dynamostore.Client) []*dynamostore.Store {
	t.Helper()
	first := dynamotest.Client(t, ctr.Attach)
	table := dynamotest.FreshTable(t, first)
	var out []*dynamostore.Store
	for i := range n {
		c := cfg
		c.Client, c.Table = first, table
		if i > 0 {
			c.Client = dynamotest.Client(t, ctr.Attach)
		}
		for _, w := range wrap {
			c.Client = w(c.Client)
		}
		out = append(out, dynamostore.New(c))
	}
	return out
}

// TestLocksAcrossReplicas: three stores over three clients (three "replicas") contend for
// one key; 16 goroutines × 20 sections never overlap, fences strictly increase, and the
// contention path (a refused acquire) is hit.
func TestLocksAcrossReplicas(t *testing.T) {
	ctr := dynamotest.NewCounter()
	const workers, sections = 16, 20
	c := contend(t, replicas(t, 3, ctr, dynamostore.Config{}), ctr, workers, sections, 200*time.Microsecond)
	t.Logf("%d sections over 3 replicas: %d overlaps, %d refused acquires (contention retries), last fence %d",
		c.entered, c.overlaps, c.retries, c.lastFence)
	if c.entered != workers*sections {
		t.Errorf("entered %d sections, want %d", c.entered, workers*sections)
	}
	if c.overlaps != 0 {
		t.Errorf("%d overlapping sections", c.overlaps)
	}
	if c.fenceDrops != 0 {
		t.Errorf("fence did not increase %d times", c.fenceDrops)
	}
	if c.retries == 0 {
		t.Error("no acquire was ever refused: the contention path was not exercised")
	}
}

// TestLocksAcrossReplicasNegativeControl: the same contention against stores whose
// acquire ignores the holder must show overlaps, proving the overlap count can fail.
func TestLocksAcrossReplicasNegativeControl(t *testing.T) {
	ctr := dynamotest.NewCounter()
	stores := replicas(t, 3, ctr, dynamostore.Config{}, dynamotest.UnconditionalLocks)
	c := contend(t, stores, ctr, 8, 10, 2*time.Millisecond)
	t.Logf("broken lease: %d sections, %d overlaps", c.entered, c.overlaps)
	if c.overlaps == 0 {
		t.Error("an unconditional lease put produced no overlap: the test cannot detect the defect")
	}
}

// TestStalledHolderAcrossReplicas: a stuck holder whose renewals stall (and which never
// releases) loses its lease (fn's ctx cancelled with ErrLeaseLost) before a caller on
// another replica gets in by the lease's expiry, within lease + skew + one backoff step
// (bounded at 1 s beyond the lease + skew).
func TestStalledHolderAcrossReplicas(t *testing.T) {
	// The holder gives up at lease−skew after its last renewal, the next caller gets in
	// after lease+skew: a 2×skew (500 ms) margin keeps the ordering check robust under load.
	timing := contract.LockTiming{Lease: 800 * time.Millisecond, Renew: 200 * time.Millisecond, Skew: 250 * time.Millisecond}
	first := dynamotest.Client(t)
	table := dynamotest.FreshTable(t, first)
	// The holder's renewals are held back at its client (a partition from its lease item).
	stalling := dynamotest.NewStallingClient(first)
	holder := dynamostore.New(dynamostore.Config{Client: stalling, Table: table, Lock: timing})
	other := dynamostore.New(dynamostore.Config{Client: dynamotest.Client(t), Table: table, Lock: timing})
	ctx := contract.WithTenant(t.Context(), "acme")

	var acquiredAt, lostAt, enteredAt time.Time
	var cause error
	holding, entered := make(chan struct{}), make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		holderDone <- holder.Locks().WithLock(ctx, "k", func(lctx context.Context) error {
			acquiredAt = time.Now()
			// Survive at least one renewal, then stall them all.
			time.Sleep(2 * timing.Renew)
			t.Cleanup(stalling.StallRenewals("k"))
			close(holding)
			select {
			case <-lctx.Done():
				lostAt, cause = time.Now(), context.Cause(lctx)
			case <-time.After(10 * time.Second):
			}
			// A stuck holder: it does not return (and so does not release) until the next
			// caller is in, so that caller must get in by the lease's expiry.
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
			}
			return nil
		})
	}()
	<-holding
	stallStart := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := other.Locks().WithLock(wctx, "k", func(context.Context) error {
		enteredAt = time.Now()
		close(entered)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-holderDone; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(cause, contract.ErrLeaseLost) {
		t.Fatalf("holder's ctx cause = %v, want ErrLeaseLost", cause)
	}
	if stalling.Held() == 0 {
		t.Error("no renewal was held back at the client: the stall path was not taken")
	}
	if !lostAt.Before(enteredAt) {
		t.Errorf("the next caller got in (%v) before the holder lost its lease (%v)", enteredAt, lostAt)
	}
	// Measured from the stall (after which no renewal was sent): the lease ends at most
	// lease after the last renewal, which was before the stall.
	wait := enteredAt.Sub(stallStart)
	bound := timing.Lease + timing.Skew + time.Second
	t.Logf("holder acquired %v, stalled %v later, lost its lease %v after the stall, next caller in %v after the stall (bound %v)",
		acquiredAt.Format(time.StampMilli), stallStart.Sub(acquiredAt), lostAt.Sub(stallStart), wait, bound)
	if wait > bound {
		t.Errorf("next caller waited %v after the stall, bound %v", wait, bound)
	}
}

// TestNoScanNoTransaction proves statically that the store never issues a Scan, a
// transaction or a batched write: none of those client methods appears in its sources.
func TestNoScanNoTransaction(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		for _, banned := range []string{".Scan(", "TransactWriteItems", "TransactGetItems", "BatchWriteItem", "ExecuteStatement"} {
			if strings.Contains(src, banned) {
				t.Errorf("%s uses %s", name, banned)
			}
		}
		checked++
	}
	if checked < 5 {
		t.Fatalf("checked only %d source files", checked)
	}
}

// TestStaleIndexHitsSkipped: an index entry whose base item no longer qualifies (index lag,
// emulated by writing a base item that keeps stale helpers) is never returned by the
// listings that re-read: FindActiveRun and ListReclaimable.
func TestStaleIndexHitsSkipped(t *testing.T) {
	f := newFixture(t, dynamostore.Config{})
	ctx := contract.WithTenant(t.Context(), "acme")
	now := time.Now().UnixMilli()
	runs := f.store.Runs()
	if _, err := refstore.Runs(runs).CreateOrResume(ctx, contract.NewRun{RunID: "old", ThreadID: "th", StartedAt: now - 10}); err != nil {
		t.Fatal(err)
	}
	if err := refstore.Runs(runs).Update(ctx, "old", contract.RunPatch{DetachedSince: contract.Set(now - 10)}); err != nil {
		t.Fatal(err)
	}
	// "new" is indexed as running and detached, but its base item says completed.
	ds := now - 20
	item := dynamostore.RunItemForTest(f.store, "acme", contract.RunState{RunRecord: contract.RunRecord{
		RunID: "new", ThreadID: "th", Status: contract.StatusRunning, StartedAt: now, DetachedSince: &ds}})
	item["status"] = &types.AttributeValueMemberS{Value: string(contract.StatusCompleted)}
	if _, err := f.client.PutItem(t.Context(), &dynamodb.PutItemInput{TableName: aws.String(f.table), Item: item}); err != nil {
		t.Fatal(err)
	}
	cands, err := f.store.Reaper().ReclaimCandidates(ctx, now, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 2 {
		t.Fatalf("the reclaim index lists %d runs, want 2 (the stale hit included): the lag was not emulated", len(cands))
	}
	active, err := runs.FindActiveRun(ctx, "th")
	if err != nil {
		t.Fatal(err)
	}
	if active == nil || active.RunID != "old" {
		t.Errorf("FindActiveRun = %v, want old (the newer hit is stale)", active)
	}
	rec, err := refstore.Runs(runs).ListReclaimable(ctx, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) != 1 || rec[0].RunID != "old" {
		t.Errorf("ListReclaimable = %v, want only old", rec)
	}
}

// TestTouchNeverCreatesARow: Touch and SetSnapshot on a missing row are ErrConflict and
// write nothing, even for an empty providerSandboxId (whose condition is "absent").
func TestTouchNeverCreatesARow(t *testing.T) {
	f := newFixture(t, dynamostore.Config{})
	ctx := contract.WithTenant(t.Context(), "acme")
	inst := f.store.Instances()
	if err := inst.Touch(ctx, "nokey", "", "r1", 5); !errors.Is(err, contract.ErrConflict) {
		t.Errorf("Touch on a missing row: %v, want ErrConflict", err)
	}
	if err := inst.SetSnapshot(ctx, "nokey", "", "", "snap", 5); !errors.Is(err, contract.ErrConflict) {
		t.Errorf("SetSnapshot on a missing row: %v, want ErrConflict", err)
	}
	if row, err := inst.GetRow(ctx, "nokey"); err != nil || row != nil {
		t.Errorf("GetRow after refused writes = %v, %v; want no row", row, err)
	}
}

// TestBatchReads: GetRowAndIntent and GetStateAndRow read both items in one consistent
// BatchGetItem; missing and done items are nil.
func TestBatchReads(t *testing.T) {
	f := newFixture(t, dynamostore.Config{})
	ctx := contract.WithTenant(t.Context(), "acme")
	now := time.Now().UnixMilli()
	var row *contract.InstanceRow
	var in *contract.Intent
	var st *contract.RunState
	got := f.calls(t, func() (err error) { row, in, err = f.store.GetRowAndIntent(ctx, "k"); return err })
	if row != nil || in != nil || total(got) != 1 {
		t.Fatalf("empty: row %v intent %v calls %v", row, in, got)
	}
	if err := f.store.Instances().CreateRow(ctx, contract.InstanceRecord{Key: "k", ProviderSandboxID: "p", UpdatedAt: now}, "inc"); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Intents().Put(ctx, "k", 4, now); err != nil {
		t.Fatal(err)
	}
	got = f.calls(t, func() (err error) { row, in, err = f.store.GetRowAndIntent(ctx, "k"); return err })
	if row == nil || row.Incarnation != "inc" || in == nil || in.Token != 4 || got["BatchGetItem"] != 1 || total(got) != 1 {
		t.Fatalf("row %+v intent %+v calls %v", row, in, got)
	}
	if err := f.store.Intents().Drop(ctx, "k", 4); err != nil {
		t.Fatal(err)
	}
	if _, in, _ = f.store.GetRowAndIntent(ctx, "k"); in != nil {
		t.Errorf("dropped intent read back as %+v", in)
	}
	if _, err := refstore.Runs(f.store.Runs()).CreateOrResume(ctx, contract.NewRun{RunID: "r", ThreadID: "th", StartedAt: now}); err != nil {
		t.Fatal(err)
	}
	got = f.calls(t, func() (err error) { st, row, err = f.store.GetStateAndRow(ctx, "r", "k"); return err })
	if st == nil || st.RunID != "r" || row == nil || total(got) != 1 {
		t.Fatalf("state %+v row %+v calls %v", st, row, got)
	}
	if st, row, err := f.store.GetStateAndRow(ctx, "nope", "nokey"); err != nil || st != nil || row != nil {
		t.Errorf("missing: %v %v %v", st, row, err)
	}
}
