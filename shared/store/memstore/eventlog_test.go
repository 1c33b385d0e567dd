package memstore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

func evs(srcs ...int64) []contract.Event {
	out := make([]contract.Event, len(srcs))
	for i, s := range srcs {
		out[i] = contract.Event{Src: s, Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, s))}
	}
	return out
}

func TestLogFencingRetryAndConflict(t *testing.T) {
	ctx, lg := tctx(t, "a"), memstore.New().Log()
	c1 := contract.Cursor{Epoch: 1, Next: 1}
	res, err := lg.Append(ctx, "r", c1, evs(10, 20))
	must(t, err, "append")
	if res.Cursor != (contract.Cursor{Epoch: 1, Next: 3, Src: 20}) || res.Last != 2 {
		t.Fatalf("append result %+v", res)
	}
	again, err := lg.Append(ctx, "r", c1, evs(10, 20))
	must(t, err, "ambiguous retry")
	if again != res {
		t.Fatalf("retry result %+v, want %+v", again, res)
	}
	_, err = lg.Append(ctx, "r", c1, evs(11))
	wantErr(t, err, contract.ErrConflict, "another batch at the same cursor")

	f, err := lg.Fence(ctx, "r", 2)
	must(t, err, "fence")
	if f.Cursor != (contract.Cursor{Epoch: 2, Next: 4, Src: 20}) || f.Last != 3 || f.Src != 20 {
		t.Fatalf("fence result %+v", f)
	}
	f2, err := lg.Fence(ctx, "r", 2)
	must(t, err, "retried fence")
	if f2 != f {
		t.Fatalf("retried fence %+v, want %+v", f2, f)
	}
	_, err = lg.Append(ctx, "r", res.Cursor, evs(30))
	wantErr(t, err, contract.ErrSuperseded, "append by the fenced epoch")
	_, err = lg.Fence(ctx, "r", 1)
	wantErr(t, err, contract.ErrSuperseded, "fence by a lower epoch")
	wantErr(t, lg.Close(ctx, "r", res.Cursor), contract.ErrSuperseded, "close by the fenced epoch")

	must(t, lg.MarkCancel(ctx, "r"), "cancel")
	res2, err := lg.Append(ctx, "r", f.Cursor, evs(30))
	must(t, err, "append past the cancel marker")
	if !res2.CancelRequested || res2.Cursor.Next != 6 {
		t.Fatalf("cancel marker not seen in-band: %+v", res2)
	}
	must(t, lg.Close(ctx, "r", f.Cursor), "close with the owner's stale cursor")
	_, err = lg.Append(ctx, "r", res2.Cursor, evs(40))
	wantErr(t, err, contract.ErrLogClosed, "append after close")
	wantErr(t, lg.MarkCancel(ctx, "r"), contract.ErrLogClosed, "cancel after close")

	got, next, closed, err := lg.Read(ctx, "r", 0, 100)
	must(t, err, "read")
	if len(got) != 3 || got[2].Offset != 5 || got[2].Src != 30 || !closed || next != 5 {
		t.Fatalf("read: %+v next %d closed %v", got, next, closed)
	}
}

func TestReadClosesATerminalRunsLog(t *testing.T) {
	s := memstore.New()
	ctx := tctx(t, "a")
	claimed(t, s.Runs(), ctx, "r")
	res, err := s.Log().Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(1))
	must(t, err, "append")
	if _, _, closed, err := s.Log().Read(ctx, "r", 0, 10); err != nil || closed {
		t.Fatalf("read of a running run: closed=%v err=%v", closed, err)
	}
	_, err = s.Runs().UpdateFenced(ctx, "r", 1, contract.RunPatch{Status: contract.Set(contract.StatusFailed)})
	must(t, err, "finish")
	_, next, closed, err := s.Log().Read(ctx, "r", 1, 10)
	if err != nil || !closed || next != 1 {
		t.Fatalf("read at the tail of a terminal run: next=%d closed=%v err=%v", next, closed, err)
	}
	_, err = s.Log().Append(ctx, "r", res.Cursor, evs(2))
	wantErr(t, err, contract.ErrLogClosed, "append after the reader's close")
	must(t, s.Log().Close(ctx, "r", res.Cursor), "the driver's own close after the reader's")
}

func TestLogSplitsLargeBatches(t *testing.T) {
	ctx, lg := tctx(t, "a"), memstore.New().Log()
	big := strings.Repeat("x", 200<<10)
	var batch []contract.Event
	for i := range 5 {
		batch = append(batch, contract.Event{Src: int64(i + 1), Data: json.RawMessage(`"` + big + `"`)})
	}
	res, err := lg.Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 1}, batch)
	must(t, err, "append 1 MB")
	if res.Last != 5 || res.Src != 5 {
		t.Fatalf("append result %+v", res)
	}
	again, err := lg.Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 1}, batch)
	if err != nil || again != res {
		t.Fatalf("retry of a split batch: %+v %v", again, err)
	}
	var all []contract.Event
	reads := 0
	for after := int64(0); ; reads++ {
		got, next, _, err := lg.Read(ctx, "r", after, 1)
		must(t, err, "read")
		if len(got) == 0 {
			break
		}
		all, after = append(all, got...), next
	}
	if len(all) != 5 || reads < 2 || all[4].Offset != 5 || len(all[4].Data) != len(big)+2 {
		t.Fatalf("read back %d events in %d reads", len(all), reads)
	}
}

func TestLogMarkersAndMidItemReads(t *testing.T) {
	ctx, lg := tctx(t, "a"), memstore.New().Log()
	must(t, lg.MarkCancel(ctx, "r"), "cancel on an empty log")
	must(t, lg.MarkCancel(ctx, "r"), "repeated cancel")
	f, err := lg.Fence(ctx, "r", 1)
	must(t, err, "fence after a cancel")
	if !f.CancelRequested || f.Last != 2 || f.Cursor.Next != 3 {
		t.Fatalf("fence after a cancel marker: %+v", f)
	}
	res, err := lg.Append(ctx, "r", f.Cursor, evs(1, 2, 3))
	must(t, err, "append")
	got, next, closed, err := lg.Read(ctx, "r", 4, 10)
	must(t, err, "read from inside an item")
	if len(got) != 1 || got[0].Offset != 5 || next != 5 || closed {
		t.Fatalf("mid-item read: %+v next %d closed %v", got, next, closed)
	}
	got, next, _, err = lg.Read(ctx, "r", next, 10)
	if err != nil || len(got) != 0 || next != 5 {
		t.Fatalf("read at the tail: %+v next %d err %v", got, next, err)
	}
	_, err = lg.Fence(ctx, "r", 2)
	must(t, err, "fence 2")
	_, err = lg.Append(ctx, "r", res.Cursor, evs(4))
	wantErr(t, err, contract.ErrSuperseded, "append by epoch 1 after fence 2")
}

// TestFenceRacesAppenders runs an appender against a fencer many times; every round must
// end with the appender superseded and no epoch-1 event stored after the fence.
func TestFenceRacesAppenders(t *testing.T) {
	s := memstore.New()
	ctx := tctx(t, "a")
	superseded := 0
	for round := range 50 {
		id := fmt.Sprintf("r%d", round)
		claimed(t, s.Runs(), ctx, id)
		started := make(chan struct{})
		errc := make(chan error, 1)
		go func() {
			cur := contract.Cursor{Epoch: 1, Next: 1}
			for i := 0; ; i++ {
				res, err := s.Log().Append(ctx, id, cur, evs(int64(i+1)))
				if i == 0 {
					close(started)
				}
				if err != nil {
					errc <- err
					return
				}
				cur = res.Cursor
			}
		}()
		<-started
		st, err := s.Runs().Claim(ctx, id, contract.Claim{Token: "c"})
		must(t, err, "claim")
		f, err := s.Log().Fence(ctx, id, st.Epoch())
		must(t, err, "fence")
		if err := <-errc; errors.Is(err, contract.ErrSuperseded) {
			superseded++
		} else {
			t.Fatalf("round %d: appender ended with %v, want ErrSuperseded", round, err)
		}
		got, _, _, err := s.Log().Read(ctx, id, f.Last, 1<<20)
		must(t, err, "read past the fence")
		if len(got) != 0 {
			t.Fatalf("round %d: %d events stored after the fence", round, len(got))
		}
	}
	t.Logf("appender superseded in %d/50 rounds", superseded)
	if superseded != 50 {
		t.Fatalf("dangerous path hit %d times, want 50", superseded)
	}
}

func TestHandMadeCursorsCannotOverlapOrGap(t *testing.T) {
	ctx, lg := tctx(t, "a"), memstore.New().Log()
	_, err := lg.Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 2}, evs(1))
	wantErr(t, err, contract.ErrInvalid, "append past the tail of an empty log")
	_, err = lg.Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(1, 2, 3))
	must(t, err, "append")
	_, err = lg.Append(ctx, "r", contract.Cursor{Epoch: 1, Next: 3}, evs(4))
	wantErr(t, err, contract.ErrInvalid, "append inside an item")
	wantErr(t, lg.Close(ctx, "r", contract.Cursor{Epoch: 1, Next: 6}), contract.ErrInvalid, "close past the tail")
	got, _, _, err := lg.Read(ctx, "r", 0, 10)
	if err != nil || len(got) != 3 {
		t.Fatalf("read after refused writes: %d events, %v", len(got), err)
	}
}
