package testkit_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// coreFactory returns fresh memstores honouring the suite's options, plus extra.
func coreFactory(extra ...memstore.Option) testkit.NewBackend {
	return func(t *testing.T, o testkit.Options) sandbox.Backend {
		return memstore.New(append([]memstore.Option{
			memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease),
		}, extra...)...)
	}
}

// coreSuites are the suites of instances.go, runs.go, fenced.go, intents.go and
// reapersource.go (the lock and event-log suites run in memstore_lock_log_test.go).
var coreSuites = []struct {
	name string
	run  func(*testing.T, testkit.NewBackend)
}{
	{"InstanceStore", testkit.RunInstanceStoreConformance},
	{"RunStore", testkit.RunRunStoreConformance},
	{"DurableRunFields", testkit.RunDurableRunFieldsConformance},
	{"FencedRuns", testkit.RunFencedRunsConformance},
	{"IntentStore", testkit.RunIntentStoreConformance},
	{"ReaperSource", testkit.RunReaperSourceConformance},
}

func TestMemstoreCoreConformance(t *testing.T) {
	for _, s := range coreSuites {
		t.Run(s.name, func(t *testing.T) { s.run(t, coreFactory()) })
	}
}

// TestMemstoreCoreConformanceWithIndexLag runs the same suites while every index answers
// as it stood a few writes ago: the suites must poll, and must never trust a stale hit.
func TestMemstoreCoreConformanceWithIndexLag(t *testing.T) {
	for _, s := range coreSuites {
		t.Run(s.name, func(t *testing.T) { s.run(t, coreFactory(memstore.WithIndexLag(3))) })
	}
}
