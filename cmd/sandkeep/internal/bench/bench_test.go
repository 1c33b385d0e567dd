package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestCheckStart pins docs/design.md §11's bound: 1.3 × (max(put, get) + update) + 0.5 ms.
func TestCheckStart(t *testing.T) {
	c := checkStart(4*time.Millisecond, 1*time.Millisecond, 2*time.Millisecond, 1*time.Millisecond)
	if want := 4400 * time.Microsecond; c.Bound != want {
		t.Fatalf("bound = %v, want %v", c.Bound, want)
	}
	if !c.Holds || c.Ratio <= 0.9 || c.Ratio >= 0.91 {
		t.Fatalf("check = %+v, want holds with ratio 4/4.4", c)
	}
	c = checkStart(5*time.Millisecond, 1*time.Millisecond, 2*time.Millisecond, 1*time.Millisecond)
	if c.Holds {
		t.Fatalf("5 ms over a 4.4 ms bound holds: %+v", c)
	}
	// The diagnostic against the start's own call pattern: 1.3 × 4 ms + 0.5 ms = 5.7 ms.
	c.checkPath(4 * time.Millisecond)
	if c.PathBound != 5700*time.Microsecond || !c.PathHolds || c.Holds {
		t.Fatalf("path check = %+v, want bound 5.7 ms holding while docs/design.md §11's does not", c)
	}
}

// TestBudgetCells pins how exact budgets and bounds are judged.
func TestBudgetCells(t *testing.T) {
	exact := newOp("x", 3, true)
	exact.Calls = []int{3, 3, 4}
	bound := newOp("y", 4, false)
	bound.Calls = []int{2, 4}
	none := newOp("z", 0, false)
	none.Calls = []int{40}
	if exact.WithinBudget() || !bound.WithinBudget() || !none.WithinBudget() {
		t.Fatalf("within: exact %v bound %v none %v", exact.WithinBudget(), bound.WithinBudget(), none.WithinBudget())
	}
	if got := callsCell(exact); got != "3.33 (3–4)" {
		t.Errorf("callsCell = %q", got)
	}
	if got := byAPICell(map[string]int{"PutItem": 3, "GetItem": 2}, 2); got != "GetItem 1, PutItem 1.5" {
		t.Errorf("byAPICell = %q", got)
	}
}

// TestRunTiny runs every section on a tiny config against dynalite: the operations run and
// are counted, the contended starts make one sandbox, the reaper drains every run. No
// timing is asserted.
func TestRunTiny(t *testing.T) {
	ep := dynamotest.Endpoint(t)
	var progress bytes.Buffer
	rep, err := Run(t.Context(), Config{Endpoint: ep, Ops: 3, Warmup: 1, Contention: 8, Reap: 12, ReapBatch: 5, Deliveries: 2, AgentLines: 5, AgentSilent: time.Second,
		PushLines: 5, PushWatchers: 20, PushIdle: time.Second, ShipLines: 3, ShipChatty: 20, ShipSilent: 500 * time.Millisecond, ShipLaunches: 1,
		Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if p := rep.Push; p == nil || len(p.Delivery) != 2 || p.Delivery[1].Via != "push" || p.Delivery[1].Reads != 0 ||
		len(p.Idle) != 3 || p.Idle[0].Dynamo != 0 || len(p.Watchers) != 2 || p.Watchers[0].Goroutines < 20 || p.Watchers[1].Goroutines < 20 || p.Watchers[1].Idle == 0 || sum(p.Watchers[1].Dynamo) != 0 {
		t.Fatalf("push section %+v", rep.Push)
	}
	if s := rep.Ship; s == nil || s.Stored.N() != 3 || len(s.Delivery) != 3 || len(s.Runs) != 3 || s.LaunchShip.N() != 1 || s.LaunchNoShip.N() != 1 {
		t.Fatalf("shipper section %+v", rep.Ship)
	} else {
		for _, d := range s.Delivery {
			if d.N() != 3 {
				t.Errorf("%s: %d lines, want 3", d.Name, d.N())
			}
		}
		for _, r := range s.Runs {
			// Every run made ship requests at A and stored its lines through them; the
			// end request is among them, and A's calls include at least one append per line batch.
			if r.Requests < 2 || r.RequestsBy["POST end"] != 1 || r.Dynamo < 1 || r.Busy <= 0 {
				t.Errorf("shipped run %s: %d requests %v, %d DynamoDB calls, busy %v", r.Name, r.Requests, r.RequestsBy, r.Dynamo, r.Busy)
			}
		}
		d := s.Deployed
		if d == nil || d.Delay.N() != 3 || d.EvPosts < 1 || d.Requests["POST ship"] < 1 || d.ShipDynamo["PutItem"] < 1 || d.IdleDynamo != 0 || d.IdleInvokes != 0 {
			t.Errorf("deployed push path %+v", d)
		}
		// The cost model's split holds every request of the run: the first and the end are
		// paid once, and every append is in one part or the other.
		if d != nil && (d.OnceRequests < 2 || d.OnceDynamo["PutItem"]+d.AppendDynamo["PutItem"] < d.ShipDynamo["PutItem"] || d.SumLogBytes == 0) {
			t.Errorf("deployed run split into %d once requests %v and %d appends %v; its calls %v; its sums %d bytes", d.OnceRequests, d.OnceDynamo, d.Appends, d.AppendDynamo, d.ShipDynamo, d.SumLogBytes)
		}
	}
	if len(rep.Ops) != 9 || len(rep.Bare) != 4 || len(rep.StartSplit) != 4 {
		t.Fatalf("%d operations, %d bare rows, %d split rows; want 9, 4, 4", len(rep.Ops), len(rep.Bare), len(rep.StartSplit))
	}
	for _, o := range append(rep.Ops, rep.Bare...) {
		want := 3
		if o.Name == OpAppend || o.Name == OpRead {
			want = 6 // two per iteration
		}
		if o.N() != want {
			t.Errorf("%s: %d samples, want %d", o.Name, o.N(), want)
		}
		if lo, _ := o.CallsRange(); lo < 1 {
			t.Errorf("%s: a sample made %d DynamoDB calls", o.Name, lo)
		}
	}
	for _, o := range rep.Bare {
		want := 1
		if o.Name == BarePath {
			want = 3
		}
		if lo, hi := o.CallsRange(); lo != want || hi != want || len(o.ByAPI) != want {
			t.Errorf("%s: calls %d–%d %v, want exactly %d", o.Name, lo, hi, o.ByAPI, want)
		}
	}
	for _, o := range rep.StartSplit {
		if o.N() != 3 {
			t.Errorf("%s: %d samples, want 3", o.Name, o.N())
		}
	}
	if p := rep.StartSplit[0].Percentile(50); p <= 0 || p >= rep.StartCheck.Start+time.Millisecond {
		// A call inside the start cannot take longer than the start itself.
		t.Errorf("the start's PutItem p50 %v vs the start's p50 %v", p, rep.StartCheck.Start)
	}
	if rep.StartCheck.Bound <= 500*time.Microsecond || rep.StartCheck.Start <= 0 {
		t.Errorf("start check not computed: %+v", rep.StartCheck)
	}
	c := rep.Contention
	if c == nil || !c.Holds || c.Creates != 1 || c.DistinctIDs != 1 || c.Destroys != 0 || c.Outcomes[keeper.OutcomeCreated] != 1 {
		t.Fatalf("contention = %+v, want 1 create, 1 id, 0 destroys", c)
	}
	r := rep.Reap
	if r == nil || !r.Drained || r.Reaped != 12 || r.Aborted != 12 || r.Destroys != 12 || r.Outcomes[reaper.Expired] != 12 {
		t.Fatalf("reap = %+v, want 12 runs expired, aborted and destroyed", r)
	}
	if r.Sweeps < 3 || r.EmptySweep < 1 || r.Calls <= r.Sweeps*r.EmptySweep {
		t.Errorf("reap: %d sweeps of 5, empty sweep %d calls, %d calls in all", r.Sweeps, r.EmptySweep, r.Calls)
	}
	if len(rep.Delivery) != 2 || rep.Delivery[0].Delay.N() != 2 || rep.Delivery[1].Delay.N() != 2 {
		t.Fatalf("delivery = %+v, want 2 samples on memory and on dynalite", rep.Delivery)
	}
	if d := rep.Delivery[1]; d.Reads < 2 || len(d.Delay.Calls) != 2 {
		t.Errorf("dynalite delivery: %d reads over %d samples: the reader's reads were not counted", d.Reads, len(d.Delay.Calls))
	}
	if len(rep.AgentDelivery) != 2 {
		t.Fatalf("agent delivery = %+v, want memory and dynalite", rep.AgentDelivery)
	}
	for _, d := range rep.AgentDelivery {
		if d.Delay.N() != 5 || d.Delay.Percentile(50) <= 0 || d.Batches != 20 || d.SilentPumps < 1 || d.SilentWindow < time.Second {
			t.Errorf("agent delivery on %s: %d lines (p50 %v), %d batches, %d silent pumps in %v", d.Backend, d.Delay.N(),
				d.Delay.Percentile(50), d.Batches, d.SilentPumps, d.SilentWindow)
		}
	}
	if d := rep.AgentDelivery[1]; !d.HasDynamo || d.BatchCalls < d.Batches || d.BatchByAPI["PutItem"] < d.Batches {
		t.Errorf("dynalite agent delivery: %d calls over %d batches (%v): each batch is at least one PutItem", d.BatchCalls, d.Batches, d.BatchByAPI)
	}
	var md bytes.Buffer
	if err := rep.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| " + OpStartResumed + " | 3 |", "### docs/design.md §11 start check", "ratio ", "8 concurrent starts", "| 12 | 5 |", "| dynalite | 2 |", "### Agent delivery", "| dynalite | 5 |",
		"### Shipper (docs/design.md §8.2)", "| chatty | 20 |", "| push on A |", "push, dev: p50 ≤ 100", "### Push, deployed path (docs/design.md §8.1)", "| **total** (aim ≤ $0.001"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
	if !strings.Contains(progress.String(), "reaper drain of 12") {
		t.Errorf("progress lacks the reaper section: %q", progress.String())
	}
	t.Logf("\n%s", md.String())
}

// TestRunRejects covers the config errors (no engine needed).
func TestRunRejects(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no endpoint":  {},
		"negative ops": {Endpoint: "http://127.0.0.1:1", Ops: -1},
		"huge event":   {Endpoint: "http://127.0.0.1:1", AppendBytes: 300 << 10},
	} {
		if _, err := Run(t.Context(), cfg); err == nil {
			t.Errorf("%s: Run accepted %+v", name, cfg)
		}
	}
}
