package memstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/memstoretest"
)

// brokenEnv selects the negative-control defect of a TestBroken* run in a subprocess.
const brokenEnv = "MEMSTORE_NEGATIVE_CONTROL"

// factory returns fresh stores honouring the suite's options, plus extra; renewals are
// stallable at the lease-table seam (memstoretest), so the lease-loss cases run.
func factory(extra ...memstore.Option) testkit.NewBackend {
	return func(t *testing.T, o testkit.Options) contract.Backend {
		opts := append([]memstore.Option{
			memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease),
		}, extra...)
		if defect := os.Getenv(brokenEnv); defect != "" {
			return broken(defect, opts)
		}
		return memstoretest.New(opts...)
	}
}

// defective is a memstore with one of its stores replaced by a broken wrapper.
type defective struct {
	*memstoretest.Store
	rows contract.InstanceRows
	runs contract.FencedRuns
	log  contract.EventLog
}

func (d defective) Instances() contract.InstanceRows {
	if d.rows != nil {
		return d.rows
	}
	return d.Store.Instances()
}

func (d defective) Runs() contract.FencedRuns {
	if d.runs != nil {
		return d.runs
	}
	return d.Store.Runs()
}

func (d defective) Log() contract.EventLog {
	if d.log != nil {
		return d.log
	}
	return d.Store.Log()
}

// broken returns a store with the named deliberate defect, built at a seam: a wrapped
// store interface (testkit) or a wrapped lease table (memstoretest).
func broken(defect string, opts []memstore.Option) contract.Backend {
	s := memstoretest.New(opts...)
	switch defect {
	case "no-epoch-check":
		return defective{Store: s, log: testkit.NoEpochCheckLog(s.Log())}
	case "unconditional-lease":
		return memstoretest.NewOver(memstoretest.UnconditionalLeases(memstore.NewLeases()), opts...)
	case "merge-upsert":
		return defective{Store: s, rows: testkit.MergeUpsertRows(s.Instances())}
	case "update-keeps-durable":
		return defective{Store: s, runs: testkit.KeepDurableRuns(s.Runs())}
	}
	panic(fmt.Sprintf("memstore: unknown negative-control defect %q", defect))
}

// localProvider is the provider of the takeover, journal and reaper suites: local-process
// (a real /bin/sh) rooted in the case's temp dir.
func localProvider(t *testing.T) contract.Provider { return localprocess.New(t.TempDir()) }

// TestConformance proves memstore in one call (testkit.RunAll: store, operation, takeover,
// journal and reaper suites).
func TestConformance(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("a negative-control subprocess runs only its TestBroken case")
	}
	testkit.RunAll(t, factory(), localProvider)
}

// TestConformanceWithIndexLag proves it again while every index answers as it stood a few
// writes ago (removed entries linger, new ones show up late): no suite, no operation and no
// reaper pass may trust an index hit without a re-read.
func TestConformanceWithIndexLag(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("a negative-control subprocess runs only its TestBroken case")
	}
	testkit.RunAll(t, factory(memstore.WithIndexLag(3)), localProvider)
}

// brokenRun runs suite against a store broken by the defect named in brokenEnv; outside a
// negative-control subprocess it is skipped.
func brokenRun(t *testing.T, suite func(*testing.T, testkit.NewBackend)) {
	if os.Getenv(brokenEnv) == "" {
		t.Skip("run only by TestNegativeControls, as a subprocess")
	}
	suite(t, factory())
}

func TestBrokenEventLog(t *testing.T) { brokenRun(t, testkit.RunEventLogConformance) }

func TestBrokenLocks(t *testing.T) { brokenRun(t, testkit.RunLockStoreConformance) }

func TestBrokenInstances(t *testing.T) { brokenRun(t, testkit.RunInstanceStoreConformance) }

func TestBrokenDurableFields(t *testing.T) { brokenRun(t, testkit.RunDurableRunFieldsConformance) }

// TestNegativeControls proves the suites have teeth: each deliberately broken store makes
// the named conformance case fail (the test binary re-runs itself with the defect set).
func TestNegativeControls(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("already inside a negative-control subprocess")
	}
	controls := []struct {
		defect, test string
		mustFail     []string // case names (as go test prints them) that must fail
	}{
		{"no-epoch-check", "TestBrokenEventLog", []string{"SupersededAfterHigherFence", "SupersededAfterHigherAppend"}},
		{"unconditional-lease", "TestBrokenLocks", []string{"NoOverlapUnderContention"}},
		{"merge-upsert", "TestBrokenInstances", []string{"re-Upsert_fully_replaces_and_clears_omitted_optionals"}},
		{"update-keeps-durable", "TestBrokenDurableFields", []string{"one_patch_clearing_all_four_clears_all_four_and_keeps_the_run"}},
	}
	for _, c := range controls {
		t.Run(c.defect, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+c.test+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.defect)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("the store broken by %s passed %s (err %v); output:\n%s", c.defect, c.test, err, out)
			}
			for _, name := range c.mustFail {
				re := regexp.MustCompile(`--- FAIL: ` + regexp.QuoteMeta(c.test) + `/\S*` + regexp.QuoteMeta(name) + `\b`)
				if !re.Match(out) {
					t.Errorf("%s did not fail case %q under %s; output:\n%s", c.test, name, c.defect, tail(out, 4000))
				}
			}
			t.Logf("%s: %d failing cases", c.defect, bytes.Count(out, []byte("--- FAIL: "+c.test+"/")))
		})
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
