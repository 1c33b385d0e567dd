// Package testkit is sandkeep's conformance kit (docs/design.md §10): exported suites, each one
// function taking *testing.T and a factory, that every backend must pass — the role
// gocloud.dev's drivertest plays for docstore. Optional capabilities are detected by type
// assertion; an absent one is reported by name (t.Skip naming it), never silently passed.
//
// A backend proves itself in one call, which runs the store suites, the operation suite
// (keepertest), and the takeover, journal and reaper suites:
//
//	func TestConformance(t *testing.T) {
//		testkit.RunAll(t, func(t *testing.T, o testkit.Options) contract.Backend {
//			return mybackend.New(...o...)
//		}, func(t *testing.T) contract.Provider { return localprocess.New(t.TempDir()) })
//	}
//
// Its lock store may implement RenewStaller (a wrapper built in the test) so the lease-loss
// cases run; without it they are skipped by name.
package testkit

import (
	"context"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Options are the settings a suite asks of a fresh backend. Factories must honour them.
type Options struct {
	// Lock is the lock timing; suites shorten it to observe lease loss quickly.
	Lock contract.LockTiming
	// DriverLease is the driver lease the backend derives reclaimAt with.
	DriverLease time.Duration
}

// NewBackend returns a fresh, isolated backend for one case (a new table, a new store).
type NewBackend func(t *testing.T, o Options) contract.Backend

// fresh returns a new backend from nb for one case, failing the case when the backend or
// one of its views is nil: every contract.Backend method is required (only the optional
// capabilities are skipped by name), so passing such a backend by skipping would hide it.
func fresh(t *testing.T, nb NewBackend, o Options) contract.Backend {
	t.Helper()
	b := nb(t, o)
	if b == nil {
		t.Fatal("the factory returned a nil backend")
	}
	for view, missing := range map[string]bool{
		"Instances": b.Instances() == nil, "Runs": b.Runs() == nil, "Locks": b.Locks() == nil,
		"Log": b.Log() == nil, "Intents": b.Intents() == nil, "Reaper": b.Reaper() == nil,
	} {
		if missing {
			t.Errorf("the backend's %s() is nil: every sandbox.Backend must provide it", view)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return b
}

// ctxFor returns a test context scoped to tenant, cancelled when the test ends.
func ctxFor(t *testing.T, tenant string) context.Context {
	return contract.WithTenant(t.Context(), tenant)
}
