package faultrun_test

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/faultrun"
)

// writes matches the DynamoDB write operations (the ones a lost response makes ambiguous).
func writes(op string, _ []byte) bool {
	return op == "PutItem" || op == "UpdateItem" || op == "DeleteItem"
}

// dynamoReplicas starts a fault proxy in front of the engine and returns n stores, each
// over its own SDK client pointed at the proxy, plus a clean store talking to the engine.
func dynamoReplicas(t *testing.T, n int, seed uint64) (reps []contract.Backend, clean *dynamostore.Store, proxy *dynamotest.Proxy) {
	t.Helper()
	ep := dynamotest.Endpoint(t)
	direct := dynamotest.NewClient(ep)
	table := dynamotest.FreshTable(t, direct)
	proxy = dynamotest.NewProxy(ep)
	t.Cleanup(proxy.Close)
	proxy.Seed(seed)
	for i := range n {
		// Half the replicas give up after two attempts, so some store calls fail after a
		// write landed and the keeper's own retry (same token) has to recognise it.
		attempts := faultrun.MaxBurn
		if i%2 == 1 {
			attempts = 2
		}
		c := dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(attempts), faultrun.CountAttempts)
		reps = append(reps, dynamostore.New(dynamostore.Config{Client: c, Table: table}))
	}
	return reps, dynamostore.New(dynamostore.Config{Client: direct, Table: table}), proxy
}

// injectFaults installs the fault mix on a seeded random fraction of requests.
func injectFaults(p *dynamotest.Proxy, scale float64) {
	p.Inject(dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Match: writes, Probability: 0.03 * scale})
	p.Inject(dynamotest.Fault{Kind: dynamotest.ApplyThenDrop, Match: writes, Probability: 0.01 * scale, As500: true})
	p.Inject(dynamotest.Fault{Kind: dynamotest.Throttle, Probability: 0.03 * scale})
	p.Inject(dynamotest.Fault{Kind: dynamotest.ServerError, Probability: 0.02 * scale})
	p.Inject(dynamotest.Fault{Kind: dynamotest.Delay, Probability: 0.04 * scale, Delay: 3 * time.Millisecond})
	p.Inject(dynamotest.Fault{Kind: dynamotest.Delay, Probability: 0.01 * scale, Delay: 40 * time.Millisecond})
}

// TestDynamoFaultRun runs the randomized workload with ≥ 8 replicas against dynalite
// through the fault proxy and checks every invariant and every porcupine model.
func TestDynamoFaultRun(t *testing.T) {
	seed := uint64(envInt("FAULTRUN_SEED", 7))
	reps, clean, proxy := dynamoReplicas(t, envInt("FAULTRUN_REPLICAS", 8), seed)
	injectFaults(proxy, 1)
	sw := newSweeps()
	res, err := faultrun.Run(t.Context(), faultrun.Config{
		Seed: seed, Tenant: "fault", Replicas: reps, Clean: clean, Ops: envInt("FAULTRUN_OPS", 1000), Logf: t.Logf,
		Sweep: sw.hook(t), Step: step, DriverLease: driverLease,
	})
	if err != nil {
		t.Fatal(err)
	}
	report(t, res)
	sw.report(t)
	var total int64
	for _, k := range []dynamotest.FaultKind{dynamotest.ApplyThenDrop, dynamotest.Throttle, dynamotest.ServerError, dynamotest.Delay} {
		n := proxy.Injected(k)
		total += n
		t.Logf("faults: %s %d", k, n)
		if n == 0 {
			t.Errorf("no %s fault was injected", k)
		}
	}
	t.Logf("faults: %d injected over %d forwarded requests", total, proxy.Forwarded())
	if res.Superseded == 0 || res.TakeOvers == 0 {
		t.Errorf("dangerous paths not hit: superseded %d, take-overs %d", res.Superseded, res.TakeOvers)
	}
	for _, kind := range []faultrun.Kind{faultrun.KindRun, faultrun.KindLog, faultrun.KindLock} {
		v := faultrun.Check(res.Recorder.Ops(), kind, 30*time.Second)
		t.Logf("porcupine %s: %s (%d ops, %d ambiguous, %d partitions) in %v", v.Model, v.Result, v.Ops, v.Ambiguous, v.Partitions, v.Took)
		if v.Result != "Ok" {
			t.Errorf("porcupine %s: %s in %v", kind, v.Result, v.Illegal)
			faultrun.DumpIllegal(res.Recorder.Ops(), v.Illegal)
		}
	}
}

// TestDynamoFaultRunNegativeControl runs the workload over dynamostore replicas wrapped to
// drop the fence: porcupine must find the histories illegal and the invariants must fire.
func TestDynamoFaultRunNegativeControl(t *testing.T) {
	reps, clean, proxy := dynamoReplicas(t, 8, 3)
	injectFaults(proxy, 0.5)
	var bads []broken
	for i, r := range reps {
		bads = append(bads, newBroken(r))
		reps[i] = bads[i]
	}
	res, err := faultrun.Run(t.Context(), faultrun.Config{Seed: 3, Tenant: "fault", Replicas: reps, Clean: clean, Ops: 300})
	if err != nil {
		t.Fatal(err)
	}
	var logHits, runHits int64
	for _, b := range bads {
		logHits += b.logHits.Load()
		runHits += b.runHits.Load()
	}
	t.Logf("broken paths hit: %d appends, %d fenced writes; %d violations", logHits, runHits, len(res.Violations))
	if logHits == 0 || runHits == 0 {
		t.Fatal("the broken paths were never hit: the control proves nothing")
	}
	if len(res.Violations) == 0 {
		t.Error("the invariant checks missed a store that drops the fence")
	}
	for _, kind := range []faultrun.Kind{faultrun.KindRun, faultrun.KindLog} {
		v := faultrun.Check(res.Recorder.Ops(), kind, 30*time.Second)
		t.Logf("porcupine %s: %s (%d ops, %d ambiguous) in %v", kind, v.Result, v.Ops, v.Ambiguous, v.Took)
		if v.Result != "Illegal" {
			t.Errorf("porcupine %s: %s, want Illegal", kind, v.Result)
		}
	}
}
