package dynamostore_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// newProxiedEnv is a log env whose client goes through a fault proxy in front of the
// local engine, with quick retries and no retry quota.
func newProxiedEnv(t *testing.T) (*logEnv, *dynamotest.Proxy) {
	t.Helper()
	p := dynamotest.NewProxy(dynamotest.Endpoint(t))
	t.Cleanup(p.Close)
	return newLogEnvAt(t, p.URL(), dynamotest.FastRetries(10)), p
}

// putRun creates runID claimed by epoch 1 and, when epoch > 1, claims it up to epoch;
// a terminal status is then written under that epoch (the log is left open).
func (e *logEnv) putRun(runID string, status contract.RunStatus, epoch int64) {
	e.t.Helper()
	runs := e.store.Runs()
	now := time.Now().UnixMilli()
	_, _, err := runs.CreateClaimed(e.ctx, contract.CreateClaimedRun{
		NewRun:     contract.NewRun{RunID: runID, ThreadID: "th", StartedAt: now},
		SandboxKey: "sk_log", LeaseUntil: now + contract.DefaultDriverLease, Token: "create-" + runID,
	})
	if err != nil {
		e.t.Fatalf("create run: %v", err)
	}
	for ep := int64(2); ep <= epoch; ep++ {
		if _, err := runs.Claim(e.ctx, runID, contract.Claim{Token: fmt.Sprintf("claim-%d", ep), LeaseUntil: now + contract.DefaultDriverLease}); err != nil {
			e.t.Fatalf("claim: %v", err)
		}
	}
	if status == contract.StatusRunning {
		return
	}
	if _, err := runs.UpdateFenced(e.ctx, runID, epoch, contract.RunPatch{Status: contract.Set(status), FinishedAt: contract.Set(now)}); err != nil {
		e.t.Fatalf("finish run: %v", err)
	}
}

// TestLogAmbiguousWritesStoreOnce: every kind of log write whose first attempt lands but
// whose response is lost (the proxy applies it, then drops the connection or answers 500)
// is retried by the SDK, meets its own slot, recognises it and stores exactly once.
func TestLogAmbiguousWritesStoreOnce(t *testing.T) {
	// drop loses the response of the first put at the slot of offset at.
	drop := func(as500 bool, at int64) dynamotest.Fault {
		sk := fmt.Sprintf(`"sk":{"S":"%020d"}`, at)
		return dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Op: "PutItem", Times: 1, As500: as500,
			Match: func(_ string, body []byte) bool { return strings.Contains(string(body), sk) }}
	}
	cases := []struct {
		name   string
		faults []dynamotest.Fault
		run    func(t *testing.T, e *logEnv, c contract.Cursor) // c: epoch 1's cursor after 2 events
		chain  string
	}{
		{"Append", []dynamotest.Fault{drop(false, 3)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			res := mustAppend(t, e.ctx, e.log, "r", c, evs(2, 2))
			if res.Last != 4 || res.Src != 30 {
				t.Fatalf("append: %+v", res)
			}
		}, "events@1e1 events@3e1"},
		{"AppendAnswered500", []dynamotest.Fault{drop(true, 3)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			mustAppend(t, e.ctx, e.log, "r", c, evs(2, 2))
		}, "events@1e1 events@3e1"},
		{"Fence", []dynamotest.Fault{drop(false, 3)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			f, err := e.log.Fence(e.ctx, "r", 2)
			if err != nil || f.Last != 3 || f.Cursor != (contract.Cursor{Epoch: 2, Next: 4, Src: 10}) {
				t.Fatalf("fence: %+v %v", f, err)
			}
		}, "events@1e1 fence@3e2"},
		{"MarkCancel", []dynamotest.Fault{drop(false, 3)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			if err := e.log.MarkCancel(e.ctx, "r"); err != nil {
				t.Fatal(err)
			}
		}, "events@1e1 cancel@3e1"},
		{"MarkWatch", []dynamotest.Fault{drop(false, 3)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			if err := e.log.MarkWatch(e.ctx, "r"); err != nil {
				t.Fatal(err)
			}
		}, "events@1e1 watch@3e1"},
		{"Close", []dynamotest.Fault{drop(false, 3)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			if err := e.log.Close(e.ctx, "r", c); err != nil {
				t.Fatal(err)
			}
		}, "events@1e1 close@3e1"},
		{"ReaderClose", []dynamotest.Fault{drop(false, 3)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			_, next, closed, err := e.log.Read(e.ctx, "r", 2, 10)
			if err != nil || !closed || next != 2 {
				t.Fatalf("read: next %d closed %v err %v", next, closed, err)
			}
		}, "events@1e1 close@3e1"},
		{"SplitBatch", []dynamotest.Fault{drop(false, 3), drop(false, 5)}, func(t *testing.T, e *logEnv, c contract.Cursor) {
			res := mustAppend(t, e.ctx, e.log, "r", c, bigEvents(3, 150<<10))
			if res.Last != 5 || res.Src != 1002 {
				t.Fatalf("append: %+v", res)
			}
		}, "events@1e1 events@3e1 events@5e1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, p := newProxiedEnv(t)
			c := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2)).Cursor
			e.putRun("r", contract.StatusCompleted, 1) // read only by the reader's close
			var rules []*dynamotest.Rule
			for _, f := range tc.faults {
				rules = append(rules, p.Inject(f))
			}
			e.ctr.Reset()
			tc.run(t, e, c)
			for i, r := range rules {
				if r.Hits() != 1 {
					t.Fatalf("fault %d fired %d times, want once", i, r.Hits())
				}
			}
			// Each lost response made the SDK's retry meet the slot its first attempt took.
			if n := e.ctr.ConditionFailures("PutItem"); n != len(rules) {
				t.Fatalf("retried puts meeting their own slot: %d, want %d", n, len(rules))
			}
			if got := kinds(e.raw("acme", "r")); got != tc.chain {
				t.Fatalf("chain %s, want %s", got, tc.chain)
			}
		})
	}
}

// bigEvents returns n distinct events of about size bytes each.
func bigEvents(n, size int) []contract.Event {
	out := make([]contract.Event, n)
	for i := range out {
		out[i] = contract.Event{Src: int64(1000 + i), Data: json.RawMessage(fmt.Sprintf(`"%03d%s"`, i, strings.Repeat("b", size)))}
	}
	return out
}

// TestLogFaultStorm: a driver's whole life (appends, a cancel, a take-over, more appends,
// close) through a proxy that, seeded, applies-then-drops 30% of puts and throttles or
// fails 15% of all calls. The log must read exactly as written: each event once, in order,
// closed, with one item per write.
func TestLogFaultStorm(t *testing.T) {
	e, p := newProxiedEnv(t)
	p.Seed(7)
	p.Inject(dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Op: "PutItem", Probability: 0.3})
	p.Inject(dynamotest.Fault{Kind: dynamotest.Throttle, Probability: 0.05})
	p.Inject(dynamotest.Fault{Kind: dynamotest.Throttle, Probability: 0.05, ProvisionedThroughput: true})
	p.Inject(dynamotest.Fault{Kind: dynamotest.ServerError, Probability: 0.05})

	var want []string
	c, n := contract.Cursor{Epoch: 1, Next: 1}, 0
	appendN := func(k int) {
		batch := evs(n, k)
		for _, ev := range batch {
			want = append(want, string(ev.Data))
		}
		n += k
		c = mustAppend(t, e.ctx, e.log, "r", c, batch).Cursor
	}
	for i := range 20 {
		appendN(1 + i%4)
	}
	if err := e.log.MarkCancel(e.ctx, "r"); err != nil {
		t.Fatal(err)
	}
	res := mustAppend(t, e.ctx, e.log, "r", c, evs(n, 1))
	want, n, c = append(want, fmt.Sprintf(`{"i":%d}`, n)), n+1, res.Cursor
	if !res.CancelRequested {
		t.Fatal("the cancel marker was not seen")
	}
	f, err := e.log.Fence(e.ctx, "r", 2)
	if err != nil || f.Src != int64(10*(n-1)) {
		t.Fatalf("fence: %+v %v", f, err)
	}
	_, err = e.log.Append(e.ctx, "r", c, evs(n, 1))
	wantErr(t, err, contract.ErrSuperseded, "epoch 1 after the fence")
	c = f.Cursor
	for i := range 10 {
		appendN(1 + i%3)
	}
	if err := e.log.Close(e.ctx, "r", c); err != nil {
		t.Fatal(err)
	}

	got, closed := readAll(t, e.ctx, e.log, "r", 7)
	if !closed || len(got) != len(want) {
		t.Fatalf("read %d events (closed %v), want %d", len(got), closed, len(want))
	}
	for i := range got {
		if string(got[i].Data) != want[i] || got[i].Offset <= 0 || i > 0 && got[i].Offset <= got[i-1].Offset {
			t.Fatalf("event %d: %s at %d, want %s", i, got[i].Data, got[i].Offset, want[i])
		}
	}
	items := e.raw("acme", "r")
	count := map[string]int{}
	for _, it := range items {
		count[it.kind]++
	}
	if count["events"] != 31 || count["cancel"] != 1 || count["fence"] != 1 || count["close"] != 1 {
		t.Fatalf("chain holds %v: %s", count, kinds(items))
	}
	drops := p.Injected(dynamotest.ApplyThenDrop)
	t.Logf("faults injected: apply-then-drop %d, throttle %d, server-error %d; own-slot retries recognised %d",
		drops, p.Injected(dynamotest.Throttle), p.Injected(dynamotest.ServerError), e.ctr.ConditionFailures("PutItem"))
	if drops == 0 || p.Injected(dynamotest.Throttle) == 0 {
		t.Fatalf("the storm injected no ambiguous writes or throttles (drops %d)", drops)
	}
}
