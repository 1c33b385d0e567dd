package testkit_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/provider/localprocess"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// localProvider is the provider factory of the journal, takeover and reaper suites: a
// local-process provider (real /bin/sh) rooted in the case's temp dir.
func localProvider(t *testing.T) sandbox.Provider {
	return localprocess.New(t.TempDir())
}

func TestJournalConformanceLocalProcess(t *testing.T) {
	testkit.RunJournalConformance(t, localProvider)
}

func TestTakeoverConformanceMemstore(t *testing.T) {
	testkit.RunTakeoverConformance(t, lkMemBackend, localProvider)
}

func TestTakeoverConformanceDynamostore(t *testing.T) {
	testkit.RunTakeoverConformance(t, lkDynamoBackend, localProvider)
}

func TestReaperConformanceMemstore(t *testing.T) {
	testkit.RunReaperConformance(t, lkMemBackend, localProvider)
}

func TestReaperConformanceMemstoreIndexLag(t *testing.T) {
	testkit.RunReaperConformance(t, func(t *testing.T, o testkit.Options) sandbox.Backend {
		return memstore.New(memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease), memstore.WithIndexLag(3))
	}, localProvider)
}

func TestReaperConformanceDynamostore(t *testing.T) {
	testkit.RunReaperConformance(t, lkDynamoBackend, localProvider)
}
