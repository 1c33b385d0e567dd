package faultrun_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/faultrun"
)

// pushReport logs the push items' counts and fails when the faults they exist for were
// never met: drops and resumes, 410s, throttled and lost posts, slow consumers. (A
// repeated post, Dropped, needs a later write to the run and is only reported.)
func pushReport(t *testing.T, res *faultrun.Result) {
	t.Helper()
	p := res.Push
	t.Logf("push: %+v", p)
	if p.Watchers == 0 || p.Resumes == 0 || p.Delivered == 0 || p.Answered410 == 0 || p.Throttled == 0 || p.LostAnswers == 0 || p.Slow == 0 {
		t.Errorf("push items not exercised: %+v", p)
	}
}

// TestMemstoreFaultRunPush runs the workload with the push items on memstore: watchers
// subscribe, their connections drop mid-stream (and by a slow consumer's cut) and resume
// from their last offset, posts fail or lose their answers; every watcher ends with its
// run's whole log, every event once, and every connection answered 410 is removed.
func TestMemstoreFaultRunPush(t *testing.T) {
	store := memstore.New(memstore.WithIndexLag(2))
	var backends []contract.Backend
	var faults []*faultrun.Faults
	for i := range 6 {
		backends = append(backends, store)
		faults = append(faults, faultrun.NewFaults(uint64(2100+i), 0.04, 0.03))
	}
	res, err := faultrun.Run(t.Context(), faultrun.Config{
		Seed: uint64(envInt("FAULTRUN_SEED", 21)), Tenant: "fault", Replicas: backends, Faults: faults,
		Clean: store, Ops: envInt("FAULTRUN_OPS", 1200), Logf: t.Logf, Step: step, DriverLease: driverLease, Push: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	report(t, res)
	pushReport(t, res)
	if res.Push.Kept410 != 0 {
		t.Errorf("%d of %d connections answered 410 are still open", res.Push.Kept410, res.Push.Answered410)
	}
}

// skipAhead is a push store whose Advance records one offset past what was delivered (a
// deliverer's off-by-one): the next delivery skips an event, which the watcher never sees.
type skipAhead struct {
	*memstore.Store
	hits *atomic.Int64
}

func (s skipAhead) Advance(ctx context.Context, runID, connID, holder string, next, heldUntil int64, release bool) (bool, error) {
	if next > 0 {
		s.hits.Add(1)
		next++
	}
	return s.Store.Advance(ctx, runID, connID, holder, next, heldUntil, release)
}

// TestFaultRunPushNegativeControl runs the push items over a deliverer whose progress
// skips an offset: the final checks must find watchers missing events.
func TestFaultRunPushNegativeControl(t *testing.T) {
	store := memstore.New()
	var hits atomic.Int64
	bad := skipAhead{store, &hits}
	var backends []contract.Backend
	for range 4 {
		backends = append(backends, bad)
	}
	res, err := faultrun.Run(t.Context(), faultrun.Config{Seed: 5, Tenant: "fault", Replicas: backends, Clean: store,
		Ops: 500, Step: step, DriverLease: driverLease, Push: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broken advances: %d; %d violations; push %+v", hits.Load(), len(res.Violations), res.Push)
	if hits.Load() == 0 {
		t.Fatal("the broken advance was never hit: the control proves nothing")
	}
	missing := 0
	for _, v := range res.Violations {
		if len(v) > 5 && v[:5] == "push:" {
			missing++
		}
	}
	if missing == 0 {
		t.Errorf("the push checks missed a deliverer that skips an offset: %v", res.Violations)
	}
}

// TestDynamoFaultRunPush runs the push items on dynalite through the fault proxy: the
// push's own store calls (connections, subscriptions, holds, flags) meet the same
// throttles, 5xx and lost responses as the rest. A connection answered 410 whose removal
// failed under a fault stays until its TTL, so only most must be gone.
func TestDynamoFaultRunPush(t *testing.T) {
	seed := uint64(envInt("FAULTRUN_SEED", 21))
	reps, clean, proxy := dynamoReplicas(t, 4, seed)
	injectFaults(proxy, 0.5)
	res, err := faultrun.Run(t.Context(), faultrun.Config{
		Seed: seed, Tenant: "fault", Replicas: reps, Clean: clean, Ops: envInt("FAULTRUN_OPS", 500), Logf: t.Logf,
		Step: step, DriverLease: driverLease, Push: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	report(t, res)
	pushReport(t, res)
	if 2*res.Push.Kept410 > res.Push.Answered410 {
		t.Errorf("%d of %d connections answered 410 are still open", res.Push.Kept410, res.Push.Answered410)
	}
}
