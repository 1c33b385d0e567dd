package testkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
)

// RunAll proves a backend in one call (docs/design.md §10): every store suite
// (RunStoreSuites), then the operation suite (keepertest.RunOpsSuite: start, attach,
// cancel, finish, read, reclaim, snapshots against a counting provider), and the takeover,
// journal and reaper suites, which drive the keeper, the driver and the reaper over
// sandboxes from newProvider (a provider with a real shell, e.g. local-process).
func RunAll(t *testing.T, newBackend NewBackend, newProvider NewProvider) {
	t.Helper()
	RunStoreSuites(t, newBackend)
	t.Run("Operations", func(t *testing.T) {
		keepertest.RunOpsSuite(t, func(t *testing.T, o keepertest.Options) contract.Backend {
			return newBackend(t, Options(o))
		})
	})
	t.Run("Takeover", func(t *testing.T) { RunTakeoverConformance(t, newBackend, newProvider) })
	t.Run("Journal", func(t *testing.T) { RunJournalConformance(t, newProvider) })
	t.Run("Reaper", func(t *testing.T) { RunReaperConformance(t, newBackend, newProvider) })
}

// RunStoreSuites runs the suites of the contract's stores and of the reference parity
// helpers over them (refstore), each case on a fresh backend from newBackend.
func RunStoreSuites(t *testing.T, newBackend NewBackend) {
	t.Helper()
	t.Run("InstanceStore", func(t *testing.T) { RunInstanceStoreConformance(t, newBackend) })
	t.Run("RunStore", func(t *testing.T) { RunRunStoreConformance(t, newBackend) })
	t.Run("DurableRunFields", func(t *testing.T) { RunDurableRunFieldsConformance(t, newBackend) })
	t.Run("FencedRuns", func(t *testing.T) { RunFencedRunsConformance(t, newBackend) })
	t.Run("RunLister", func(t *testing.T) { RunRunListerConformance(t, newBackend) })
	t.Run("IntentStore", func(t *testing.T) { RunIntentStoreConformance(t, newBackend) })
	t.Run("ReaperSource", func(t *testing.T) { RunReaperSourceConformance(t, newBackend) })
	t.Run("LockStore", func(t *testing.T) { RunLockStoreConformance(t, newBackend) })
	t.Run("LeaseLocks", func(t *testing.T) { RunLeaseLocksConformance(t, newBackend) })
	t.Run("AppDriven", func(t *testing.T) { RunAppDrivenConformance(t, newBackend) })
	t.Run("EventLog", func(t *testing.T) { RunEventLogConformance(t, newBackend) })
	t.Run("Tenant", func(t *testing.T) { RunTenantConformance(t, newBackend) })
}

// cfCase is one conformance case; each runs on a fresh backend.
type cfCase struct {
	name string
	run  func(t *testing.T, b contract.Backend)
}

// cfDriverLease is the driver lease every suite of these files asks for, so expected
// reclaimAt values can be derived with contract.ReclaimAt.
const cfDriverLease = contract.DefaultDriverLease // ms

// cfOptions are the options of a case of these suites.
func cfOptions() Options {
	return Options{DriverLease: cfDriverLease * time.Millisecond}
}

// cfRunCases runs every case as a parallel subtest on its own fresh backend.
func cfRunCases(t *testing.T, newBackend NewBackend, cases []cfCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, fresh(t, newBackend, cfOptions()))
		})
	}
}

// cfNoErr fails the test now when err is not nil.
func cfNoErr(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: unexpected error: %v", what, err)
	}
}

// cfIs fails the test when err is not target, or is also one of the other sentinels
// (refusals must be distinguishable).
func cfIs(t *testing.T, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
	for _, other := range contract.Sentinels() {
		if other != target && errors.Is(err, other) {
			t.Fatalf("%s: error %v is %v as well as %v; refusals must be distinguishable", what, err, other, target)
		}
	}
}

// cfPollDeadline bounds every wait for an index that may lag. It is generous because
// parallel cases share two cores; it never decides a pass, only how long a failure takes.
const cfPollDeadline = 20 * time.Second

// cfNudgeTenant holds the one row the poller rewrites so that a backend emulating index lag
// in writes (not time) still converges; every global listing filters by tenant, and the
// row's updatedAt is far beyond any before/now a case uses.
const cfNudgeTenant = "testkit.nudge"

// cfEventually polls check until it reports ok, failing the test with the last observation
// at the deadline. An error from check fails at once: listings never fail transiently on a
// healthy backend.
func cfEventually(t *testing.T, b contract.Backend, what string, check func() (ok bool, got string, err error)) {
	t.Helper()
	deadline := time.Now().Add(cfPollDeadline)
	wait := time.Millisecond
	nudge := contract.InstanceRecord{Key: "nudge", Provider: "testkit", ProviderSandboxID: "nudge",
		ThreadID: "nudge", UpdatedAt: math.MaxInt64 / 2}
	for attempt := 1; ; attempt++ {
		ok, got, err := check()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not observed within %v (%d reads); last read: %s", what, cfPollDeadline, attempt, got)
		}
		if err := refstore.Instances(b.Instances()).Upsert(contract.WithTenant(t.Context(), cfNudgeTenant), nudge); err != nil {
			t.Fatalf("%s: nudge write: %v", what, err)
		}
		time.Sleep(wait) // polling back-off, not synchronisation: no signal exists for index lag
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// cfJSON renders v for failure messages.
func cfJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

// cfJSONEqual reports whether two JSON documents decode to deep-equal values (the
// round-trip bar for opaque documents: whitespace and key order are not content).
func cfJSONEqual(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// cfStrings renders a list of ids for messages.
func cfStrings(ids []string) string { return "[" + strings.Join(ids, " ") + "]" }

// cfSameStrings reports whether a and b hold the same elements in the same order.
func cfSameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// cfWantRead fails unless got, what call read for id, equals want by eq (nil = absent).
func cfWantRead[T any](t *testing.T, call, id string, got, want *T, eq func(a, b T) bool, what string) {
	t.Helper()
	switch {
	case want == nil && got != nil:
		t.Fatalf("%s: %s %q = %s, want absent", what, call, id, cfJSON(got))
	case want != nil && got == nil:
		t.Fatalf("%s: %s %q = absent, want %s", what, call, id, cfJSON(want))
	case want != nil && !eq(*got, *want):
		t.Fatalf("%s: %s %q =\n  %s\nwant\n  %s", what, call, id, cfJSON(got), cfJSON(want))
	}
}

// cfPtr returns a pointer to v.
func cfPtr[T any](v T) *T { return &v }

// cfBadTenants are tenants CheckTenant refuses: a key separator and one byte too long.
func cfBadTenants() []string {
	return []string{"bad#tenant", strings.Repeat("t", contract.MaxTenantLen+1), "a b"}
}
