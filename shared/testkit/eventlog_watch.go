package testkit

import (
	"context"
	"encoding/json"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The watch marker's cases (contract.EventLog.MarkWatch, docs/design.md §8.1): a marker
// like the cancel marker, without the cancel. The deployed deliverer relies on one fact of
// it: an append that lands after a watch marker and begins below it steps over it, so its
// result does not fill exactly [at.Next, Last] with its own events (evSteppedOver).

// evSteppedOver reports an append of n events at `at` whose result spans more offsets than
// its events: it stepped over a marker (the keeper's Landing then carries no events).
func evSteppedOver(at contract.Cursor, n int, res contract.AppendResult) bool {
	return res.Last-at.Next+1 != int64(n)
}

// evMarkWatch puts a watch marker on runID, failing the case on an error.
func evMarkWatch(t lkT, b contract.Backend, ctx context.Context, runID string) {
	t.Helper()
	if err := b.Log().MarkWatch(ctx, runID); err != nil {
		t.Fatalf("MarkWatch(%s): %v", runID, err)
	}
}

// evWatchOneOffset: each watch marker occupies one offset, even at a watch-marker tail;
// the append after two steps past both (no cancel reported) and readers skip them.
func evWatchOneOffset(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	r1 := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	evMarkWatch(t, b, ctx, "r1")
	evMarkWatch(t, b, ctx, "r1")
	r2 := evAppend(t, b, ctx, "r1", r1.Cursor, evBatch("x2"))
	if r2.CancelRequested || r2.Last != r1.Last+3 || !evSteppedOver(r1.Cursor, 1, r2) {
		t.Errorf("Append after two watch markers at %+v = %+v; want last %d, no cancel", r1.Cursor, r2, r1.Last+3)
	}
	r3 := evAppend(t, b, ctx, "r1", r2.Cursor, evBatch("x3", "x4"))
	if evSteppedOver(r2.Cursor, 2, r3) {
		t.Errorf("Append with no marker before it = %+v from %+v; want its events exactly", r3, r2.Cursor)
	}
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "x2", "x3", "x4"), "read")
	if got[1].Offset != r2.Last {
		t.Errorf("event after the markers reads at %d, Append reported last %d", got[1].Offset, r2.Last)
	}
	// A read from between the markers starts at the next event.
	evs, _, _, err := b.Log().Read(ctx, "r1", r1.Last+1, 100)
	if err != nil || len(evs) == 0 || evs[0].Offset != r2.Last {
		t.Errorf("Read after the first marker = %s, %v; want the events from offset %d", evShow(evs), err, r2.Last)
	}
}

// evWatchEmptyLog: a watch marker on an empty log takes offset 1; the first append steps
// past it and reports no cancel.
func evWatchEmptyLog(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	c := evNewRun(t, b, ctx, "r1")
	evMarkWatch(t, b, ctx, "r1")
	r := evAppend(t, b, ctx, "r1", c, evBatch("x1"))
	if r.CancelRequested || r.Last != 2 {
		t.Errorf("first Append after a watch marker = %+v; want last 2, no cancel", r)
	}
	got, _, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1"), "read")
}

// evWatchKeepsCancel: a watch marker sets no cancel (a fence after it reports none), and
// never hides a cancel marker before it: a fence after both reports the cancel, keeping
// the highest Src, as does the owner's append stepping over both.
func evWatchKeepsCancel(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	c := evNewRun(t, b, ctx, "r1")
	evAppend(t, b, ctx, "r1", c, []contract.Event{{Src: 7, Data: json.RawMessage(`"x1"`)}})
	evMarkWatch(t, b, ctx, "r1")
	_, f := evTakeOver(t, b, ctx, "r1")
	if f.CancelRequested || f.Src != 7 {
		t.Errorf("Fence after a watch marker = %+v, want no cancel and Src 7", f)
	}
	if err := lg.MarkCancel(ctx, "r1"); err != nil {
		t.Fatalf("MarkCancel: %v", err)
	}
	evMarkWatch(t, b, ctx, "r1")
	evMarkWatch(t, b, ctx, "r1")
	_, f2 := evTakeOver(t, b, ctx, "r1")
	if !f2.CancelRequested || f2.Src != 7 {
		t.Errorf("Fence after a cancel and two watch markers = %+v, want CancelRequested and Src 7", f2)
	}
	// The owner's append over a cancel then a watch marker reports the cancel.
	c3 := evNewRun(t, b, ctx, "r3")
	r3 := evAppend(t, b, ctx, "r3", c3, evBatch("y1"))
	if err := lg.MarkCancel(ctx, "r3"); err != nil {
		t.Fatalf("MarkCancel: %v", err)
	}
	evMarkWatch(t, b, ctx, "r3")
	if a := evAppend(t, b, ctx, "r3", r3.Cursor, evBatch("y2")); !a.CancelRequested {
		t.Errorf("Append over a cancel and a watch marker = %+v, want CancelRequested", a)
	}
}

// evSupersededThroughWatch: a watch marker at the tail does not hide the owner's epoch:
// the superseded epoch's Fence, Append and Close are still refused.
func evSupersededThroughWatch(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	r1 := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	epoch, f := evTakeOver(t, b, ctx, "r1")
	evMarkWatch(t, b, ctx, "r1")
	_, err := lg.Fence(ctx, "r1", 1)
	evIs(t, err, contract.ErrSuperseded, "Fence(1) with a watch marker after epoch 2's fence")
	_, err = lg.Append(ctx, "r1", r1.Cursor, evBatch("x2"))
	evIs(t, err, contract.ErrSuperseded, "epoch 1 Append with a watch marker after epoch 2's fence")
	evIs(t, lg.Close(ctx, "r1", r1.Cursor), contract.ErrSuperseded, "epoch 1 Close with a watch marker after epoch 2's fence")
	a := evAppend(t, b, ctx, "r1", f.Cursor, evBatch("y1"))
	if a.Cursor.Epoch != epoch || a.CancelRequested {
		t.Errorf("owner's Append over a watch marker = %+v, want epoch %d, no cancel", a, epoch)
	}
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1", "y1"), "read")
	if closed {
		t.Errorf("log read as closed")
	}
}

// evWatchClosed: a closed log refuses a watch marker with ErrLogClosed and stays as it was.
func evWatchClosed(t lkT, b contract.Backend) {
	ctx := lkCtx(t, "t1")
	lg := b.Log()
	r := evAppend(t, b, ctx, "r1", evNewRun(t, b, ctx, "r1"), evBatch("x1"))
	if err := lg.Close(ctx, "r1", r.Cursor); err != nil {
		t.Fatalf("Close: %v", err)
	}
	evIs(t, lg.MarkWatch(ctx, "r1"), contract.ErrLogClosed, "MarkWatch after Close")
	got, closed, _ := evReadAll(t, b, ctx, "r1", 100)
	evSameData(t, got, evBatch("x1"), "read")
	if !closed {
		t.Errorf("Read of a closed log did not report closed")
	}
}

// evRaceWatch: MarkWatch lands while a writer appends; the writer's first append begun
// after MarkWatch returned steps over a marker (the deliverer's cue to list subscriptions
// again), no append reports a cancel, and readers never see the marker.
func evRaceWatch(t lkT, b contract.Backend) {
	evRaceMarker(t, b, "watch", b.Log().MarkWatch, func(at contract.Cursor, res contract.AppendResult) bool {
		if res.CancelRequested {
			t.Errorf("an append reported a cancel after a watch marker: %+v", res)
		}
		return evSteppedOver(at, 1, res)
	})
}
