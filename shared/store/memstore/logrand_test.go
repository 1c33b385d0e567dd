package memstore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// randActor is one driver of the randomized log test.
type randActor struct {
	epoch   int64
	cur     contract.Cursor
	fenced  bool
	seq     int
	pending []contract.Event // a batch whose response was lost: retried as is
	lostAt  contract.Cursor
	prev    contract.Cursor // the cursor of the last acknowledged append (now stale)
}

type randTag struct {
	A int   `json:"a"`
	E int64 `json:"e"`
	S int   `json:"s"`
}

// TestRandomizedLogWithLostResponses interleaves drivers that claim, fence, append (with
// lost responses retried at the same cursor), cancel and close, then checks the docs/design.md §2.4
// invariants: no lower epoch after a higher one, no batch stored twice, every
// acknowledged batch stored once and in order, nothing after the close.
func TestRandomizedLogWithLostResponses(t *testing.T) {
	var superseded, retries, conflicts, cancels int
	for seed := range uint64(150) {
		rng := rand.New(rand.NewPCG(seed, 7))
		s := memstore.New()
		ctx := tctx(t, "a")
		claimed(t, s.Runs(), ctx, "r")
		actors := []*randActor{{epoch: 1, cur: contract.Cursor{Epoch: 1, Next: 1}, fenced: true}, {}, {}}
		acked := map[randTag]bool{}
		closed := false
		for step := 0; step < 120 && !closed; step++ {
			i := rng.IntN(len(actors))
			a := actors[i]
			switch r := rng.IntN(100); {
			case r < 5:
				if err := s.Log().MarkCancel(ctx, "r"); err == nil {
					cancels++
				} else if !errors.Is(err, contract.ErrLogClosed) {
					t.Fatalf("seed %d: cancel: %v", seed, err)
				}
			case r < 15 || a.epoch == 0:
				st, err := s.Runs().Claim(ctx, "r", contract.Claim{Token: fmt.Sprintf("c%d-%d", seed, step)})
				if err != nil {
					t.Fatalf("seed %d: claim: %v", seed, err)
				}
				*a = randActor{epoch: st.Epoch(), seq: a.seq}
				fallthrough
			case !a.fenced:
				res, err := s.Log().Fence(ctx, "r", a.epoch)
				if rng.IntN(4) == 0 && err == nil { // lost response: fence again
					retries++
					res, err = s.Log().Fence(ctx, "r", a.epoch)
				}
				switch {
				case errors.Is(err, contract.ErrSuperseded):
					superseded++
					a.epoch = 0
				case err != nil:
					t.Fatalf("seed %d: fence %d: %v", seed, a.epoch, err)
				default:
					a.cur, a.fenced = res.Cursor, true
				}
			case r < 25 && a.fenced:
				err := s.Log().Close(ctx, "r", a.cur)
				if errors.Is(err, contract.ErrSuperseded) {
					superseded++
					a.epoch = 0
					continue
				}
				if err != nil {
					t.Fatalf("seed %d: close: %v", seed, err)
				}
				closed = true
			default:
				batch, at := a.pending, a.lostAt
				if batch == nil {
					at = a.cur
					for range 1 + rng.IntN(3) {
						a.seq++
						d, _ := json.Marshal(randTag{A: i, E: a.epoch, S: a.seq})
						batch = append(batch, contract.Event{Data: d})
					}
				} else {
					retries++
				}
				res, err := s.Log().Append(ctx, "r", at, batch)
				switch {
				case errors.Is(err, contract.ErrSuperseded):
					superseded++
					a.epoch, a.pending = 0, nil
				case errors.Is(err, contract.ErrConflict):
					t.Fatalf("seed %d: an actor's own retry at its cursor met ErrConflict: %v", seed, err)
				case err != nil:
					t.Fatalf("seed %d: append: %v", seed, err)
				case rng.IntN(4) == 0 && a.pending == nil: // lost response: retry next time
					a.pending, a.lostAt = batch, at
				default:
					a.pending, a.prev, a.cur = nil, at, res.Cursor
					for _, e := range batch {
						var tag randTag
						_ = json.Unmarshal(e.Data, &tag)
						acked[tag] = true
					}
				}
			}
		}
		// A stale cursor with a different batch at an own slot is ErrConflict.
		if !closed {
			for _, a := range actors {
				if a.epoch > 0 && a.fenced && a.prev.Epoch == a.epoch {
					_, err := s.Log().Append(ctx, "r", a.prev, evs(999))
					if errors.Is(err, contract.ErrConflict) {
						conflicts++
					}
				}
			}
		}
		checkLog(t, s, seed, acked)
	}
	t.Logf("superseded %d, lost-response retries %d, conflicts %d, cancel markers %d", superseded, retries, conflicts, cancels)
	if superseded == 0 || retries == 0 || conflicts == 0 || cancels == 0 {
		t.Fatal("a dangerous path was never exercised")
	}
}

func checkLog(t *testing.T, s *memstore.Store, seed uint64, acked map[randTag]bool) {
	t.Helper()
	got, _, _, err := s.Log().Read(tctx(t, "a"), "r", 0, 1<<20)
	if err != nil {
		t.Fatalf("seed %d: read: %v", seed, err)
	}
	seen := map[randTag]bool{}
	lastSeq := map[[2]int64]int{}
	var maxEpoch int64
	for i, e := range got {
		if e.Offset <= 0 || i > 0 && e.Offset <= got[i-1].Offset {
			t.Fatalf("seed %d: offsets not increasing at %d", seed, i)
		}
		var tag randTag
		if json.Unmarshal(e.Data, &tag) != nil || tag.E == 0 {
			continue // a probe event of the conflict check never lands
		}
		if tag.E < maxEpoch {
			t.Fatalf("seed %d: epoch %d stored after epoch %d", seed, tag.E, maxEpoch)
		}
		maxEpoch = tag.E
		if seen[tag] {
			t.Fatalf("seed %d: batch event %+v stored twice", seed, tag)
		}
		seen[tag] = true
		k := [2]int64{int64(tag.A), tag.E}
		if tag.S <= lastSeq[k] {
			t.Fatalf("seed %d: actor %d epoch %d out of order", seed, tag.A, tag.E)
		}
		lastSeq[k] = tag.S
	}
	for tag := range acked {
		if !seen[tag] {
			t.Fatalf("seed %d: acknowledged event %+v lost", seed, tag)
		}
	}
}
