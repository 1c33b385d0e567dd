package faultrun_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/wire"
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

// noAfter is a poster that strips After from every message: a deliverer that never says
// where its batches begin, so a watcher cannot see that a post before one was lost.
type noAfter struct {
	push.Poster
	hits *atomic.Int64
}

func (p noAfter) Post(ctx context.Context, connID string, msg []byte) error {
	var m wire.PushMessage
	if err := json.Unmarshal(msg, &m); err == nil && m.After != nil {
		p.hits.Add(1)
		m.After = nil
		msg, _ = json.Marshal(m)
	}
	return p.Poster.Post(ctx, connID, msg)
}

// TestFaultRunPushNegativeControl runs the push items over a deliverer whose messages do
// not say where they begin: the throttled posts leave holes the watchers never see, and
// the final checks must find watchers missing events.
func TestFaultRunPushNegativeControl(t *testing.T) {
	store := memstore.New()
	var hits atomic.Int64
	var backends []contract.Backend
	for range 4 {
		backends = append(backends, store)
	}
	res, err := faultrun.Run(t.Context(), faultrun.Config{Seed: 5, Tenant: "fault", Replicas: backends, Clean: store,
		Ops: 500, Step: step, DriverLease: driverLease, Push: true,
		PushPoster: func(p push.Poster) push.Poster { return noAfter{p, &hits} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("messages stripped: %d; %d violations; push %+v", hits.Load(), len(res.Violations), res.Push)
	if hits.Load() == 0 {
		t.Fatal("no message was stripped: the control proves nothing")
	}
	missing := 0
	for _, v := range res.Violations {
		if len(v) > 5 && v[:5] == "push:" {
			missing++
			if missing == 1 {
				t.Logf("caught: %s", v)
			}
		}
	}
	if missing == 0 {
		t.Errorf("the push checks missed a deliverer whose messages do not say where they begin: %v", res.Violations)
	}
}

// TestDynamoFaultRunPush runs the push items on dynalite through the fault proxy: the
// push's own store calls (connections, subscriptions) meet the same throttles, 5xx and
// lost responses as the rest. A connection answered 410 whose removal failed under a
// fault stays until its TTL, so only most must be gone.
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
