package dynamostore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// ordered reports the first place where a lower epoch's item follows a higher epoch's
// item (cancel and watch markers count as their prevEpoch), or nil.
func ordered(items []rawItem) error {
	high := int64(0)
	for _, it := range items {
		if it.owner() < high {
			return fmt.Errorf("%s@%d of epoch %d after epoch %d's items: %s", it.kind, it.first, it.owner(), high, kinds(items))
		}
		high = it.owner()
	}
	return nil
}

// replica is one writer's own client, counter and store on the shared table.
type replica struct {
	ctr *dynamotest.Counter
	log contract.EventLog
}

func (e *logEnv) replica(broken bool) replica {
	ctr := dynamotest.NewCounter()
	client := dynamotest.NewClient(dynamotest.Endpoint(e.t), ctr.Attach)
	st := dynamostore.New(dynamostore.Config{Client: client, Table: e.table})
	if broken {
		return replica{ctr: ctr, log: testkit.NoEpochCheckLog(st.Log())}
	}
	return replica{ctr: ctr, log: st.Log()}
}

// TestLogFenceRaceAcrossReplicas: per round, epoch 1 appends in a loop while epochs 2 and 3,
// each on its own client (another replica), fence and append concurrently. Every refusal
// must be ErrSuperseded, every acknowledged event must read back once, and no lower-epoch
// item may follow a higher epoch's item in the stored chain. Slot collisions (conditional
// puts that met an occupied slot) are counted and must have happened. The negative
// control runs the same race on logs without the epoch check and must see the order broken.
func TestLogFenceRaceAcrossReplicas(t *testing.T) {
	t.Run("real", func(t *testing.T) {
		r := fenceRace(t, false, 12)
		t.Logf("12 rounds: %d slot collisions, %d superseded refusals, %d order violations", r.collisions, r.superseded, r.violations)
		if r.collisions == 0 || r.superseded == 0 {
			t.Fatal("no slot collision or refusal happened: the race was not exercised")
		}
		if r.violations != 0 {
			t.Fatalf("%d rounds stored a lower epoch after a higher one", r.violations)
		}
	})
	t.Run("negative-control", func(t *testing.T) {
		r := fenceRace(t, true, 3)
		t.Logf("3 rounds without the epoch check: %d slot collisions, %d order violations", r.collisions, r.violations)
		if r.violations == 0 {
			t.Fatal("the order check did not catch a log without the epoch check")
		}
	})
}

type raceResult struct{ collisions, superseded, violations int }

// fenceRace runs the rounds of TestLogFenceRaceAcrossReplicas; broken = every replica
// skips the epoch check.
func fenceRace(t *testing.T, broken bool, rounds int) raceResult {
	e := newLogEnv(t)
	reps := []replica{e.replica(broken), e.replica(broken), e.replica(broken)}
	var res raceResult
	for round := range rounds {
		runID := fmt.Sprintf("race-%d", round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		acked := make([][]string, 3) // per epoch, the data of acknowledged events
		errs := make([]error, 3)
		refused := make([]bool, 3)
		for w := range 3 {
			epoch := int64(w + 1)
			wg.Go(func() {
				<-start
				lg := reps[w].log
				c := contract.Cursor{Epoch: 1, Next: 1}
				limit := 300 // epoch 1 runs until it is superseded (a broken log never is)
				if broken {
					limit = 40
				}
				if epoch > 1 {
					f, err := lg.Fence(e.ctx, runID, epoch)
					if errors.Is(err, contract.ErrSuperseded) {
						refused[w] = true
						return
					}
					if err != nil {
						errs[w] = fmt.Errorf("fence %d: %w", epoch, err)
						return
					}
					c, limit = f.Cursor, 8
				}
				for i := range limit {
					batch := []contract.Event{{Data: fmt.Appendf(nil, `{"w":%d,"i":%d}`, epoch, i)}}
					res, err := lg.Append(e.ctx, runID, c, batch)
					if errors.Is(err, contract.ErrSuperseded) {
						refused[w] = true
						return
					}
					if err != nil {
						errs[w] = fmt.Errorf("epoch %d append %d: %w", epoch, i, err)
						return
					}
					acked[w] = append(acked[w], string(batch[0].Data))
					c = res.Cursor
				}
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		for _, r := range refused {
			if r {
				res.superseded++
			}
		}
		if !refused[0] && !broken {
			t.Fatalf("round %d: epoch 1 appended 300 times without being superseded", round)
		}
		if err := ordered(e.raw("acme", runID)); err != nil {
			res.violations++
			if !broken {
				t.Errorf("round %d: %v", round, err)
			}
			continue
		}
		got, _ := readAll(t, e.ctx, e.log, runID, 1000)
		seen := map[string]int{}
		for _, ev := range got {
			seen[string(ev.Data)]++
		}
		n := 0
		for w := range 3 {
			for _, d := range acked[w] {
				n++
				if seen[d] != 1 {
					t.Fatalf("round %d: acknowledged event %s read %d times", round, d, seen[d])
				}
			}
		}
		if len(got) < n {
			t.Fatalf("round %d: read %d events, fewer than the %d acknowledged", round, len(got), n)
		}
	}
	for _, r := range reps {
		res.collisions += r.ctr.ConditionFailures("PutItem")
	}
	return res
}

// TestLogForcedInterleaving forces the dangerous interleaving on two replicas: epoch 1
// appends, epoch 2 fences, then epoch 1 appends again at its stale cursor. The real log
// refuses (ErrSuperseded) and the chain stays ordered; the negative control, a log without
// the epoch check, stores epoch 1's event after the fence and the order check catches it.
func TestLogForcedInterleaving(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			e := newLogEnv(t)
			a, b := e.replica(broken), e.replica(false)
			c := mustAppend(t, e.ctx, a.log, "r", contract.Cursor{Epoch: 1, Next: 1}, evs(0, 1)).Cursor
			if _, err := b.log.Fence(e.ctx, "r", 2); err != nil {
				t.Fatal(err)
			}
			_, err := a.log.Append(e.ctx, "r", c, evs(1, 1))
			if n := a.ctr.ConditionFailures("PutItem"); n != 1 {
				t.Fatalf("epoch 1's stale append met %d occupied slots, want 1", n)
			}
			order := ordered(e.raw("acme", "r"))
			if !broken {
				wantErr(t, err, contract.ErrSuperseded, "stale append after the fence")
				if order != nil {
					t.Fatal(order)
				}
				return
			}
			if err != nil || order == nil {
				t.Fatalf("negative control: append err %v, order violation %v; want success and a violation", err, order)
			}
		})
	}
}
