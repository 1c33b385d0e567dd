package testkit_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// coreFactory returns fresh memstores honouring the suite's options, plus extra.
func coreFactory(extra ...memstore.Option) testkit.NewBackend {
	return func(t *testing.T, o testkit.Options) contract.Backend {
		return memstore.New(append([]memstore.Option{
			memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease),
		}, extra...)...)
	}
}

// mutantEnv names the defect a TestMutant* subprocess injects.
const mutantEnv = "TESTKIT_CORE_MUTANT"

// mutant is memstore with one deliberate defect injected by wrapping a store.
type mutant struct {
	*memstore.Store
	knob string
}

// Instances returns the instance map, broken when the knob says so.
func (m mutant) Instances() contract.InstanceRows {
	if m.knob == "merge-upsert" {
		return testkit.MergeUpsertRows(m.Store.Instances())
	}
	return mutantRows{InstanceRows: m.Store.Instances(), knob: m.knob}
}

// Runs returns the run store, broken when the knob says so.
func (m mutant) Runs() contract.FencedRuns {
	if m.knob == "update-ignores-clear" {
		return testkit.KeepDurableRuns(m.Store.Runs())
	}
	return mutantRuns{FencedRuns: m.Store.Runs(), knob: m.knob}
}

type mutantRows struct {
	contract.InstanceRows
	knob string
}

// Upsert is the reference's ("merge-upsert" is testkit.MergeUpsertRows).
func (r mutantRows) Upsert(ctx context.Context, rec contract.InstanceRecord) error {
	return refstore.Instances(r.InstanceRows).Upsert(ctx, rec)
}

// Get and Delete are the reference's, so that refstore.Instances uses this store's
// (broken) Upsert beside them.
func (r mutantRows) Get(ctx context.Context, key string) (*contract.InstanceRecord, error) {
	return refstore.Instances(r.InstanceRows).Get(ctx, key)
}

func (r mutantRows) Delete(ctx context.Context, key string) error {
	return refstore.Instances(r.InstanceRows).Delete(ctx, key)
}

// CreateRow under "create-no-token" refuses whenever a row exists, never recognising its
// own landed attempt.
func (r mutantRows) CreateRow(ctx context.Context, rec contract.InstanceRecord, incarnation string) error {
	if r.knob == "create-no-token" {
		if old, err := r.InstanceRows.GetRow(ctx, rec.Key); err == nil && old != nil {
			return contract.ErrConflict
		}
	}
	return r.InstanceRows.CreateRow(ctx, rec, incarnation)
}

type mutantRuns struct {
	contract.FencedRuns
	knob string
}

// Update is the reference's ("update-ignores-clear" is testkit.KeepDurableRuns).
func (r mutantRuns) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	return refstore.Runs(r.FencedRuns).Update(ctx, runID, p)
}

// Claim under "claim-ignores-cond" drops the reaper's extra condition.
func (r mutantRuns) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	if r.knob == "claim-ignores-cond" {
		c.If = contract.ClaimCond{}
	}
	return r.FencedRuns.Claim(ctx, runID, c)
}

// UpdateFenced under "no-epoch-fence" writes under whatever epoch the run has now.
func (r mutantRuns) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	if r.knob == "no-epoch-fence" {
		if st, err := r.FencedRuns.State(ctx, runID); err == nil && st != nil {
			epoch = st.Epoch()
		}
	}
	return r.FencedRuns.UpdateFenced(ctx, runID, epoch, p)
}

// Detach under "detach-overwrites" pushes detachedSince to now on every detach.
func (r mutantRuns) Detach(ctx context.Context, runID string, epoch int64, key string, now int64) (contract.RunState, error) {
	if r.knob == "detach-overwrites" {
		if err := refstore.Runs(r.FencedRuns).Update(ctx, runID, contract.RunPatch{DetachedSince: contract.Clear[int64]()}); err != nil {
			return contract.RunState{}, err
		}
	}
	return r.FencedRuns.Detach(ctx, runID, epoch, key, now)
}

// ListReclaimable under "reclaimable-exclusive" reads the cutoff as exclusive.
func (r mutantRuns) ListReclaimable(ctx context.Context, now, ttl int64) ([]contract.RunRecord, error) {
	recs, err := refstore.Runs(r.FencedRuns).ListReclaimable(ctx, now, ttl)
	if r.knob == "reclaimable-exclusive" {
		recs = slices.DeleteFunc(recs, func(rec contract.RunRecord) bool { return *rec.DetachedSince == now-ttl })
	}
	return recs, err
}

// CreateOrResume under "create-revives" writes the requested status over a stored run
// (INSERT … ON CONFLICT DO UPDATE).
func (r mutantRuns) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	rec, err := refstore.Runs(r.FencedRuns).CreateOrResume(ctx, in)
	if r.knob == "create-revives" && err == nil && in.Status != "" && rec.Status != in.Status {
		if err := refstore.Runs(r.FencedRuns).Update(ctx, in.RunID, contract.RunPatch{Status: contract.Set(in.Status)}); err != nil {
			return rec, err
		}
		rec.Status = in.Status
	}
	return rec, err
}

// Reaper returns the reaper source, broken when the knob says so.
func (m mutant) Reaper() contract.ReaperSource {
	return mutantReaper{ReaperSource: m.Store.Reaper(), knob: m.knob}
}

type mutantReaper struct {
	contract.ReaperSource
	knob string
}

// ReclaimCandidates under "candidates-newest-first" returns them in reverse order.
func (r mutantReaper) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]contract.Candidate, error) {
	c, err := r.ReaperSource.ReclaimCandidates(ctx, now, limit)
	if r.knob == "candidates-newest-first" {
		slices.Reverse(c)
	}
	return c, err
}

// mutantRun runs suite against the mutant named by mutantEnv; skipped outside the
// subprocess TestCoreNegativeControls starts.
func mutantRun(t *testing.T, suite func(*testing.T, testkit.NewBackend)) {
	knob := os.Getenv(mutantEnv)
	if knob == "" {
		t.Skip("run only by TestCoreNegativeControls, as a subprocess")
	}
	suite(t, func(t *testing.T, o testkit.Options) contract.Backend {
		return mutant{Store: coreFactory()(t, o).(*memstore.Store), knob: knob}
	})
}

func TestMutantInstances(t *testing.T)     { mutantRun(t, testkit.RunInstanceStoreConformance) }
func TestMutantDurableFields(t *testing.T) { mutantRun(t, testkit.RunDurableRunFieldsConformance) }
func TestMutantRunStore(t *testing.T)      { mutantRun(t, testkit.RunRunStoreConformance) }
func TestMutantFencedRuns(t *testing.T)    { mutantRun(t, testkit.RunFencedRunsConformance) }
func TestMutantReaperSource(t *testing.T)  { mutantRun(t, testkit.RunReaperSourceConformance) }

// TestCoreNegativeControls proves the suites have teeth: each injected defect makes the
// named cases fail (the test binary re-runs itself with the defect switched on).
func TestCoreNegativeControls(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("already inside a negative-control subprocess")
	}
	controls := []struct {
		knob, test string
		mustFail   []string // case names as go test prints them
	}{
		{"merge-upsert", "TestMutantInstances", []string{"re-Upsert_fully_replaces_and_clears_omitted_optionals"}},
		{"create-no-token", "TestMutantInstances", []string{"CreateRow_retried_after_a_lost_response_succeeds_and_changes_nothing"}},
		{"update-ignores-clear", "TestMutantDurableFields", []string{
			"one_patch_clearing_all_four_clears_all_four_and_keeps_the_run",
			"setting_and_clearing_sandboxKey_leaves_the_other_three",
			"setting_and_clearing_detachedSince_leaves_the_other_three",
			"setting_and_clearing_cancelRequested_leaves_the_other_three",
			"setting_and_clearing_driverEpoch_leaves_the_other_three",
		}},
		{"update-ignores-clear", "TestMutantRunStore", []string{"ListReclaimable_drops_a_run_whose_detachedSince_was_cleared"}},
		{"claim-ignores-cond", "TestMutantFencedRuns", []string{
			"Claim_conditioned_on_detachedSince_requires_equality",
			"Claim_cutoff_is_inclusive_and_needs_a_detachedSince",
			"Claim_on_the_cancel_path_requires_cancelRequested",
		}},
		{"detach-overwrites", "TestMutantFencedRuns", []string{"a_repeated_Detach_never_pushes_detachedSince_back"}},
		{"reclaimable-exclusive", "TestMutantRunStore", []string{
			"ListReclaimable_lists_detached_running_runs_at_or_before_the_cutoff,_oldest_first",
			"ListReclaimable_with_ttl_0_includes_a_run_detached_exactly_now",
		}},
		{"create-revives", "TestMutantRunStore", []string{"CreateOrResume_never_revives_a_finished_run"}},
		{"candidates-newest-first", "TestMutantReaperSource", []string{
			"ReclaimCandidates_ascend_by_reclaimAt_with_cancelled_runs_first",
			"ReclaimCandidates_span_tenants,_each_hit_with_its_tenant",
		}},
		{"no-epoch-fence", "TestMutantFencedRuns", []string{
			"UpdateFenced_refuses_a_mismatched_epoch_with_ErrSuperseded",
			"every_fenced_write_refuses_a_stale_epoch_after_a_claim",
		}},
	}
	for _, c := range controls {
		t.Run(c.knob+"/"+c.test, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+c.test+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+c.knob)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("the store broken by %s passed %s (err %v)", c.knob, c.test, err)
			}
			for _, name := range c.mustFail {
				if !bytes.Contains(out, []byte("--- FAIL: "+c.test+"/"+name+" ")) {
					t.Errorf("%s did not fail case %q under %s; output tail:\n%s", c.test, name, c.knob, out[max(0, len(out)-3000):])
				}
			}
			t.Logf("%s: %d failing cases of %s", c.knob, bytes.Count(out, []byte("--- FAIL: "+c.test+"/")), c.test)
		})
	}
}

// TestMemstoreIndexLagYieldsStaleHitsTheBaseReadExposes pins the premise of the suites'
// polling and re-reading: under memstore.WithIndexLag a listing right after a write can
// still show a run that no longer qualifies, while State already shows the truth.
func TestMemstoreIndexLagYieldsStaleHitsTheBaseReadExposes(t *testing.T) {
	b := coreFactory(memstore.WithIndexLag(3))(t, testkit.Options{DriverLease: contract.DefaultDriverLease * time.Millisecond})
	ctx := contract.WithTenant(t.Context(), "tenant-a")
	runs, src := b.Runs(), b.Reaper()
	if _, _, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
		NewRun: contract.NewRun{RunID: "r", ThreadID: "t", StartedAt: 1}, SandboxKey: "sk", LeaseUntil: 100, Token: "c",
	}); err != nil {
		t.Fatal(err)
	}
	listed := func() bool {
		c, err := src.ReclaimCandidates(t.Context(), contract.LeaseReclaimAt(100, contract.DefaultDriverLease), 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(c) == 1 && c[0].RunID == "r"
	}
	for deadline := time.Now().Add(5 * time.Second); !listed(); {
		if time.Now().After(deadline) {
			t.Fatal("the candidate never appeared")
		}
	}
	if _, err := runs.UpdateFenced(ctx, "r", 1, contract.RunPatch{Status: contract.Set(contract.StatusCompleted)}); err != nil {
		t.Fatal(err)
	}
	if !listed() {
		t.Fatal("no stale hit right after the terminal write: the lag emulation is not lagging, so the suites' re-read cases prove nothing here")
	}
	st, err := runs.State(ctx, "r")
	if err != nil || st == nil || st.Status != contract.StatusCompleted {
		t.Fatalf("State after the terminal write = (%v, %v); the base read must be current", st, err)
	}
}
