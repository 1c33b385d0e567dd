package testkit_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/memstore/memstoretest"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// lkMemBackend is the memstore factory of these suites: a fresh store per case, honouring
// the lock timing and driver lease the case asks for, renewals stallable at its lease table.
func lkMemBackend(t *testing.T, o testkit.Options) sandbox.Backend {
	return memstoretest.New(memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease))
}

func TestMemstoreLockStoreConformance(t *testing.T) {
	testkit.RunLockStoreConformance(t, lkMemBackend)
}

func TestMemstoreEventLogConformance(t *testing.T) {
	testkit.RunEventLogConformance(t, lkMemBackend)
}
