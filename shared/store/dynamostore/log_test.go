package dynamostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// logEnv is one test's table, client, store and tenant context.
type logEnv struct {
	t      *testing.T
	ctx    context.Context
	client *dynamodb.Client
	table  string
	store  *dynamostore.Store
	log    contract.EventLog
	ctr    *dynamotest.Counter
}

// newLogEnv makes a fresh table and a store over a counted client.
func newLogEnv(t *testing.T, opts ...func(*dynamodb.Options)) *logEnv {
	t.Helper()
	return newLogEnvAt(t, dynamotest.Endpoint(t), opts...)
}

// newLogEnvAt is newLogEnv through endpoint (e.g. a fault proxy).
func newLogEnvAt(t *testing.T, endpoint string, opts ...func(*dynamodb.Options)) *logEnv {
	t.Helper()
	ctr := dynamotest.NewCounter()
	client := dynamotest.NewClient(endpoint, append([]func(*dynamodb.Options){ctr.Attach}, opts...)...)
	table := dynamotest.FreshTable(t, client)
	st := dynamostore.New(dynamostore.Config{Client: client, Table: table})
	return &logEnv{t: t, ctx: contract.WithTenant(t.Context(), "acme"), client: client, table: table,
		store: st, log: st.Log(), ctr: ctr}
}

// rawItem is a log item as stored, read without the store's code.
type rawItem struct {
	first              int64
	kind               string
	epoch, prev, count int64
	src                int64
	gcAt               int64
}

func (r rawItem) owner() int64 {
	if r.kind == "cancel" || r.kind == "watch" { // markers name the epoch before them
		return r.prev
	}
	return r.epoch
}

// raw reads every stored item of a run's log, in offset order.
func (e *logEnv) raw(tenant, runID string) []rawItem {
	e.t.Helper()
	var out []rawItem
	var start map[string]types.AttributeValue
	for {
		q, err := e.client.Query(context.Background(), &dynamodb.QueryInput{
			TableName:                 aws.String(e.table),
			KeyConditionExpression:    aws.String("pk = :pk"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: tenant + "#LOG#" + runID}},
			ConsistentRead:            aws.Bool(true),
			ExclusiveStartKey:         start,
		})
		if err != nil {
			e.t.Fatalf("raw query: %v", err)
		}
		for _, it := range q.Items {
			n := func(name string) int64 {
				v, ok := it[name].(*types.AttributeValueMemberN)
				if !ok {
					return 0
				}
				i, _ := strconv.ParseInt(v.Value, 10, 64)
				return i
			}
			sk := it["sk"].(*types.AttributeValueMemberS).Value
			first, _ := strconv.ParseInt(sk, 10, 64)
			out = append(out, rawItem{first: first, kind: it["kind"].(*types.AttributeValueMemberS).Value,
				epoch: n("epoch"), prev: n("prevEpoch"), count: n("count"), src: n("src"), gcAt: n("gcAt")})
		}
		if start = q.LastEvaluatedKey; len(start) == 0 {
			return out
		}
	}
}

// kinds renders raw items compactly, e.g. "events@1e1 fence@3e2".
func kinds(items []rawItem) string {
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s@%de%d", it.kind, it.first, it.owner())
	}
	return b.String()
}

// evs returns n events whose data is {"i":from+k} and Src = 10*(from+k).
func evs(from, n int) []contract.Event {
	out := make([]contract.Event, n)
	for k := range n {
		out[k] = contract.Event{Src: int64(10 * (from + k)), Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, from+k))}
	}
	return out
}

// readAll follows next from 0 until a read returns nothing new; it returns the events and
// whether a close was reached.
func readAll(t *testing.T, ctx context.Context, lg contract.EventLog, runID string, limit int) ([]contract.Event, bool) {
	t.Helper()
	var all []contract.Event
	after := int64(0)
	for range 10_000 {
		got, next, closed, err := lg.Read(ctx, runID, after, limit)
		if err != nil {
			t.Fatalf("read after %d: %v", after, err)
		}
		all = append(all, got...)
		if closed || next == after {
			return all, closed
		}
		after = next
	}
	t.Fatal("read did not reach the tail in 10000 reads")
	return nil, false
}

func mustAppend(t *testing.T, ctx context.Context, lg contract.EventLog, runID string, at contract.Cursor, events []contract.Event) contract.AppendResult {
	t.Helper()
	res, err := lg.Append(ctx, runID, at, events)
	if err != nil {
		t.Fatalf("append at %+v: %v", at, err)
	}
	return res
}

func wantErr(t *testing.T, err, want error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
}

// TestLogOrder: offsets are assigned contiguously from 1 and a read returns every event in
// order with its Src; items get gcAt.
func TestLogOrder(t *testing.T) {
	e := newLogEnv(t)
	c := contract.Cursor{Epoch: 1, Next: 1}
	for i := range 4 {
		res := mustAppend(t, e.ctx, e.log, "r", c, evs(3*i, 3))
		if res.Last != int64(3*i+3) || res.Cursor.Next != res.Last+1 || res.Src != int64(10*(3*i+2)) {
			t.Fatalf("append %d: %+v", i, res)
		}
		c = res.Cursor
	}
	got, closed := readAll(t, e.ctx, e.log, "r", 5)
	if closed || len(got) != 12 {
		t.Fatalf("read %d events closed=%v", len(got), closed)
	}
	for i, ev := range got {
		want := fmt.Sprintf(`{"i":%d}`, i)
		if ev.Offset != int64(i+1) || ev.Src != int64(10*i) || string(ev.Data) != want {
			t.Fatalf("event %d = %+v %s, want offset %d src %d %s", i, ev, ev.Data, i+1, 10*i, want)
		}
	}
	for _, it := range e.raw("acme", "r") {
		if it.gcAt <= 0 {
			t.Fatalf("item %d has no gcAt", it.first)
		}
	}
}

// TestLogSuperseded: after a higher epoch fences or appends, the lower epoch's Append,
// Fence and Close are refused and nothing of it is stored after the higher epoch.
func TestLogSuperseded(t *testing.T) {
	e := newLogEnv(t)
	c1 := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2)).Cursor
	f2, err := e.log.Fence(e.ctx, "r", 2)
	if err != nil || f2.Last != 3 || f2.Cursor != (contract.Cursor{Epoch: 2, Next: 4, Src: 10}) {
		t.Fatalf("fence 2: %+v %v", f2, err)
	}
	_, err = e.log.Append(e.ctx, "r", c1, evs(2, 1))
	wantErr(t, err, contract.ErrSuperseded, "epoch 1 append after fence 2")
	_, err = e.log.Fence(e.ctx, "r", 1)
	wantErr(t, err, contract.ErrSuperseded, "fence 1 after fence 2")

	c2 := mustAppend(t, e.ctx, e.log, "r", f2.Cursor, evs(2, 2)).Cursor
	// A higher epoch's append (no fence of its own) supersedes epoch 2 at epoch 2's slot.
	c3 := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 3, Next: c2.Next, Src: c2.Src}, evs(4, 1)).Cursor
	_, err = e.log.Append(e.ctx, "r", c2, evs(9, 1))
	wantErr(t, err, contract.ErrSuperseded, "epoch 2 append after epoch 3 appended")
	_, err = e.log.Fence(e.ctx, "r", 2)
	wantErr(t, err, contract.ErrSuperseded, "fence 2 after epoch 3 appended")
	wantErr(t, e.log.Close(e.ctx, "r", c2), contract.ErrSuperseded, "close by epoch 2")

	if got := kinds(e.raw("acme", "r")); got != "events@1e1 fence@3e2 events@4e2 events@6e3" {
		t.Fatalf("chain %s", got)
	}
	if c3.Next != 7 {
		t.Fatalf("epoch 3 cursor %+v", c3)
	}
}

// TestLogConflictingBatch: another batch at a cursor already used by the same epoch is
// ErrConflict and stores nothing; the same batch again is success.
func TestLogConflictingBatch(t *testing.T) {
	e := newLogEnv(t)
	at := contract.Cursor{Epoch: 1, Next: 1}
	first := mustAppend(t, e.ctx, e.log, "r", at, evs(0, 2))
	_, err := e.log.Append(e.ctx, "r", at, evs(5, 2))
	wantErr(t, err, contract.ErrConflict, "other batch at a used cursor")
	again := mustAppend(t, e.ctx, e.log, "r", at, evs(0, 2))
	if again != first {
		t.Fatalf("retry of the same batch: %+v, first %+v", again, first)
	}
	if got := kinds(e.raw("acme", "r")); got != "events@1e1" {
		t.Fatalf("chain %s", got)
	}
}

// TestLogCancelInBand: a cancel marker is seen by the owner's next Append (which steps
// past it) and by a Fence that lands after it (also when that fence is retried); readers
// skip it; a second marker at the tail is not stored.
func TestLogCancelInBand(t *testing.T) {
	e := newLogEnv(t)
	c := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2)).Cursor
	if err := e.log.MarkCancel(e.ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if err := e.log.MarkCancel(e.ctx, "r"); err != nil {
		t.Fatal(err)
	}
	res := mustAppend(t, e.ctx, e.log, "r", c, evs(2, 1))
	if !res.CancelRequested || res.Last != 4 {
		t.Fatalf("append after the marker: %+v", res)
	}
	if err := e.log.MarkCancel(e.ctx, "r"); err != nil {
		t.Fatal(err)
	}
	f, err := e.log.Fence(e.ctx, "r", 2)
	if err != nil || !f.CancelRequested || f.Last != 6 || f.Src != 20 {
		t.Fatalf("fence after a marker: %+v %v", f, err)
	}
	f2, err := e.log.Fence(e.ctx, "r", 2)
	if err != nil || f2 != f {
		t.Fatalf("retried fence: %+v %v, first %+v", f2, err, f)
	}
	items := e.raw("acme", "r")
	if got := kinds(items); got != "events@1e1 cancel@3e1 events@4e1 cancel@5e1 fence@6e2" {
		t.Fatalf("chain %s", got)
	}
	if items[1].src != 10 || items[3].src != 20 {
		t.Fatalf("markers do not carry the highest src: %+v", items)
	}
	got, _ := readAll(t, e.ctx, e.log, "r", 100)
	if len(got) != 3 || got[2].Offset != 4 {
		t.Fatalf("read %+v", got)
	}
}

// TestLogClose: after Close nothing is appended, fenced or marked; a read reports closed
// after the last events; a retried close and a stale cursor of the same epoch still close.
func TestLogClose(t *testing.T) {
	e := newLogEnv(t)
	c0 := contract.Cursor{Epoch: 1, Next: 1}
	c := mustAppend(t, e.ctx, e.log, "r", c0, evs(0, 3)).Cursor
	// A stale cursor of the owner steps past the owner's own items.
	if err := e.log.Close(e.ctx, "r", c0); err != nil {
		t.Fatal(err)
	}
	if err := e.log.Close(e.ctx, "r", c); err != nil {
		t.Fatalf("retried close: %v", err)
	}
	_, err := e.log.Append(e.ctx, "r", c, evs(3, 1))
	wantErr(t, err, contract.ErrLogClosed, "append after close")
	_, err = e.log.Fence(e.ctx, "r", 2)
	wantErr(t, err, contract.ErrLogClosed, "fence after close")
	wantErr(t, e.log.MarkCancel(e.ctx, "r"), contract.ErrLogClosed, "cancel after close")

	got, next, closed, err := e.log.Read(e.ctx, "r", 0, 100)
	if err != nil || len(got) != 3 || !closed || next != 3 {
		t.Fatalf("read: %d events next %d closed %v err %v", len(got), next, closed, err)
	}
	got, next, closed, err = e.log.Read(e.ctx, "r", next, 100)
	if err != nil || len(got) != 0 || !closed || next != 3 {
		t.Fatalf("read from next: %d events next %d closed %v err %v", len(got), next, closed, err)
	}
	if k := kinds(e.raw("acme", "r")); k != "events@1e1 close@4e1" {
		t.Fatalf("chain %s", k)
	}
}

// TestLogSupersededCloseChangesNothing: a close by a superseded epoch writes nothing and
// the successor keeps appending to an open log.
func TestLogSupersededCloseChangesNothing(t *testing.T) {
	e := newLogEnv(t)
	c1 := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 1)).Cursor
	f, err := e.log.Fence(e.ctx, "r", 2)
	if err != nil {
		t.Fatal(err)
	}
	before := kinds(e.raw("acme", "r"))
	wantErr(t, e.log.Close(e.ctx, "r", c1), contract.ErrSuperseded, "close by epoch 1")
	if after := kinds(e.raw("acme", "r")); after != before {
		t.Fatalf("superseded close changed the chain: %s -> %s", before, after)
	}
	mustAppend(t, e.ctx, e.log, "r", f.Cursor, evs(1, 1))
	if got, closed := readAll(t, e.ctx, e.log, "r", 10); closed || len(got) != 2 {
		t.Fatalf("read %d events closed %v", len(got), closed)
	}
}

// TestLogLargeBatchSplit: a 1 MB batch is split into items within the limits, read back
// intact, and a retry of the whole batch stores nothing more.
func TestLogLargeBatchSplit(t *testing.T) {
	e := newLogEnv(t)
	big := strings.Repeat("x", 200<<10)
	var batch []contract.Event
	for i := range 5 {
		batch = append(batch, contract.Event{Src: int64(i + 1), Data: json.RawMessage(fmt.Sprintf(`"%d%s"`, i, big))})
	}
	at := contract.Cursor{Epoch: 1, Next: 1}
	e.ctr.Reset()
	res := mustAppend(t, e.ctx, e.log, "r", at, batch)
	chunks := len(contract.SplitEvents(batch))
	if res.Last != 5 || res.Src != 5 || chunks < 3 || e.ctr.Calls("PutItem") != chunks {
		t.Fatalf("append: %+v, %d chunks, %d puts", res, chunks, e.ctr.Calls("PutItem"))
	}
	again := mustAppend(t, e.ctx, e.log, "r", at, batch)
	if again != res || len(e.raw("acme", "r")) != chunks {
		t.Fatalf("retry of the split batch: %+v, chain %s", again, kinds(e.raw("acme", "r")))
	}
	got, _ := readAll(t, e.ctx, e.log, "r", 1)
	if len(got) != 5 {
		t.Fatalf("read back %d events", len(got))
	}
	for i, ev := range got {
		if ev.Offset != int64(i+1) || ev.Src != int64(i+1) || string(ev.Data) != string(batch[i].Data) {
			t.Fatalf("event %d differs (offset %d src %d, %d bytes)", i, ev.Offset, ev.Src, len(ev.Data))
		}
	}
	huge := []contract.Event{{Data: json.RawMessage(`"` + strings.Repeat("y", 256<<10) + `"`)}}
	_, err := e.log.Append(e.ctx, "r", res.Cursor, huge)
	wantErr(t, err, contract.ErrInvalid, "event over 256 KiB")
}

// TestLogSrc: Src is kept per event; the highest Src is carried by every item (markers
// too) and returned by Fence, even when a later batch has lower Src values.
func TestLogSrc(t *testing.T) {
	e := newLogEnv(t)
	res := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1},
		[]contract.Event{{Src: 7, Data: json.RawMessage(`1`)}, {Src: 42, Data: json.RawMessage(`2`)}})
	res = mustAppend(t, e.ctx, e.log, "r", res.Cursor, []contract.Event{{Data: json.RawMessage(`3`)}})
	if res.Src != 42 || res.Cursor.Src != 42 {
		t.Fatalf("append result %+v", res)
	}
	if err := e.log.MarkCancel(e.ctx, "r"); err != nil {
		t.Fatal(err)
	}
	f, err := e.log.Fence(e.ctx, "r", 2)
	if err != nil || f.Src != 42 || f.Cursor.Src != 42 {
		t.Fatalf("fence: %+v %v", f, err)
	}
	got, _ := readAll(t, e.ctx, e.log, "r", 10)
	if len(got) != 3 || got[0].Src != 7 || got[1].Src != 42 || got[2].Src != 0 {
		t.Fatalf("read %+v", got)
	}
}

// TestLogReadWholeItemsAndMidItem: a read returns whole items (the first even beyond the
// limit), next lies on an item boundary, and an after inside an item yields the rest of it.
func TestLogReadWholeItemsAndMidItem(t *testing.T) {
	e := newLogEnv(t)
	c := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 5)).Cursor
	mustAppend(t, e.ctx, e.log, "r", c, evs(5, 2))
	got, next, _, err := e.log.Read(e.ctx, "r", 0, 2)
	if err != nil || len(got) != 5 || next != 5 {
		t.Fatalf("read limit 2: %d events next %d err %v", len(got), next, err)
	}
	got, next, _, err = e.log.Read(e.ctx, "r", 0, 7)
	if err != nil || len(got) != 7 || next != 7 {
		t.Fatalf("read limit 7: %d events next %d err %v", len(got), next, err)
	}
	// after=3 lies inside the item 1..5 (one more backward query); after=6 is where the
	// item 6..7 begins (found by the one query).
	for after, calls := range map[int64]int{3: 2, 6: 1} {
		e.ctr.Reset()
		got, next, _, err = e.log.Read(e.ctx, "r", after, 100)
		if err != nil || len(got) != int(7-after) || got[0].Offset != after+1 || next != 7 {
			t.Fatalf("read after %d: %+v next %d err %v", after, got, next, err)
		}
		if n := e.ctr.Total(); n != calls {
			t.Fatalf("read after %d: %d calls, want %d", after, n, calls)
		}
	}
	got, next, closed, err := e.log.Read(e.ctx, "r", 7, 100)
	if err != nil || len(got) != 0 || next != 7 || closed {
		t.Fatalf("read at the tail: %+v next %d closed %v err %v", got, next, closed, err)
	}
}

// TestLogTenantsAndInput: the same run id under two tenants is two logs; malformed input
// is ErrInvalid.
func TestLogTenantsAndInput(t *testing.T) {
	e := newLogEnv(t)
	other := contract.WithTenant(t.Context(), "other")
	mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2))
	res := mustAppend(t, other, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(10, 1))
	if res.Last != 1 {
		t.Fatalf("other tenant's log is not separate: %+v", res)
	}
	if got, _ := readAll(t, other, e.log, "r", 10); len(got) != 1 || string(got[0].Data) != `{"i":10}` {
		t.Fatalf("other tenant reads %+v", got)
	}
	bad := contract.WithTenant(t.Context(), "a#LOG#b")
	_, err := e.log.Append(bad, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 1))
	wantErr(t, err, contract.ErrInvalid, "forged tenant")
	_, err = e.log.Fence(e.ctx, "", 1)
	wantErr(t, err, contract.ErrInvalid, "empty run id")
	_, err = e.log.Append(e.ctx, "r", contract.Cursor{Epoch: 1, Next: 0}, evs(0, 1))
	wantErr(t, err, contract.ErrInvalid, "cursor next 0")
	_, err = e.log.Append(e.ctx, "r", contract.Cursor{Epoch: 1, Next: 3}, nil)
	wantErr(t, err, contract.ErrInvalid, "empty batch")
	_, err = e.log.Fence(e.ctx, "r", 0)
	wantErr(t, err, contract.ErrInvalid, "fence epoch 0")
}

// TestLogCallBudgets (docs/design.md §11): an append of up to 350 KB is one call; a read from a next is
// one call; Fence and MarkCancel are two (tail query, put); Close is one (finish = the
// fenced terminal write + Close = 2; attach's "tail, fence" = 2; cancel's marker = 2).
func TestLogCallBudgets(t *testing.T) {
	e := newLogEnv(t)
	c := contract.Cursor{Epoch: 1, Next: 1}
	half := json.RawMessage(`"` + strings.Repeat("z", 170_000) + `"`)
	batch := []contract.Event{{Src: 1, Data: half}, {Src: 2, Data: half}}
	if len(contract.SplitEvents(batch)) != 1 {
		t.Fatal("the 340 KB batch does not fit one item")
	}
	e.ctr.Reset()
	c = mustAppend(t, e.ctx, e.log, "r", c, batch).Cursor
	if n := e.ctr.Total(); n != 1 {
		t.Fatalf("append of 340 KB: %d calls %v", n, e.ctr.Snapshot())
	}
	for i := range 4 {
		e.ctr.Reset()
		c = mustAppend(t, e.ctx, e.log, "r", c, evs(i, 2)).Cursor
		if n := e.ctr.Total(); n != 1 {
			t.Fatalf("append: %d calls %v", n, e.ctr.Snapshot())
		}
	}
	budget := func(what string, want int, fn func() error) {
		t.Helper()
		e.ctr.Reset()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := e.ctr.Total(); n != want {
			t.Fatalf("%s: %d calls %v, want %d", what, n, e.ctr.Snapshot(), want)
		}
	}
	budget("mark cancel", 2, func() error { return e.log.MarkCancel(e.ctx, "f") })
	var f contract.AppendResult
	budget("fence", 2, func() (err error) { f, err = e.log.Fence(e.ctx, "f", 2); return err })
	budget("close", 1, func() error { return e.log.Close(e.ctx, "f", f.Cursor) })

	_, next, _, err := e.log.Read(e.ctx, "r", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for next < c.Next-1 {
		e.ctr.Reset()
		got, n2, _, err := e.log.Read(e.ctx, "r", next, 2)
		if err != nil || len(got) == 0 {
			t.Fatalf("read from %d: %d events %v", next, len(got), err)
		}
		if n := e.ctr.Total(); n != 1 {
			t.Fatalf("read from next %d: %d calls %v", next, n, e.ctr.Snapshot())
		}
		next = n2
	}
}

// TestLogReaderClosesTerminalRun: a read reaching the tail of a running run's log leaves it
// open; once the run is terminal, a read that finds nothing new closes it under the run's
// epoch, after which the owner's Append is ErrLogClosed, its Close is success, and a
// superseded writer's Close is ErrSuperseded.
func TestLogReaderClosesTerminalRun(t *testing.T) {
	e := newLogEnv(t)
	e.putRun("r", contract.StatusRunning, 1)
	c := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2)).Cursor
	e.ctr.Reset()
	if got, next, closed, err := e.log.Read(e.ctx, "r", 2, 10); err != nil || closed || len(got) != 0 || next != 2 {
		t.Fatalf("read at the tail of a running run: %d events next %d closed %v err %v", len(got), next, closed, err)
	}
	// After a multi-event item the tail read must look back for the item holding after
	// (a resume from an event offset may lie inside it): Query, Query, the run's GetItem.
	if n := e.ctr.Total(); n != 3 {
		t.Fatalf("an empty read after a 2-event tail item: %d calls %v, want 3", n, e.ctr.Snapshot())
	}
	mustAppend(t, e.ctx, e.log, "r", c, evs(2, 1))
	e.ctr.Reset()
	if got, next, closed, err := e.log.Read(e.ctx, "r", 3, 10); err != nil || closed || len(got) != 0 || next != 3 {
		t.Fatalf("read at a single-event tail: %d events next %d closed %v err %v", len(got), next, closed, err)
	}
	// A tail item beginning at after proves after is its end: Query and the run's GetItem.
	if n := e.ctr.Total(); n != 2 {
		t.Fatalf("an empty read after a 1-event tail item: %d calls %v, want 2", n, e.ctr.Snapshot())
	}

	e.putRun("t", contract.StatusCompleted, 1)
	mustAppend(t, e.ctx, e.log, "t", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2))
	got, closed := readAll(t, e.ctx, e.log, "t", 10)
	if !closed || len(got) != 2 {
		t.Fatalf("terminal run read: %d events closed %v", len(got), closed)
	}
	_, err := e.log.Append(e.ctx, "t", c, evs(2, 1))
	wantErr(t, err, contract.ErrLogClosed, "append after the reader's close")
	if err := e.log.Close(e.ctx, "t", c); err != nil {
		t.Fatalf("the owner's close after the reader's: %v", err)
	}
	if k := kinds(e.raw("acme", "t")); k != "events@1e1 close@3e1" {
		t.Fatalf("chain %s", k)
	}

	// A run finished by epoch 3 whose log epoch 1 wrote last: the reader closes under 3.
	e.putRun("u", contract.StatusFailed, 3)
	cu := mustAppend(t, e.ctx, e.log, "u", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 1)).Cursor
	if _, _, closed, err := e.log.Read(e.ctx, "u", 1, 10); err != nil || !closed {
		t.Fatalf("read of u: closed %v err %v", closed, err)
	}
	wantErr(t, e.log.Close(e.ctx, "u", cu), contract.ErrSuperseded, "epoch 1's close after the reader closed under 3")
	if k := kinds(e.raw("acme", "u")); k != "events@1e1 close@2e3" {
		t.Fatalf("chain %s", k)
	}
}

// TestLogGCAt: every log item carries gcAt = now + LogRetention in epoch seconds (the
// DynamoDB TTL unit), markers included.
func TestLogGCAt(t *testing.T) {
	e := newLogEnv(t)
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	lg := dynamostore.New(dynamostore.Config{Client: e.client, Table: e.table, LogRetention: 48 * time.Hour,
		Now: func() time.Time { return now }}).Log()
	c := mustAppend(t, e.ctx, lg, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2)).Cursor
	if err := lg.MarkCancel(e.ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if err := lg.Close(e.ctx, "r", c); err != nil {
		t.Fatal(err)
	}
	items := e.raw("acme", "r")
	want := now.Add(48 * time.Hour).Unix()
	for _, it := range items {
		if it.gcAt != want {
			t.Fatalf("%s@%d gcAt %d, want %d", it.kind, it.first, it.gcAt, want)
		}
	}
	if len(items) != 3 {
		t.Fatalf("chain %s", kinds(items))
	}
}

// TestLogReaderCloseAfterLateWrite: a write landing between a reader's page and its close
// of a terminal run's log is never hidden: the close goes after it, this read reports not
// closed, and the next read returns the late event together with closed.
func TestLogReaderCloseAfterLateWrite(t *testing.T) {
	e := newLogEnv(t)
	e.putRun("r", contract.StatusCompleted, 1)
	c := mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 2)).Cursor
	hits := 0
	// The reader reads the run (terminal) between its page and its close: the late write
	// lands right after that read, at the reader's client.
	late := afterGetItem{Client: e.client, pk: "acme#RUN#r", hook: func() {
		if hits++; hits == 1 {
			mustAppend(t, e.ctx, e.log, "r", c, evs(2, 1))
		}
	}}
	lg := dynamostore.New(dynamostore.Config{Client: late, Table: e.table}).Log()
	got, next, closed, err := lg.Read(e.ctx, "r", 2, 10)
	if err != nil || closed || len(got) != 0 || next != 2 || hits != 1 {
		t.Fatalf("read racing a late write: %d events next %d closed %v err %v hook %d", len(got), next, closed, err, hits)
	}
	got, next, closed, err = lg.Read(e.ctx, "r", next, 10)
	if err != nil || !closed || len(got) != 1 || string(got[0].Data) != `{"i":2}` || next != 3 {
		t.Fatalf("next read: %+v next %d closed %v err %v", got, next, closed, err)
	}
	if k := kinds(e.raw("acme", "r")); k != "events@1e1 events@3e1 close@4e1" {
		t.Fatalf("chain %s", k)
	}
}

// TestLogDataRoundTripsVerbatim: event data is stored as bytes, so JSON holding invalid
// UTF-8 or odd spacing reads back byte for byte.
func TestLogDataRoundTripsVerbatim(t *testing.T) {
	e := newLogEnv(t)
	data := []json.RawMessage{json.RawMessage("\"\xff\xfe\""), json.RawMessage(` { "a" : [1, 2.50] } `), json.RawMessage(`"\u0000"`)}
	var batch []contract.Event
	for _, d := range data {
		if !json.Valid(d) {
			t.Fatalf("test data %q is not JSON", d)
		}
		batch = append(batch, contract.Event{Data: d})
	}
	mustAppend(t, e.ctx, e.log, "r", contract.Cursor{Epoch: 1, Next: 1}, batch)
	got, _ := readAll(t, e.ctx, e.log, "r", 10)
	if len(got) != len(data) {
		t.Fatalf("read %d events", len(got))
	}
	for i := range data {
		if string(got[i].Data) != string(data[i]) {
			t.Fatalf("event %d: %q, want %q", i, got[i].Data, data[i])
		}
	}
}

// afterGetItem is a client calling hook after each read of the item whose pk is pk.
type afterGetItem struct {
	dynamostore.Client
	pk   string
	hook func()
}

func (c afterGetItem) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	out, err := c.Client.GetItem(ctx, in, opts...)
	if pk, ok := in.Key["pk"].(*types.AttributeValueMemberS); ok && pk.Value == c.pk {
		c.hook()
	}
	return out, err
}
