package faultrun_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
)

// Virtual timing of the runs with sweeps: the workload's clock advances step per
// operation, so driver leases lapse, detached runs pass the TTL and idle rows age within
// a short run (all in the keepers' and the reaper's clock; lock leases stay real).
const (
	step        = 100 * time.Millisecond
	driverLease = 4 * time.Second
	detachedTTL = 3 * time.Second
	retention   = 6 * time.Second
)

// sweeps tallies what the reaper's sweeps did across a run.
type sweeps struct {
	mu       sync.Mutex
	n, busy  int
	outcomes map[string]int
	swept    reaper.Swept
}

// hook returns the workload's Sweep: one reaper sweep over the replica's backend.
func (s *sweeps) hook(t *testing.T) func(ctx context.Context, b contract.Backend, p contract.Provider, now func() time.Time) error {
	return func(ctx context.Context, b contract.Backend, p contract.Provider, now func() time.Time) error {
		k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{p},
			DriverLease: driverLease, ReclaimMargin: time.Millisecond, Now: now, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Error(err)
			return err
		}
		r, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: detachedTTL,
			InstanceRetention: retention, LockLease: 2 * time.Second})
		if err != nil {
			t.Error(err)
			return err
		}
		rep, err := r.Sweep(ctx)
		s.mu.Lock()
		defer s.mu.Unlock()
		if errors.Is(err, reaper.ErrBusy) {
			s.busy++
			return nil
		}
		s.n++
		for k, v := range rep.OutcomeCounts() {
			s.outcomes[k] += v
		}
		w := &s.swept
		w.Lapsed += rep.Swept.Lapsed
		w.Stale += rep.Swept.Stale
		w.PendingReclaims += rep.Swept.PendingReclaims
		w.IdleReclaimed += rep.Swept.IdleReclaimed
		w.IdleInUse += rep.Swept.IdleInUse
		w.IntentsDropped += rep.Swept.IntentsDropped
		w.OrphansDestroyed += rep.Swept.OrphansDestroyed
		return err
	}
}

func newSweeps() *sweeps { return &sweeps{outcomes: map[string]int{}} }

// report logs the sweeps and asserts the reaper acted on something.
func (s *sweeps) report(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("sweeps: %d (%d busy), outcomes %v, swept %+v", s.n, s.busy, s.outcomes, s.swept)
	acted := s.outcomes["expired"] + s.outcomes["finalized"] + s.swept.Lapsed + s.swept.IdleReclaimed + s.swept.OrphansDestroyed
	if s.n == 0 || acted == 0 {
		t.Errorf("the reaper acted on nothing in %d sweeps: its paths were not exercised", s.n)
	}
}
