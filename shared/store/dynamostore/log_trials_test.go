package dynamostore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestLogRandomizedTrialsWithLostResponses replays, many times, the situation the three
// rules of docs/design.md §3.1 exist for: concurrent writers of epochs 1–3 on separate clients (replicas),
// a canceller and a finishing close, while the proxy applies-then-drops a fifth of all puts
// so the SDK retries writes that already landed. After each trial the stored chain must be
// ordered by epoch with nothing after a close, every acknowledged event must read back
// exactly once, nothing unattempted may appear, and the only refusals are ErrSuperseded and
// ErrLogClosed.
func TestLogRandomizedTrialsWithLostResponses(t *testing.T) {
	const trials = 30
	e, p := newProxiedEnv(t)
	p.Seed(2024)
	p.Inject(dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Op: "PutItem", Probability: 0.2})
	logs := make([]contract.EventLog, 4)
	ctrs := make([]*dynamotest.Counter, 4)
	for i := range logs {
		ctrs[i] = dynamotest.NewCounter()
		client := dynamotest.NewClient(p.URL(), ctrs[i].Attach, dynamotest.FastRetries(12))
		logs[i] = dynamostore.New(dynamostore.Config{Client: client, Table: e.table}).Log()
	}

	var closes, refusals, cancelsSeen int
	for trial := range trials {
		runID := fmt.Sprintf("trial-%d", trial)
		var mu sync.Mutex
		attempted, acked := map[string]bool{}, map[string]bool{}
		refused := func(err error) bool {
			if errors.Is(err, contract.ErrSuperseded) || errors.Is(err, contract.ErrLogClosed) {
				mu.Lock()
				refusals++
				mu.Unlock()
				return true
			}
			return false
		}
		var errs []error
		fail := func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		// write appends n tagged events one by one from c until refused; it returns the
		// cursor after the last acknowledged append and whether it was refused.
		write := func(lg contract.EventLog, c contract.Cursor, n int) (contract.Cursor, bool) {
			for i := range n {
				d := fmt.Sprintf(`{"w":%d,"i":%d}`, c.Epoch, i)
				mu.Lock()
				attempted[d] = true
				mu.Unlock()
				res, err := lg.Append(e.ctx, runID, c, []contract.Event{{Src: int64(100*c.Epoch + int64(i)), Data: json.RawMessage(d)}})
				if refused(err) {
					return c, true
				}
				if err != nil {
					fail(fmt.Errorf("epoch %d append %d: %w", c.Epoch, i, err))
					return c, true
				}
				mu.Lock()
				acked[d] = true
				cancelsSeen += map[bool]int{true: 1}[res.CancelRequested]
				mu.Unlock()
				c = res.Cursor
			}
			return c, false
		}
		fenceAndWrite := func(lg contract.EventLog, epoch int64, n int, closeAfter bool) {
			f, err := lg.Fence(e.ctx, runID, epoch)
			if refused(err) {
				return
			}
			if err != nil {
				fail(fmt.Errorf("fence %d: %w", epoch, err))
				return
			}
			c, stopped := write(lg, f.Cursor, n)
			if stopped || !closeAfter {
				return
			}
			err = lg.Close(e.ctx, runID, c)
			if err == nil {
				mu.Lock()
				closes++
				mu.Unlock()
				return
			}
			if !errors.Is(err, contract.ErrSuperseded) {
				fail(fmt.Errorf("close %d: %w", epoch, err))
			}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { <-start; write(logs[0], contract.Cursor{Epoch: 1, Next: 1}, 25) })
		wg.Go(func() { <-start; fenceAndWrite(logs[1], 2, 6+trial%5, true) })
		wg.Go(func() {
			<-start
			if trial%3 != 0 {
				fenceAndWrite(logs[2], 3, 3, trial%2 == 0)
			}
		})
		wg.Go(func() {
			<-start
			if err := logs[3].MarkCancel(e.ctx, runID); err != nil && !errors.Is(err, contract.ErrLogClosed) {
				fail(fmt.Errorf("cancel: %w", err))
			}
		})
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("trial %d: %v", trial, errors.Join(errs...))
		}

		items := e.raw("acme", runID)
		if err := ordered(items); err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		for i, it := range items {
			if it.kind == "close" && i != len(items)-1 {
				t.Fatalf("trial %d: items after a close: %s", trial, kinds(items))
			}
		}
		got, _ := readAll(t, e.ctx, e.log, runID, 100)
		seen := map[string]int{}
		lastEpoch := int64(0)
		for _, ev := range got {
			d := string(ev.Data)
			seen[d]++
			if !attempted[d] {
				t.Fatalf("trial %d: read %s, never appended", trial, d)
			}
			var tag struct{ W int64 }
			_ = json.Unmarshal(ev.Data, &tag)
			if tag.W < lastEpoch {
				t.Fatalf("trial %d: event %s after epoch %d's events", trial, d, lastEpoch)
			}
			lastEpoch = tag.W
		}
		for d := range acked {
			if seen[d] != 1 {
				t.Fatalf("trial %d: acknowledged %s read %d times", trial, d, seen[d])
			}
		}
		for d, n := range seen {
			if n != 1 {
				t.Fatalf("trial %d: %s read %d times", trial, d, n)
			}
		}
	}
	own := 0
	for _, c := range ctrs {
		own += c.ConditionFailures("PutItem")
	}
	drops := p.Injected(dynamotest.ApplyThenDrop)
	t.Logf("%d trials: %d lost responses, %d puts meeting an occupied slot, %d refusals, %d closes, %d appends saw a cancel",
		trials, drops, own, refusals, closes, cancelsSeen)
	if drops == 0 || own == 0 || refusals == 0 || closes == 0 {
		t.Fatal("the trials did not exercise lost responses, collisions, refusals and closes")
	}
}
