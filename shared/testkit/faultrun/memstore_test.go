package faultrun_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/faultrun"
)

// envInt reads a scale knob (e.g. FAULTRUN_OPS) for longer local runs.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestMemstoreFaultRun(t *testing.T) {
	store := memstore.New(memstore.WithIndexLag(2))
	reps := envInt("FAULTRUN_REPLICAS", 8)
	var backends []contract.Backend
	var faults []*faultrun.Faults
	for i := range reps {
		backends = append(backends, store)
		faults = append(faults, faultrun.NewFaults(uint64(1000+i), 0.04, 0.03))
	}
	sw := newSweeps()
	res, err := faultrun.Run(t.Context(), faultrun.Config{
		Seed: uint64(envInt("FAULTRUN_SEED", 7)), Tenant: "fault", Replicas: backends, Faults: faults,
		Clean: store, Ops: envInt("FAULTRUN_OPS", 1500), Logf: t.Logf,
		Sweep: sw.hook(t), Step: step, DriverLease: driverLease,
	})
	if err != nil {
		t.Fatal(err)
	}
	report(t, res)
	sw.report(t)
	var lost, failed int64
	for _, f := range faults {
		lost += f.Lost()
		failed += f.Failed()
	}
	t.Logf("faults: %d lost responses, %d failed calls", lost, failed)
	for _, kind := range []faultrun.Kind{faultrun.KindRun, faultrun.KindLog, faultrun.KindLock} {
		v := faultrun.Check(res.Recorder.Ops(), kind, 30*time.Second)
		t.Logf("porcupine %s: %s (%d ops, %d ambiguous, %d partitions) in %v", v.Model, v.Result, v.Ops, v.Ambiguous, v.Partitions, v.Took)
		if v.Result != "Ok" {
			t.Errorf("porcupine %s: %s in %v", kind, v.Result, v.Illegal)
			faultrun.DumpIllegal(res.Recorder.Ops(), v.Illegal)
		}
	}
}

func report(t *testing.T, res *faultrun.Result) {
	t.Helper()
	t.Logf("%d ops in %v over %d runs, %d events; superseded %d, take-overs %d, ambiguous %d, lock waits %d",
		res.Ops, res.Duration, res.Runs, res.Events, res.Superseded, res.TakeOvers, res.Ambiguous, res.LockWaits)
	t.Logf("outcomes: %v", res.ByOutcome)
	t.Logf("provider: %+v", res.Provider.Counts())
	t.Logf("slowest: %v", res.Slowest)
	for _, v := range res.Violations {
		t.Errorf("violation: %s", v)
	}
}

// TestMemstoreFaultRunNegativeControl runs the workload over a store that drops the fence:
// porcupine must find both histories illegal and the invariant checks must fire.
func TestMemstoreFaultRunNegativeControl(t *testing.T) {
	store := memstore.New()
	bad := newBroken(store)
	var backends []contract.Backend
	for range 8 {
		backends = append(backends, bad)
	}
	res, err := faultrun.Run(t.Context(), faultrun.Config{Seed: 11, Tenant: "fault", Replicas: backends, Clean: store, Ops: 600})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("broken paths hit: %d appends, %d fenced writes; %d violations", bad.logHits.Load(), bad.runHits.Load(), len(res.Violations))
	if bad.logHits.Load() == 0 || bad.runHits.Load() == 0 {
		t.Fatal("the broken paths were never hit: the control proves nothing")
	}
	if len(res.Violations) == 0 {
		t.Error("the invariant checks missed a store that drops the fence")
	}
	for _, kind := range []faultrun.Kind{faultrun.KindRun, faultrun.KindLog} {
		v := faultrun.Check(res.Recorder.Ops(), kind, 30*time.Second)
		t.Logf("porcupine %s: %s (%d ops) in %v", kind, v.Result, v.Ops, v.Took)
		if v.Result != "Illegal" {
			t.Errorf("porcupine %s: %s, want Illegal", kind, v.Result)
		}
	}
}
