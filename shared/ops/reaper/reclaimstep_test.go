package reaper_test

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// TestLapseWaitsForTheLeasesStep: a silent driver's run is met by the sweep whose now has
// reached its reclaimAt (the lease's end rounded up to a whole driver lease), not by one
// between the lease's end and that step, and the lapse it then stamps is the exact lease
// end (so the detached TTL counts from there, not from the step), on both backends.
func TestLapseWaitsForTheLeasesStep(t *testing.T) {
	worlds := map[string]func(t *testing.T) *world{
		"memstore": func(t *testing.T) *world { return newWorld(t, memstore.New(), localprocess.New(t.TempDir())) },
		"dynamodb": func(t *testing.T) *world { w, _ := dynamoWorld(t, localprocess.New(t.TempDir())); return w },
	}
	for name, newW := range worlds {
		t.Run(name, func(t *testing.T) {
			w := newW(t)
			id := w.id("silent")
			res := w.start(id, id+"-t")
			step := int64(contract.DefaultDriverLease)                            // the world's keeper and stores: reclaimAt's step
			at := contract.LeaseReclaimAt(time.Now().UnixMilli(), step) + 10*step // a step's end well ahead
			lease := at - step/2                                                  // the driver's last renewal ends mid-step
			if _, err := w.b.Runs().Heartbeat(w.ctx, id, res.Driver.Epoch, lease); err != nil {
				t.Fatal(err)
			}
			sweepAt := func(now int64) reaper.Report {
				t.Helper()
				rp := w.reaper(0, nil, func(c *reapCfg) {
					c.K.Now = func() time.Time { return time.UnixMilli(now) }
					c.IdleStop = -1
				})
				rep, err := rp.Sweep(w.ctx)
				if err != nil {
					t.Fatalf("sweep at %d: %v (report %+v)", now, err, rep)
				}
				return rep
			}
			state := func() contract.RunState {
				t.Helper()
				st, err := w.b.Runs().State(w.ctx, id)
				if err != nil || st == nil {
					t.Fatalf("state: %+v, %v", st, err)
				}
				return *st
			}

			if rep := sweepAt(at - 1); rep.Swept.Lapsed != 0 || rep.Considered != 0 {
				t.Fatalf("a sweep past the lease (%d) but before its step (%d): %+v; want the run not met yet", lease, at, rep)
			}
			if st := state(); st.DetachedSince != nil || st.Lapsed {
				t.Fatalf("the run was lapsed before its step: %+v", st)
			}
			if rep := sweepAt(at); rep.Swept.Lapsed != 1 {
				t.Fatalf("the sweep at its step (%d): %+v; want the run lapsed", at, rep)
			}
			if st := state(); st.DetachedSince == nil || *st.DetachedSince != lease || !st.Lapsed || st.Epoch() != res.Driver.Epoch {
				t.Fatalf("lapsed run %+v; want detached since the exact lease end %d, lapsed, epoch kept", st, lease)
			}
		})
	}
}
