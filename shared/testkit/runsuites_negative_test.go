package testkit_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// The negative controls of the takeover, reaper and tenant suites: each re-runs one suite in a
// subprocess against a memstore broken in the one way a case exists to catch, and the
// case must fail there (while passing against the correct store in runsuites_test.go).

// brokenSuiteEnv names the defect a TestBrokenRunSuite* subprocess injects.
const brokenSuiteEnv = "TESTKIT_RUN_SUITE_DEFECT"

// brokenBackend is memstore with one defect: its run store or its event log is wrapped.
type brokenBackend struct {
	*memstore.Store
	defect string
	log    *unfencedLog
}

// nilViews: the defect under which the required views the store suites fetch are nil.
const nilViews = "nil-required-views"

// Runs returns the run store, broken by the defects that concern it.
func (b brokenBackend) Runs() contract.FencedRuns {
	if b.defect == nilViews {
		return nil
	}
	return brokenRuns{FencedRuns: b.Store.Runs(), defect: b.defect}
}

// Log returns the event log, without its epoch fence under "log-no-epoch-fence".
func (b brokenBackend) Log() contract.EventLog {
	if b.defect == "log-no-epoch-fence" {
		return b.log
	}
	return b.Store.Log()
}

// Instances returns the instance map; under "no-tenant-is-empty" a context without a
// tenant is served as the empty tenant (the silent default the tenant suite forbids).
func (b brokenBackend) Instances() contract.InstanceRows {
	if b.defect == nilViews {
		return nil
	}
	if b.defect == "no-tenant-is-empty" {
		return defaultTenantRows{b.Store.Instances()}
	}
	return b.Store.Instances()
}

// Intents returns the intent store; under "empty-tenant-is-shared" the empty tenant's
// intents are tenant-a's (a crossing the tenant suite must catch).
func (b brokenBackend) Intents() contract.IntentStore {
	if b.defect == nilViews {
		return nil
	}
	if b.defect == "empty-tenant-is-shared" {
		return sharedEmptyIntents{b.Store.Intents()}
	}
	return b.Store.Intents()
}

// Reaper returns the reaper source (nil under nilViews).
func (b brokenBackend) Reaper() contract.ReaperSource {
	if b.defect == nilViews {
		return nil
	}
	return b.Store.Reaper()
}

type defaultTenantRows struct{ contract.InstanceRows }

func emptyIfNone(ctx context.Context) context.Context {
	if _, err := contract.Tenant(ctx); errors.Is(err, contract.ErrNoTenant) {
		return contract.WithTenant(ctx, "")
	}
	return ctx
}

func (r defaultTenantRows) GetRow(ctx context.Context, key string) (*contract.InstanceRow, error) {
	return r.InstanceRows.GetRow(emptyIfNone(ctx), key)
}

func (r defaultTenantRows) CreateRow(ctx context.Context, rec contract.InstanceRecord, incarnation string) error {
	return r.InstanceRows.CreateRow(emptyIfNone(ctx), rec, incarnation)
}

type sharedEmptyIntents struct{ contract.IntentStore }

func aIfEmpty(ctx context.Context) context.Context {
	if t, err := contract.Tenant(ctx); err == nil && t == "" {
		return contract.WithTenant(ctx, "tenant-a")
	}
	return ctx
}

func (i sharedEmptyIntents) Put(ctx context.Context, key string, token, now int64) error {
	return i.IntentStore.Put(aIfEmpty(ctx), key, token, now)
}

func (i sharedEmptyIntents) Get(ctx context.Context, key string) (*contract.Intent, error) {
	return i.IntentStore.Get(aIfEmpty(ctx), key)
}

type brokenRuns struct {
	contract.FencedRuns
	defect string
}

// Claim under "claim-ignores-cond" drops the reaper's listed detachedSince (and cutoff
// and cancel) condition: a claim that cannot tell a returning viewer from a detached run.
func (r brokenRuns) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	if r.defect == "claim-ignores-cond" {
		c.If = contract.ClaimCond{}
	}
	return r.FencedRuns.Claim(ctx, runID, c)
}

// Lapse under "lapse-ignores-lease" lapses whatever lease the run holds now: a heartbeat
// that renewed the lease after the reaper read it no longer saves the run.
func (r brokenRuns) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	if r.defect == "lapse-ignores-lease" {
		if st, err := r.FencedRuns.State(ctx, runID); err == nil && st != nil {
			epoch, leaseUntil = st.Epoch(), st.LeaseUntil
		}
	}
	return r.FencedRuns.Lapse(ctx, runID, epoch, leaseUntil)
}

// RunsUsingKey under "in-use-ignores-index" lists nothing: every in-use check built on it
// finds the sandbox free.
func (r brokenRuns) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	if r.defect == "in-use-ignores-index" {
		return nil, nil
	}
	return r.FencedRuns.RunsUsingKey(ctx, key)
}

// unfencedLog is memstore's log without the epoch fence: an append from an epoch lower than
// one that fenced is stored anyway, at the first free offset (as the fencer's tail).
type unfencedLog struct {
	contract.EventLog
	mu    sync.Mutex
	fence map[string]int64 // tenant#run → highest epoch that fenced
}

// fenceKey is runID's key under ctx's tenant; a context without a tenant (refused by
// every real store) gets a key no tenant has.
func fenceKey(ctx context.Context, runID string) string {
	t, err := contract.Tenant(ctx)
	if err != nil {
		return "!#" + runID
	}
	return t + "#" + runID
}

func (l *unfencedLog) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	res, err := l.EventLog.Fence(ctx, runID, epoch)
	if err == nil {
		k := fenceKey(ctx, runID)
		l.mu.Lock()
		l.fence[k] = max(l.fence[k], epoch)
		l.mu.Unlock()
	}
	return res, err
}

func (l *unfencedLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	l.mu.Lock()
	top := l.fence[fenceKey(ctx, runID)]
	l.mu.Unlock()
	if at.Epoch >= top {
		return l.EventLog.Append(ctx, runID, at, events)
	}
	tail, err := l.EventLog.Fence(ctx, runID, top) // the owner's cursor at the tail
	if err != nil {
		return contract.AppendResult{}, err
	}
	res, err := l.EventLog.Append(ctx, runID, tail.Cursor, events)
	res.Cursor.Epoch = at.Epoch // the stale writer keeps writing as itself
	return res, err
}

// brokenSuite runs suite against the store broken by brokenSuiteEnv; skipped outside the
// subprocess TestRunSuiteNegativeControls starts.
func brokenSuite(t *testing.T, suite func(*testing.T, testkit.NewBackend, testkit.NewProvider)) {
	defect := os.Getenv(brokenSuiteEnv)
	if defect == "" {
		t.Skip("run only by TestRunSuiteNegativeControls, as a subprocess")
	}
	suite(t, func(t *testing.T, o testkit.Options) contract.Backend {
		s := memstore.New(memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease))
		return brokenBackend{Store: s, defect: defect, log: &unfencedLog{EventLog: s.Log(), fence: map[string]int64{}}}
	}, localProvider)
}

func TestBrokenRunSuiteTakeover(t *testing.T) { brokenSuite(t, testkit.RunTakeoverConformance) }

func TestBrokenRunSuiteReaper(t *testing.T) { brokenSuite(t, testkit.RunReaperConformance) }

func TestBrokenTenantSuite(t *testing.T) {
	brokenSuite(t, func(t *testing.T, nb testkit.NewBackend, _ testkit.NewProvider) { testkit.RunTenantConformance(t, nb) })
}

// TestBrokenRequiredViews runs the store suites whose cases fetch a required view.
func TestBrokenRequiredViews(t *testing.T) {
	brokenSuite(t, func(t *testing.T, nb testkit.NewBackend, _ testkit.NewProvider) {
		t.Run("fenced", func(t *testing.T) { testkit.RunFencedRunsConformance(t, nb) })
		t.Run("instances", func(t *testing.T) { testkit.RunInstanceStoreConformance(t, nb) })
		t.Run("intents", func(t *testing.T) { testkit.RunIntentStoreConformance(t, nb) })
		t.Run("reaper-source", func(t *testing.T) { testkit.RunReaperSourceConformance(t, nb) })
	})
}

// TestNilRequiredViewsFail: a backend whose Runs, Instances, Intents or Reaper is nil fails
// the store suites; none of their cases passes it by skipping (only optional capabilities
// are skipped by name).
func TestNilRequiredViewsFail(t *testing.T) {
	if os.Getenv(brokenSuiteEnv) != "" {
		t.Skip("already inside a negative-control subprocess")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestBrokenRequiredViews$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), brokenSuiteEnv+"="+nilViews)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("a backend with nil required views passed the store suites (err %v); output:\n%s", err, out)
	}
	for _, suite := range []string{"fenced", "instances", "intents", "reaper-source"} {
		if !regexp.MustCompile(`--- FAIL: TestBrokenRequiredViews/` + suite + ` `).Match(out) {
			t.Errorf("suite %s did not fail with nil required views", suite)
		}
	}
	if bytes.Contains(out, []byte("--- SKIP: TestBrokenRequiredViews/")) || bytes.Contains(out, []byte("panic:")) {
		t.Errorf("a case skipped or panicked instead of failing; output tail:\n%s", out[max(0, len(out)-3000):])
	}
}

// TestRunSuiteNegativeControls proves the takeover, reaper and tenant suites have teeth: each
// deliberately broken store makes the named case fail (the test binary re-runs itself with
// the defect switched on, limited to that case so it costs one case's time).
func TestRunSuiteNegativeControls(t *testing.T) {
	if os.Getenv(brokenSuiteEnv) != "" {
		t.Skip("already inside a negative-control subprocess")
	}
	controls := []struct {
		defect, test, prefix string // prefix: the case's number, as in its name
		mustFail             string // the case name as go test prints it
	}{
		{"claim-ignores-cond", "TestBrokenRunSuiteReaper", "R11",
			"R11_a_viewer_re-attaching_between_listing_and_claim_keeps_driving"},
		{"lapse-ignores-lease", "TestBrokenRunSuiteReaper", "R15",
			"R15_a_lapsed_lease_is_detached_then_expired;_a_late_heartbeat_keeps_its_run"},
		{"in-use-ignores-index", "TestBrokenRunSuiteReaper", "R16",
			"R16_a_sandbox_shared_with_a_live_run_is_kept_running_by_the_in-use_check_alone,_its_row_idle"},
		{"log-no-epoch-fence", "TestBrokenRunSuiteTakeover", "T6",
			"T6_of_two_concurrent_drivers_the_loser_appends_nothing_after_the_fence"},
		{"no-tenant-is-empty", "TestBrokenTenantSuite", "a_context",
			"a_context_without_a_tenant_is_ErrNoTenant_on_every_call_and_writes_nothing"},
		{"empty-tenant-is-shared", "TestBrokenTenantSuite", "the_explicit",
			"the_explicit_empty_tenant_works_and_never_crosses_another"},
	}
	for _, c := range controls {
		t.Run(c.defect, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+c.test+"$/^"+c.prefix+"_", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenSuiteEnv+"="+c.defect)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("the store broken by %s passed %s/%s (err %v); output:\n%s", c.defect, c.test, c.prefix, err, out)
			}
			re := regexp.MustCompile(`--- FAIL: ` + regexp.QuoteMeta(c.test+"/"+c.mustFail) + ` `)
			if !re.Match(out) {
				t.Fatalf("%s did not fail case %q under %s; output tail:\n%s", c.test, c.mustFail, c.defect, out[max(0, len(out)-3000):])
			}
			// The failure's own words, for the record: what the defect broke.
			for _, line := range bytes.Split(out, []byte("\n")) {
				if bytes.Contains(line, []byte(".go:")) && !bytes.Contains(line, []byte("---")) {
					t.Logf("%s: %s", c.defect, bytes.TrimSpace(line))
				}
			}
		})
	}
}
