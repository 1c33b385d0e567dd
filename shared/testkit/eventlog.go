package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// evCases lists the event-log cases in the order they run.
func evCases() []lkCase {
	return []lkCase{
		{"OrderAndOffsets", Options{}, evOrder},
		{"SupersededAfterHigherFence", Options{}, evSupersededAfterFence},
		{"SupersededAfterHigherAppend", Options{}, evSupersededAfterAppend},
		{"AmbiguousRetryStoresOnce", Options{}, evAmbiguousRetry},
		{"AmbiguousRetryOfSplitBatchStoresOnce", Options{}, evAmbiguousRetrySplit},
		{"ConflictingBatchAtSameCursor", Options{}, evConflict},
		{"CancelMarkerSeenInBand", Options{}, evCancelInBand},
		{"CancelMarkerOnEmptyLog", Options{}, evCancelEmptyLog},
		{"CancelMarkerSeenByFence", Options{}, evCancelSeenByFence},
		{"SupersededSeenThroughCancelMarker", Options{}, evSupersededThroughCancel},
		{"WatchMarkerOccupiesOneOffset", Options{}, evWatchOneOffset},
		{"WatchMarkerOnEmptyLog", Options{}, evWatchEmptyLog},
		{"WatchMarkerKeepsPendingCancel", Options{}, evWatchKeepsCancel},
		{"SupersededSeenThroughWatchMarker", Options{}, evSupersededThroughWatch},
		{"CloseStepsPastWatchMarker", Options{}, evCloseStepsPast(evMarkWatch)},
		{"WatchMarkerOnClosedLogRefused", Options{}, evWatchClosed},
		{"CloseThenAppend", Options{}, evCloseThenAppend},
		{"CloseStepsPastCancelMarker", Options{}, evCloseStepsPast(evMarkCancel)},
		{"SupersededCloseChangesNothing", Options{}, evSupersededClose},
		{"StaleCursorOfOwnerStillCloses", Options{}, evStaleCursorCloses},
		{"LargeBatchSplitAndReadIntact", Options{}, evLargeBatch},
		{"ReadPageBoundedInBytes", Options{}, evPageBytes},
		{"InvalidBatchRefused", Options{}, evInvalidBatch},
		{"SrcKeptAndHighestReturned", Options{}, evSrc},
		{"ReadReturnsWholeItems", Options{}, evWholeItems},
		{"ReaderClosesTerminalRun", Options{}, evReaderClosesTerminal},
		{"TenantsIsolated", Options{}, evTenantsIsolated},
		{"RaceFenceAgainstAppender", Options{}, evRaceFence},
		{"RaceSameCursor", Options{}, evRaceSameCursor},
		{"RaceCancelAgainstAppender", Options{}, evRaceCancel},
		{"RaceWatchAgainstAppender", Options{}, evRaceWatch},
		{"RaceCloseAgainstFence", Options{}, evRaceCloseFence},
	}
}

// RunEventLogConformance runs the event-log suite (docs/design.md §2.4, §3.1, §10) against fresh
// backends from nb.
func RunEventLogConformance(t *testing.T, nb NewBackend) {
	for _, c := range evCases() {
		t.Run(c.name, func(t *testing.T) {
			c.run(t, fresh(t, nb, c.opts))
		})
	}
}

// evOverhead mirrors the per-event overhead contract.SplitEvents accounts for an item.
const evOverhead = 64

// evTag is an event's data naming the writer's epoch and its sequence number, so readers
// (who see only events) can check epoch order.
func evTag(epoch int64, i int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, epoch, i))
}

// evParseTag reads back an evTag.
func evParseTag(d json.RawMessage) (epoch int64, i int, ok bool) {
	var v struct {
		W *int64 `json:"w"`
		I *int   `json:"i"`
	}
	if json.Unmarshal(d, &v) != nil || v.W == nil || v.I == nil {
		return 0, 0, false
	}
	return *v.W, *v.I, true
}

// evBatch returns events whose data are the given JSON strings.
func evBatch(data ...string) []contract.Event {
	out := make([]contract.Event, len(data))
	for i, d := range data {
		out[i] = contract.Event{Data: json.RawMessage(fmt.Sprintf("%q", d))}
	}
	return out
}

// evLarge returns n distinct events of exactly size bytes of JSON each.
func evLarge(n, size int) []contract.Event {
	out := make([]contract.Event, n)
	for i := range out {
		head := fmt.Sprintf(`"%03d`, i)
		out[i] = contract.Event{Data: json.RawMessage(head + strings.Repeat("x", size-len(head)-1) + `"`)}
	}
	return out
}

// evNewRun creates runID holding epoch 1 and returns the first producer's cursor.
func evNewRun(t lkT, b contract.Backend, ctx context.Context, runID string) contract.Cursor {
	t.Helper()
	now := time.Now().UnixMilli()
	rec, created, err := b.Runs().CreateClaimed(ctx, contract.CreateClaimedRun{
		NewRun:     contract.NewRun{RunID: runID, ThreadID: "thread-" + runID, StartedAt: now},
		SandboxKey: "sk_testkit",
		LeaseUntil: now + contract.DefaultDriverLease,
		Token:      "create-" + runID,
	})
	if err != nil || !created || rec.Epoch() != 1 {
		t.Fatalf("CreateClaimed(%s) = epoch %d, created %v, %v; want a new run at epoch 1", runID, rec.Epoch(), created, err)
	}
	return contract.Cursor{Epoch: 1, Next: 1}
}

// evTakeOver claims the next epoch of runID and fences its log, as a taking-over driver does.
func evTakeOver(t lkT, b contract.Backend, ctx context.Context, runID string) (int64, contract.AppendResult) {
	t.Helper()
	st, err := b.Runs().Claim(ctx, runID, contract.Claim{
		Token:      fmt.Sprintf("claim-%s-%d", runID, time.Now().UnixNano()),
		LeaseUntil: time.Now().UnixMilli() + contract.DefaultDriverLease,
	})
	if err != nil {
		t.Fatalf("Claim(%s): %v", runID, err)
	}
	epoch := st.Epoch()
	res, err := b.Log().Fence(ctx, runID, epoch)
	if err != nil {
		t.Fatalf("Fence(%s, %d): %v", runID, epoch, err)
	}
	if res.Cursor.Epoch != epoch || res.Cursor.Next <= res.Last {
		t.Fatalf("Fence(%s, %d) = %+v: want a cursor of epoch %d past the last offset", runID, epoch, res, epoch)
	}
	return epoch, res
}

// evAppend appends and fails the case on error; the result's cursor must keep the epoch
// and lie past the last offset.
func evAppend(t lkT, b contract.Backend, ctx context.Context, runID string, at contract.Cursor, events []contract.Event) contract.AppendResult {
	t.Helper()
	res, err := b.Log().Append(ctx, runID, at, events)
	if err != nil {
		t.Fatalf("Append(%s, %+v, %d events): %v", runID, at, len(events), err)
	}
	if res.Cursor.Epoch != at.Epoch || res.Cursor.Next <= res.Last || res.Last < at.Next {
		t.Fatalf("Append(%s, %+v) = %+v: want a cursor of the same epoch past a last offset >= %d", runID, at, res, at.Next)
	}
	return res
}

// evIs fails the case unless err is target.
func evIs(t lkT, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s = %v, want %v", what, err, target)
	}
}

// evReadAll reads runID from the start with the given limit until nothing more comes,
// checking each page: next never goes back and lies at or past the page's last offset;
// offsets increase strictly across pages. It returns the events, whether the log reported
// closed, and the number of pages that carried events.
func evReadAll(t lkT, b contract.Backend, ctx context.Context, runID string, limit int) (all []contract.Event, closed bool, pages int) {
	t.Helper()
	after := int64(0)
	for range 100_000 {
		evs, next, cl, err := b.Log().Read(ctx, runID, after, limit)
		if err != nil {
			t.Fatalf("Read(%s, after %d, limit %d): %v", runID, after, limit, err)
		}
		if next < after {
			t.Fatalf("Read(%s, after %d) returned next %d, before after", runID, after, next)
		}
		for _, e := range evs {
			if e.Offset <= after || e.Offset > next || len(all) > 0 && e.Offset <= all[len(all)-1].Offset {
				t.Fatalf("Read(%s, after %d) returned offset %d out of order (next %d)", runID, after, e.Offset, next)
			}
			all = append(all, e)
		}
		if len(evs) > 0 {
			pages++
		}
		if cl {
			return all, true, pages
		}
		if len(evs) == 0 && next == after {
			return all, false, pages
		}
		after = next
	}
	t.Fatalf("Read(%s) did not reach the tail in 100000 pages", runID)
	return nil, false, 0
}

// evSameData reports a mismatch between the data read and the data written, in order.
func evSameData(t lkT, got, want []contract.Event, what string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: read %d events, want %d: %s", what, len(got), len(want), evShow(got))
	}
	for i := range got {
		if !evJSONEqual(got[i].Data, want[i].Data) {
			t.Fatalf("%s: event %d data differs: got %s, want %s", what, i, evTrim(got[i].Data), evTrim(want[i].Data))
		}
	}
}

func evJSONEqual(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

func evTrim(d json.RawMessage) string {
	if len(d) > 40 {
		return fmt.Sprintf("%s…(%d bytes)", d[:40], len(d))
	}
	return string(d)
}

func evShow(evs []contract.Event) string {
	parts := make([]string, len(evs))
	for i, e := range evs {
		parts[i] = fmt.Sprintf("%d:%s", e.Offset, evTrim(e.Data))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func evConcat(batches ...[]contract.Event) []contract.Event {
	var out []contract.Event
	for _, b := range batches {
		out = append(out, b...)
	}
	return out
}

// evOrder: offsets are unique and increase from 1; events read back in append order; each
// result's Last is its last event's offset.
func evOrder(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	cur := evNewRun(t, b, ctx, "r1")
	batches := [][]contract.Event{evBatch("a1"), evBatch("a2", "a3"), evBatch("a4", "a5", "a6")}
	var lasts []int64
	for _, batch := range batches {
		res := evAppend(t, b, ctx, "r1", cur, batch)
		if len(lasts) > 0 && res.Last <= lasts[len(lasts)-1] {
			t.Errorf("Last %d did not advance past %d", res.Last, lasts[len(lasts)-1])
		}
		lasts = append(lasts, res.Last)
		cur = res.Cursor
	}
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evConcat(batches...), "read")
	if closed {
		t.Errorf("a log never closed read as closed")
	}
	if got[0].Offset != 1 {
		t.Errorf("first offset = %d, want 1", got[0].Offset)
	}
	for i, idx := range []int{0, 2, 5} { // the last event of each batch
		if got[idx].Offset != lasts[i] {
			t.Errorf("batch %d: Append's Last = %d, but its last event reads at offset %d", i, lasts[i], got[idx].Offset)
		}
	}
}

// evSupersededAfterFence: once epoch 2 fences, epoch 1's Append and Fence are refused;
// a retried Fence of epoch 2 yields a cursor that still appends.
func evSupersededAfterFence(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	r1 := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	epoch, f := evTakeOver(t, b, ctx, "r1")
	if epoch != 2 || f.Last < r1.Last || f.CancelRequested {
		t.Errorf("Fence(2) = %+v (epoch %d), want epoch 2, last >= %d, no cancel", f, epoch, r1.Last)
	}
	_, err := lg.Append(ctx, "r1", r1.Cursor, evBatch("x2"))
	evIs(t, err, contract.ErrSuperseded, "epoch 1 Append after Fence(2)")
	_, err = lg.Fence(ctx, "r1", 1)
	evIs(t, err, contract.ErrSuperseded, "Fence(1) after Fence(2)")
	// epoch 1's ambiguous retry of a batch that landed before the fence: never stored twice.
	if _, err := lg.Append(ctx, "r1", contract.Cursor{Epoch: 1, Next: 1}, evBatch("x1")); err != nil && !errors.Is(err, contract.ErrSuperseded) {
		t.Errorf("epoch 1's retry of its landed batch after Fence(2) = %v, want nil or ErrSuperseded", err)
	}
	retry, err := lg.Fence(ctx, "r1", 2)
	if err != nil || retry.Cursor.Epoch != 2 {
		t.Fatalf("retried Fence(2) = %+v, %v; want epoch 2's cursor", retry, err)
	}
	evAppend(t, b, ctx, "r1", retry.Cursor, evBatch("y1"))
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "y1"), "read after take-over")
}

// evSupersededAfterAppend: after epoch 2 appended, epoch 1's Append, Fence and Close are
// refused, epoch 2 goes on, and epoch 3 in turn supersedes epoch 2.
func evSupersededAfterAppend(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	r1 := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	_, f := evTakeOver(t, b, ctx, "r1")
	g := evAppend(t, b, ctx, "r1", f.Cursor, evBatch("y1", "y2"))
	_, err := lg.Append(ctx, "r1", r1.Cursor, evBatch("x2"))
	evIs(t, err, contract.ErrSuperseded, "epoch 1 Append after epoch 2 appended")
	_, err = lg.Fence(ctx, "r1", 1)
	evIs(t, err, contract.ErrSuperseded, "Fence(1) after epoch 2 appended")
	evIs(t, lg.Close(ctx, "r1", r1.Cursor), contract.ErrSuperseded, "epoch 1 Close after epoch 2 appended")
	g = evAppend(t, b, ctx, "r1", g.Cursor, evBatch("y3"))
	epoch3, _ := evTakeOver(t, b, ctx, "r1")
	_, err = lg.Append(ctx, "r1", g.Cursor, evBatch("y4"))
	evIs(t, err, contract.ErrSuperseded, fmt.Sprintf("epoch 2 Append after Fence(%d)", epoch3))
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "y1", "y2", "y3"), "read")
	if closed {
		t.Errorf("superseded Close closed the log")
	}
}

// evAmbiguousRetry: the same batch at the same cursor twice stores once and both calls
// return the same result.
func evAmbiguousRetry(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c := evNewRun(t, b, ctx, "r1")
	batch := evBatch("a", "b")
	r := evAppend(t, b, ctx, "r1", c, batch)
	r2 := evAppend(t, b, ctx, "r1", c, batch)
	if r2.Cursor != r.Cursor || r2.Last != r.Last {
		t.Errorf("retry returned %+v, first call %+v; want the same cursor and last", r2, r)
	}
	evAppend(t, b, ctx, "r1", r2.Cursor, evBatch("c"))
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("a", "b", "c"), "read after retry")
}

// evAmbiguousRetrySplit: a retried 1 MB batch (several items) stores once.
func evAmbiguousRetrySplit(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c := evNewRun(t, b, ctx, "r1")
	batch := evLarge(8, 128<<10)
	r := evAppend(t, b, ctx, "r1", c, batch)
	r2 := evAppend(t, b, ctx, "r1", c, batch)
	if r2.Cursor != r.Cursor || r2.Last != r.Last {
		t.Errorf("retry returned %+v, first call %+v; want the same cursor and last", r2, r)
	}
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, batch, "read after retry")
}

// evConflict: a different batch at an occupied cursor of the same epoch is ErrConflict
// and stores nothing.
func evConflict(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c := evNewRun(t, b, ctx, "r1")
	r := evAppend(t, b, ctx, "r1", c, evBatch("a"))
	_, err := b.Log().Append(ctx, "r1", c, evBatch("b"))
	evIs(t, err, contract.ErrConflict, "another batch at an occupied cursor")
	_, err = b.Log().Append(ctx, "r1", c, evBatch("a", "extra"))
	evIs(t, err, contract.ErrConflict, "a longer batch at an occupied cursor")
	evAppend(t, b, ctx, "r1", r.Cursor, evBatch("c"))
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("a", "c"), "read")
}

// evCancelInBand: a cancel marker put between two appends is reported by the next Append
// and is never returned to readers.
func evCancelInBand(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	r1 := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	if r1.CancelRequested {
		t.Errorf("Append reported a cancel nobody requested")
	}
	if err := b.Log().MarkCancel(ctx, "r1"); err != nil {
		t.Fatalf("MarkCancel: %v", err)
	}
	r2 := evAppend(t, b, ctx, "r1", r1.Cursor, evBatch("x2"))
	if !r2.CancelRequested {
		t.Errorf("Append after MarkCancel = %+v, want CancelRequested", r2)
	}
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "x2"), "read")
	if got[1].Offset != r2.Last {
		t.Errorf("event after the marker reads at %d, Append reported last %d", got[1].Offset, r2.Last)
	}
}

// evCancelEmptyLog: a marker on an empty log is seen by the first Append.
func evCancelEmptyLog(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c := evNewRun(t, b, ctx, "r1")
	for range 2 { // a repeated cancel is harmless
		if err := b.Log().MarkCancel(ctx, "r1"); err != nil {
			t.Fatalf("MarkCancel: %v", err)
		}
	}
	r := evAppend(t, b, ctx, "r1", c, evBatch("x1"))
	if !r.CancelRequested {
		t.Errorf("first Append after MarkCancel = %+v, want CancelRequested", r)
	}
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1"), "read")
}

// evCancelSeenByFence: a marker at the tail is reported by Fence, which still returns the
// highest Src stored before it.
func evCancelSeenByFence(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c := evNewRun(t, b, ctx, "r1")
	evAppend(t, b, ctx, "r1", c, []contract.Event{{Src: 7, Data: json.RawMessage(`"x1"`)}})
	if err := b.Log().MarkCancel(ctx, "r1"); err != nil {
		t.Fatalf("MarkCancel: %v", err)
	}
	_, f := evTakeOver(t, b, ctx, "r1")
	if !f.CancelRequested || f.Src != 7 || f.Cursor.Src != 7 {
		t.Errorf("Fence after MarkCancel = %+v, want CancelRequested and Src 7", f)
	}
	evAppend(t, b, ctx, "r1", f.Cursor, evBatch("y1"))
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "y1"), "read")
}

// evCloseThenAppend: after Close, Append, MarkCancel and a higher Fence get ErrLogClosed
// and Read reports closed.
func evCloseThenAppend(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	r := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	if err := lg.Close(ctx, "r1", r.Cursor); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err := lg.Append(ctx, "r1", r.Cursor, evBatch("x2"))
	evIs(t, err, contract.ErrLogClosed, "Append after Close")
	evIs(t, lg.MarkCancel(ctx, "r1"), contract.ErrLogClosed, "MarkCancel after Close")
	if err := lg.Close(ctx, "r1", r.Cursor); err != nil && !errors.Is(err, contract.ErrLogClosed) {
		t.Errorf("retried Close = %v, want nil or ErrLogClosed", err)
	}
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1"), "read")
	if !closed {
		t.Errorf("Read of a closed log did not report closed")
	}
	st, err := b.Runs().Claim(ctx, "r1", contract.Claim{Token: "late", LeaseUntil: time.Now().UnixMilli() + contract.DefaultDriverLease})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	_, err = lg.Fence(ctx, "r1", st.Epoch())
	evIs(t, err, contract.ErrLogClosed, "Fence of a closed log")
}

// evSupersededClose: a Close by a superseded epoch is refused and the successor keeps
// appending; the successor's own Close then closes.
func evSupersededClose(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	r1 := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	_, f := evTakeOver(t, b, ctx, "r1")
	evIs(t, lg.Close(ctx, "r1", r1.Cursor), contract.ErrSuperseded, "Close by epoch 1 after Fence(2)")
	g := evAppend(t, b, ctx, "r1", f.Cursor, evBatch("y1"))
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "y1"), "read after the superseded close")
	if closed {
		t.Fatalf("a superseded Close closed the log")
	}
	if err := lg.Close(ctx, "r1", g.Cursor); err != nil {
		t.Fatalf("Close by epoch 2: %v", err)
	}
	if _, closed, _ := evReadAll(t, b, ctx, "r1", 100); !closed {
		t.Errorf("Read after epoch 2's Close did not report closed")
	}
}

// evStaleCursorCloses: Close by the current epoch with an old cursor steps past its own
// epoch's items and closes.
func evStaleCursorCloses(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c0 := evNewRun(t, b, ctx, "r1")
	r1 := evAppend(t, b, ctx, "r1", c0, evBatch("x1"))
	r2 := evAppend(t, b, ctx, "r1", r1.Cursor, evBatch("x2", "x3"))
	if err := b.Log().Close(ctx, "r1", c0); err != nil {
		t.Fatalf("Close with the owner's first cursor: %v", err)
	}
	_, err := b.Log().Append(ctx, "r1", r2.Cursor, evBatch("x4"))
	evIs(t, err, contract.ErrLogClosed, "Append after a stale-cursor Close")
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "x2", "x3"), "read")
	if !closed {
		t.Errorf("Read did not report closed")
	}
	// The first cursor of an empty log closes it too.
	c := evNewRun(t, b, ctx, "r2")
	if err := b.Log().Close(ctx, "r2", c); err != nil {
		t.Fatalf("Close of an empty log: %v", err)
	}
	if got, closed, _ := evReadAll(t, b, ctx, "r2", 100); !closed || len(got) != 0 {
		t.Errorf("empty closed log reads %d events, closed %v; want none, closed", len(got), closed)
	}
}

// evLargeBatch: 8 events of 128 KiB (1 MB) are stored as several items of at most
// MaxItemBytes and read back intact, in order.
func evLargeBatch(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	batch := evLarge(8, 128<<10)
	r := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), batch)
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, batch, "read with limit 100")
	if got[len(got)-1].Offset != r.Last {
		t.Errorf("last event reads at %d, Append reported %d", got[len(got)-1].Offset, r.Last)
	}
	// With limit 1 each read returns exactly one whole item.
	after, items := int64(0), 0
	var sizes []int
	for items < 100 {
		evs, next, _, err := b.Log().Read(ctx, "r1", after, 1)
		if err != nil {
			t.Fatalf("Read(after %d, limit 1): %v", after, err)
		}
		if len(evs) == 0 {
			break
		}
		size := 0
		for _, e := range evs {
			size += len(e.Data) + evOverhead
		}
		if size > contract.MaxItemBytes {
			t.Errorf("one item holds %d events, %d bytes, over MaxItemBytes %d", len(evs), size, contract.MaxItemBytes)
		}
		sizes = append(sizes, len(evs))
		items++
		after = next
	}
	t.Logf("1 MB batch read back as %d items of %v events (SplitEvents: %d items)", items, sizes, len(contract.SplitEvents(batch)))
	if items < 2 {
		t.Errorf("a 1 MB batch was stored as %d item(s), want it split", items)
	}
}

// evPageBytes: 24 events of the largest size (6 MiB) read with limit 1000 come back in
// pages of at most MaxPageBytes (PageBytes), each at least one whole item, and intact.
func evPageBytes(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	all := evLarge(24, contract.MaxEventBytes)
	c := evNewRun(t, b, ctx, "r1")
	for i := range all {
		c = evAppend(t, b, ctx, "r1", c, all[i:i+1]).Cursor
	}
	after, read := int64(0), []contract.Event(nil)
	for len(read) < len(all) {
		evs, next, _, err := b.Log().Read(ctx, "r1", after, 1000)
		if err != nil {
			t.Fatalf("Read(after %d, limit 1000): %v", after, err)
		}
		if len(evs) == 0 {
			t.Fatalf("Read(after %d) is empty with %d of %d events read", after, len(read), len(all))
		}
		if n := contract.PageBytes(evs); len(evs) > 1 && n > contract.MaxPageBytes {
			t.Errorf("a page of %d events counts %d bytes, over MaxPageBytes %d", len(evs), n, contract.MaxPageBytes)
		}
		read = append(read, evs...)
		after = next
	}
	evSameData(t, read, all, "read in byte-bounded pages")
}

// evInvalidBatch: an event over 256 KiB, an empty batch, non-JSON data and a negative Src
// are ErrInvalid and store nothing; the cursor still appends at offset 1.
func evInvalidBatch(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c := evNewRun(t, b, ctx, "r1")
	for _, bad := range []struct {
		name   string
		events []contract.Event
	}{
		{"event over 256 KiB", evConcat(evBatch("ok"), evLarge(1, contract.MaxEventBytes+1))},
		{"empty batch", nil},
		{"non-JSON data", []contract.Event{{Data: json.RawMessage(`{not json`)}}},
		{"negative src", []contract.Event{{Src: -1, Data: json.RawMessage(`1`)}}},
	} {
		_, err := b.Log().Append(ctx, "r1", c, bad.events)
		evIs(t, err, contract.ErrInvalid, "Append of "+bad.name)
	}
	// Exactly the limit is accepted.
	r := evAppend(t, b, ctx, "r1", c, evLarge(1, contract.MaxEventBytes))
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evLarge(1, contract.MaxEventBytes), "read")
	if got[0].Offset != 1 || r.Last != 1 {
		t.Errorf("first stored event at offset %d (last %d), want 1: a refused batch left something", got[0].Offset, r.Last)
	}
}

// evSrc: Src is kept per event, results carry the highest Src so far (in the cursor too),
// and Fence returns it.
func evSrc(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	ev := func(src int64, d string) contract.Event {
		return contract.Event{Src: src, Data: json.RawMessage(fmt.Sprintf("%q", d))}
	}
	cur := evNewRun(t, b, ctx, "r1")
	steps := []struct {
		events []contract.Event
		want   int64
	}{
		{[]contract.Event{ev(10, "a"), ev(20, "b")}, 20},
		{[]contract.Event{ev(0, "c")}, 20},
		{[]contract.Event{ev(50, "d"), ev(35, "e")}, 50},
	}
	var all []contract.Event
	for i, s := range steps {
		r := evAppend(t, b, ctx, "r1", cur, s.events)
		if r.Src != s.want || r.Cursor.Src != s.want {
			t.Errorf("append %d: Src %d, cursor Src %d; want %d", i, r.Src, r.Cursor.Src, s.want)
		}
		cur = r.Cursor
		all = append(all, s.events...)
	}
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, all, "read")
	for i := range got {
		if got[i].Src != all[i].Src {
			t.Errorf("event %d reads Src %d, want %d", i, got[i].Src, all[i].Src)
		}
	}
	_, f := evTakeOver(t, b, ctx, "r1")
	if f.Src != 50 || f.Cursor.Src != 50 {
		t.Errorf("Fence = %+v, want Src 50 in result and cursor", f)
	}
	evCheckFreshSrc(t, b, ctx)
}

// evCheckFreshSrc: Fence of an empty log returns Src 0.
func evCheckFreshSrc(t lkT, b contract.Backend, ctx context.Context) {
	t.Helper()
	evNewRun(t, b, ctx, "empty")
	_, f := evTakeOver(t, b, ctx, "empty")
	if f.Src != 0 {
		t.Errorf("Fence of an empty log = %+v, want Src 0", f)
	}
}

// evWholeItems: Read returns whole items — at least one even beyond limit, otherwise at
// most limit events — and next lies on an item boundary from which the rest follows.
func evWholeItems(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	cur := evNewRun(t, b, ctx, "r1")
	var batches [][]contract.Event
	for i := range 4 {
		batch := evBatch(fmt.Sprintf("b%d-0", i), fmt.Sprintf("b%d-1", i), fmt.Sprintf("b%d-2", i))
		cur = evAppend(t, b, ctx, "r1", cur, batch).Cursor
		batches = append(batches, batch)
	}
	read := func(after int64, limit int) ([]contract.Event, int64) {
		t.Helper()
		evs, next, closed, err := lg.Read(ctx, "r1", after, limit)
		if err != nil || closed {
			t.Fatalf("Read(after %d, limit %d) = closed %v, %v", after, limit, closed, err)
		}
		return evs, next
	}
	// limit 1: one whole item of 3, beyond the limit; stepping by next visits every item.
	after := int64(0)
	for i, batch := range batches {
		evs, next := read(after, 1)
		evSameData(t, evs, batch, fmt.Sprintf("item %d read with limit 1", i))
		after = next
	}
	if evs, next := read(after, 10); len(evs) != 0 || next < after {
		t.Errorf("Read at the tail = %d events, next %d (after %d); want none", len(evs), next, after)
	}
	// limit 4: only one 3-event item fits.
	evs, next := read(0, 4)
	evSameData(t, evs, batches[0], "read with limit 4")
	rest, _ := read(next, 100)
	evSameData(t, rest, evConcat(batches[1:]...), "read from next")
	// limit 6: whole items only, at most 6 events.
	if evs, _ := read(0, 6); len(evs) != 3 && len(evs) != 6 {
		t.Errorf("Read with limit 6 returned %d events, want 3 or 6 (whole items of 3)", len(evs))
	}
}

// evReaderClosesTerminal: a terminal run whose log was never closed reads as closed once
// the reader reaches the tail, and the log then refuses appends; a running run's does not.
func evReaderClosesTerminal(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	r := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1", "x2"))
	if _, closed, _ := evReadAll(t, b, ctx, "r1", 100); closed {
		t.Fatalf("a running run's unclosed log read as closed")
	}
	evFinish(t, b, ctx, "r1", 1)
	got, closed, _ := evReadAll(t, b, ctx, "r1", 1)
	evSameData(t, got, evBatch("x1", "x2"), "read of the terminal run")
	if !closed {
		t.Fatalf("the reader did not close a terminal run's log at its tail")
	}
	_, err := b.Log().Append(ctx, "r1", r.Cursor, evBatch("x3"))
	evIs(t, err, contract.ErrLogClosed, "Append after the reader closed the log")
	// The finisher's own Close arriving after the reader's is not a refusal of another kind.
	if err := b.Log().Close(ctx, "r1", r.Cursor); err != nil && !errors.Is(err, contract.ErrLogClosed) {
		t.Errorf("owner's Close after the reader closed = %v, want nil or ErrLogClosed", err)
	}
	// An empty log of a terminal run closes as well.
	evNewRun(t, b, ctx, "r2")
	evFinish(t, b, ctx, "r2", 1)
	if got, closed, _ := evReadAll(t, b, ctx, "r2", 100); !closed || len(got) != 0 {
		t.Errorf("empty log of a terminal run: %d events, closed %v; want none, closed", len(got), closed)
	}
}

// evFinish writes a terminal status under epoch, without closing the log.
func evFinish(t lkT, b contract.Backend, ctx context.Context, runID string, epoch int64) {
	t.Helper()
	if _, err := b.Runs().UpdateFenced(ctx, runID, epoch, contract.RunPatch{
		Status:     contract.Set(contract.StatusCompleted),
		FinishedAt: contract.Set(time.Now().UnixMilli()),
	}); err != nil {
		t.Fatalf("UpdateFenced(%s, completed): %v", runID, err)
	}
}

// evTenantsIsolated: the same run id under two tenants has two logs.
func evTenantsIsolated(t lkT, b contract.Backend) {
	ca, cb := lkCtx(t, "tenant-a"), lkCtx(t, "tenant-b")
	ra := evAppend(t, b, ca, "same", evNewRun(t, b, ca, "same"), evBatch("a1", "a2"))
	rb := evAppend(t, b, cb, "same", evNewRun(t, b, cb, "same"), evBatch("b1"))
	if got, _, _ := evReadAll(t, b, ca, "same", 100); len(got) > 0 {
		evSameData(t, got, evBatch("a1", "a2"), "tenant-a's log")
	} else {
		t.Fatalf("tenant-a's log is empty")
	}
	if err := b.Log().Close(ca, "same", ra.Cursor); err != nil {
		t.Fatalf("Close in tenant-a: %v", err)
	}
	evAppend(t, b, cb, "same", rb.Cursor, evBatch("b2"))
	got, closed, _ := evReadAll(t, b, cb, "same", 100)
	evSameData(t, got, evBatch("b1", "b2"), "tenant-b's log")
	if closed {
		t.Errorf("closing tenant-a's log closed tenant-b's")
	}
	_, err := b.Log().Append(lkCtx(t, "bad#tenant"), "same", rb.Cursor, evBatch("z"))
	evIs(t, err, contract.ErrInvalid, "Append under an invalid tenant")
}

// evSpan is one call's place in a round's global sequence, to tell which calls overlapped.
type evSpan struct{ s, e int64 }

func (a evSpan) overlaps(b evSpan) bool { return a.s < b.e && b.s < a.e }

// evRaceFence: writer A appends at epoch 1 in a loop while writer B claims epoch 2, fences
// and appends. A must end superseded; no epoch-1 event may follow an epoch-2 event; A's
// stored events are exactly the acknowledged ones. Appends overlapping B's Fence are the
// dangerous path and must occur.
func evRaceFence(t lkT, b contract.Backend) {
	const rounds = 25
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	var overlapCalls, overlapRounds, refusals, violations int
	for round := range rounds {
		runID := fmt.Sprintf("race-%d", round)
		c := evNewRun(t, b, ctx, runID)
		var (
			seq        atomic.Int64
			spans      []evSpan
			acked      []int
			aErr       error
			afterFence int
			superseded bool
			once       sync.Once
		)
		firstOK, bDone, aDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go func() {
			defer close(aDone)
			defer once.Do(func() { close(firstOK) })
			cur := c
			for i := 0; i < 100_000; i++ {
				sp := evSpan{s: seq.Add(1)}
				res, err := lg.Append(ctx, runID, cur, []contract.Event{{Data: evTag(1, i)}})
				sp.e = seq.Add(1)
				spans = append(spans, sp)
				switch {
				case err == nil:
					acked = append(acked, i)
					cur = res.Cursor
					once.Do(func() { close(firstOK) })
					select {
					case <-bDone: // stored after B fenced and appended: a broken fence
						if afterFence++; afterFence >= 3 {
							return
						}
					default:
					}
				case errors.Is(err, contract.ErrSuperseded):
					superseded = true
					return
				default:
					aErr = err
					return
				}
			}
			aErr = errors.New("never superseded in 100000 appends")
		}()
		lkAwait(t, firstOK, "writer A's first append")
		epoch, f := evTakeOverSpan(t, b, ctx, runID, &seq, aDone)
		cur := f.res.Cursor
		var bErr error
		for j := range 3 {
			r, err := lg.Append(ctx, runID, cur, []contract.Event{{Data: evTag(epoch, j)}})
			if err != nil {
				bErr = err
				break
			}
			cur = r.Cursor
		}
		close(bDone)
		lkAwait(t, aDone, "writer A to stop")
		if aErr != nil || bErr != nil {
			t.Fatalf("round %d: writer A: %v; writer B: %v", round, aErr, bErr)
		}
		if superseded {
			refusals++
		} else {
			t.Errorf("round %d: writer A kept appending after epoch %d fenced (%d appends acknowledged after)", round, epoch, afterFence)
		}
		hit := 0
		for _, sp := range spans {
			if sp.overlaps(f.span) {
				hit++
			}
		}
		overlapCalls += hit
		if hit > 0 {
			overlapRounds++
		}
		got, _, _ := evReadAll(t, b, ctx, runID, 1000)
		var stored1 []int
		var stored2 int
		for _, e := range got {
			w, i, ok := evParseTag(e.Data)
			switch {
			case !ok:
				t.Fatalf("round %d: a reader saw a non-event item: %s", round, evTrim(e.Data))
			case w == epoch:
				stored2++
			case w == 1 && stored2 > 0:
				violations++
				stored1 = append(stored1, i)
			default:
				stored1 = append(stored1, i)
			}
		}
		if fmt.Sprint(stored1) != fmt.Sprint(acked) || stored2 != 3 {
			t.Errorf("round %d: stored epoch-1 events %v, acknowledged %v; epoch-%d events %d, want 3",
				round, evShort(stored1), evShort(acked), epoch, stored2)
		}
	}
	t.Logf("%d rounds: %d superseded refusals, %d appends overlapped the fence in %d rounds, %d epoch-1 events after epoch 2",
		rounds, refusals, overlapCalls, overlapRounds, violations)
	if violations > 0 {
		t.Errorf("%d epoch-1 events were stored after epoch 2's first event", violations)
	}
	if overlapCalls == 0 {
		t.Errorf("no append overlapped a fence in %d rounds: the race was never exercised", rounds)
	}
}

// evFenceSpan is a Fence result with its place in a round's sequence.
type evFenceSpan struct {
	res  contract.AppendResult
	span evSpan
}

// evTakeOverSpan claims the next epoch and fences, recording the Fence call's span; on
// failure it waits for writer A (aDone) before failing the case.
func evTakeOverSpan(t lkT, b contract.Backend, ctx context.Context, runID string, seq *atomic.Int64, aDone <-chan struct{}) (int64, evFenceSpan) {
	t.Helper()
	st, err := b.Runs().Claim(ctx, runID, contract.Claim{
		Token:      "race-claim-" + runID,
		LeaseUntil: time.Now().UnixMilli() + contract.DefaultDriverLease,
	})
	if err != nil {
		<-aDone
		t.Fatalf("Claim(%s): %v", runID, err)
	}
	var f evFenceSpan
	f.span.s = seq.Add(1)
	f.res, err = b.Log().Fence(ctx, runID, st.Epoch())
	f.span.e = seq.Add(1)
	if err != nil {
		<-aDone
		t.Fatalf("Fence(%s, %d): %v", runID, st.Epoch(), err)
	}
	return st.Epoch(), f
}

// evShort renders a list of sequence numbers compactly for messages.
func evShort(xs []int) string {
	if len(xs) <= 12 {
		return fmt.Sprint(xs)
	}
	return fmt.Sprintf("%v…%v (%d)", xs[:6], xs[len(xs)-6:], len(xs))
}

// evRaceSameCursor: two writers of one epoch append different batches at the same cursor
// at once; exactly one wins, the other gets ErrConflict, and only the winner's is stored.
func evRaceSameCursor(t lkT, b contract.Backend) {
	const rounds = 20
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	var conflicts, overlapped int
	for round := range rounds {
		runID := fmt.Sprintf("slot-%d", round)
		c := evNewRun(t, b, ctx, runID)
		var seq atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		var errs [2]error
		var spans [2]evSpan
		for side := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				spans[side].s = seq.Add(1)
				_, errs[side] = lg.Append(ctx, runID, c, []contract.Event{{Data: evTag(1, side)}})
				spans[side].e = seq.Add(1)
			}()
		}
		close(start)
		wg.Wait()
		if spans[0].overlaps(spans[1]) {
			overlapped++
		}
		winner := -1
		for side, err := range errs {
			switch {
			case err == nil && winner < 0:
				winner = side
			case errors.Is(err, contract.ErrConflict):
				conflicts++
			default:
				t.Errorf("round %d: writer %d: %v (other: %v); want one success and one ErrConflict", round, side, err, errs[1-side])
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: neither writer succeeded: %v", round, errs)
		}
		got, _, _ := evReadAll(t, b, ctx, runID, 100)
		if len(got) != 1 || !evJSONEqual(got[0].Data, evTag(1, winner)) {
			t.Errorf("round %d: log holds %s, want only writer %d's event", round, evShow(got), winner)
		}
	}
	t.Logf("%d rounds: %d slot collisions refused with ErrConflict, %d rounds with overlapping calls", rounds, conflicts, overlapped)
	if conflicts != rounds {
		t.Errorf("%d ErrConflict refusals in %d rounds, want one per round", conflicts, rounds)
	}
}

// evRaceCancel: MarkCancel lands while a writer appends in a loop; the writer notices the
// cancel at the latest on its first append begun after MarkCancel returned, and readers
// never see the marker. Appends overlapping MarkCancel must occur.
func evRaceCancel(t lkT, b contract.Backend) {
	evRaceMarker(t, b, "cancel", b.Log().MarkCancel, func(_ contract.Cursor, res contract.AppendResult) bool {
		return res.CancelRequested
	})
}

// evRaceMarker: mark puts a marker while a writer appends one event at a time in a loop;
// the writer notices it (noticed of the append's cursor and result) at the latest on its
// first append begun after mark returned, and readers never see the marker. Appends
// overlapping mark must occur.
func evRaceMarker(t lkT, b contract.Backend, what string, mark func(ctx context.Context, runID string) error,
	noticed func(at contract.Cursor, res contract.AppendResult) bool) {
	const rounds = 15
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	var overlapCalls, lateNotices int
	for round := range rounds {
		runID := fmt.Sprintf("%s-%d", what, round)
		c := evNewRun(t, b, ctx, runID)
		type call struct {
			span   evSpan
			marked bool
		}
		var (
			seq   atomic.Int64
			calls []call
			acked []int
			aErr  error
			once  sync.Once
		)
		var markedAt atomic.Int64 // mark's end in the sequence, 0 until it returned
		firstOK, aDone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(aDone)
			defer once.Do(func() { close(firstOK) })
			cur, noticedAt, afterMark := c, -1, 0
			for i := 0; i < 100_000; i++ {
				sp := evSpan{s: seq.Add(1)}
				res, err := lg.Append(ctx, runID, cur, []contract.Event{{Data: evTag(1, i)}})
				sp.e = seq.Add(1)
				if err != nil {
					aErr = err
					return
				}
				seen := noticed(cur, res)
				calls = append(calls, call{sp, seen})
				acked = append(acked, i)
				cur = res.Cursor
				once.Do(func() { close(firstOK) })
				if seen && noticedAt < 0 {
					noticedAt = i
				}
				if noticedAt >= 0 && i >= noticedAt+2 {
					return
				}
				if m := markedAt.Load(); m > 0 && sp.s > m {
					if afterMark++; afterMark >= 5 {
						return // never noticed: reported below
					}
				}
			}
		}()
		lkAwait(t, firstOK, "the writer's first append")
		span := evSpan{s: seq.Add(1)}
		err := mark(ctx, runID)
		span.e = seq.Add(1)
		markedAt.Store(span.e)
		lkAwait(t, aDone, "the writer to stop")
		if err != nil || aErr != nil {
			t.Fatalf("round %d: %s marker: %v; writer: %v", round, what, err, aErr)
		}
		first := -1
		firstAfter := -1
		for i, cl := range calls {
			if cl.span.overlaps(span) {
				overlapCalls++
			}
			if cl.marked && first < 0 {
				first = i
			}
			if cl.span.s > span.e && firstAfter < 0 {
				firstAfter = i
			}
		}
		switch {
		case first < 0:
			t.Errorf("round %d: the writer never saw the %s marker in %d appends", round, what, len(calls))
		case firstAfter >= 0 && first > firstAfter:
			lateNotices++
			t.Errorf("round %d: %s marker first noticed by append %d, but append %d began after it returned", round, what, first, firstAfter)
		}
		got, _, _ := evReadAll(t, b, ctx, runID, 1000)
		var stored []int
		for _, e := range got {
			w, i, ok := evParseTag(e.Data)
			if !ok || w != 1 {
				t.Fatalf("round %d: a reader saw a non-event item: %s", round, evTrim(e.Data))
			}
			stored = append(stored, i)
		}
		if fmt.Sprint(stored) != fmt.Sprint(acked) {
			t.Errorf("round %d: stored %v, acknowledged %v", round, evShort(stored), evShort(acked))
		}
	}
	t.Logf("%d rounds: %d appends overlapped the %s marker, %d late notices", rounds, overlapCalls, what, lateNotices)
	if overlapCalls == 0 {
		t.Errorf("no append overlapped the %s marker in %d rounds: the race was never exercised", what, rounds)
	}
}

// evSupersededThroughCancel: a cancel marker at the tail does not hide the owner's epoch:
// the superseded epoch's Fence, Append and Close are still refused, and the owner's Fence
// reports the cancel.
func evSupersededThroughCancel(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	r1 := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	epoch, _ := evTakeOver(t, b, ctx, "r1")
	if err := lg.MarkCancel(ctx, "r1"); err != nil {
		t.Fatalf("MarkCancel: %v", err)
	}
	_, err := lg.Fence(ctx, "r1", 1)
	evIs(t, err, contract.ErrSuperseded, "Fence(1) with a cancel marker after epoch 2's fence")
	_, err = lg.Append(ctx, "r1", r1.Cursor, evBatch("x2"))
	evIs(t, err, contract.ErrSuperseded, "epoch 1 Append with a cancel marker after epoch 2's fence")
	evIs(t, lg.Close(ctx, "r1", r1.Cursor), contract.ErrSuperseded, "epoch 1 Close with a cancel marker after epoch 2's fence")
	f, err := lg.Fence(ctx, "r1", epoch)
	if err != nil || !f.CancelRequested || f.Cursor.Epoch != epoch {
		t.Fatalf("Fence(%d) over a cancel marker = %+v, %v; want the owner's cursor and CancelRequested", epoch, f, err)
	}
	evAppend(t, b, ctx, "r1", f.Cursor, evBatch("y1"))
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "y1"), "read")
	if closed {
		t.Errorf("log read as closed")
	}
}

// evCloseStepsPast: the owner's Close at a cursor now holding a marker (mark puts it)
// steps past it and closes.
func evCloseStepsPast(mark func(t lkT, b contract.Backend, ctx context.Context, runID string)) func(lkT, contract.Backend) {
	return func(t lkT, b contract.Backend) {
		ctx := lkCtx(t, "t1")
		lg := b.Log()
		r := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
		mark(t, b, ctx, "r1")
		if err := lg.Close(ctx, "r1", r.Cursor); err != nil {
			t.Fatalf("Close over a marker: %v", err)
		}
		_, err := lg.Append(ctx, "r1", r.Cursor, evBatch("x2"))
		evIs(t, err, contract.ErrLogClosed, "Append after Close")
		got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
		evSameData(t, got, evBatch("x1"), "read")
		if !closed {
			t.Errorf("Read did not report closed")
		}
	}
}

// evMarkCancel puts a cancel marker on runID, failing the case on an error.
func evMarkCancel(t lkT, b contract.Backend, ctx context.Context, runID string) {
	t.Helper()
	if err := b.Log().MarkCancel(ctx, runID); err != nil {
		t.Fatalf("MarkCancel(%s): %v", runID, err)
	}
}

// evRaceCloseFence: epoch 1 closes while epoch 2 fences and appends, released together.
// Exactly one wins: either the close (the fence gets ErrLogClosed, the log reads closed)
// or the fence (the close gets ErrSuperseded, the successor's event is stored, the log
// stays open).
func evRaceCloseFence(t lkT, b contract.Backend) {
	const rounds = 25
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	var closeWins, fenceWins, overlapped int
	for round := range rounds {
		runID := fmt.Sprintf("close-%d", round)
		r := evAppend(t, b, ctx, runID, evNewRun(t, b, ctx, runID), evBatch("x1"))
		st, err := b.Runs().Claim(ctx, runID, contract.Claim{Token: "close-race-" + runID, LeaseUntil: time.Now().UnixMilli() + contract.DefaultDriverLease})
		if err != nil {
			t.Fatalf("Claim(%s): %v", runID, err)
		}
		var (
			seq                        atomic.Int64
			closeSpan, fenceSpan       evSpan
			closeErr, fenceErr, appErr error
			wg                         sync.WaitGroup
		)
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			closeSpan.s = seq.Add(1)
			closeErr = lg.Close(ctx, runID, r.Cursor)
			closeSpan.e = seq.Add(1)
		}()
		go func() {
			defer wg.Done()
			<-start
			fenceSpan.s = seq.Add(1)
			var f contract.AppendResult
			f, fenceErr = lg.Fence(ctx, runID, st.Epoch())
			fenceSpan.e = seq.Add(1)
			if fenceErr == nil {
				_, appErr = lg.Append(ctx, runID, f.Cursor, evBatch("y1"))
			}
		}()
		close(start)
		wg.Wait()
		if closeSpan.overlaps(fenceSpan) {
			overlapped++
		}
		got, closed, _ := evReadAll(t, b, ctx, runID, 100)
		switch {
		case closeErr == nil && errors.Is(fenceErr, contract.ErrLogClosed):
			closeWins++
			if !closed || len(got) != 1 {
				t.Errorf("round %d: the close won, but the log reads %s, closed %v", round, evShow(got), closed)
			}
		case errors.Is(closeErr, contract.ErrSuperseded) && fenceErr == nil && appErr == nil:
			fenceWins++
			if closed || len(got) != 2 {
				t.Errorf("round %d: the fence won, but the log reads %s, closed %v", round, evShow(got), closed)
			}
		default:
			t.Errorf("round %d: Close = %v, Fence = %v, successor's Append = %v; want exactly one winner",
				round, closeErr, fenceErr, appErr)
		}
	}
	// Both calls target the same free slot, so every round is a slot collision whose loser
	// must be refused; overlap in time depends on scheduling and is only reported.
	t.Logf("%d rounds (slot collisions): close won %d, fence won %d, %d rounds with overlapping calls",
		rounds, closeWins, fenceWins, overlapped)
	if closeWins+fenceWins != rounds {
		t.Errorf("%d of %d slot collisions resolved with exactly one winner", closeWins+fenceWins, rounds)
	}
}
