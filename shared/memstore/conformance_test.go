package memstore_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// brokenEnv selects the negative-control knob of a TestBroken* run in a subprocess.
const brokenEnv = "MEMSTORE_NEGATIVE_CONTROL"

// factory returns fresh stores honouring the suite's options, plus extra.
func factory(extra ...memstore.Option) testkit.NewBackend {
	return func(t *testing.T, o testkit.Options) sandbox.Backend {
		opts := append([]memstore.Option{
			memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease),
		}, extra...)
		s := memstore.New(opts...)
		if knob := os.Getenv(brokenEnv); knob != "" {
			memstore.Break(s, knob)
		}
		return s
	}
}

func TestConformance(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("a negative-control subprocess runs only its TestBroken case")
	}
	testkit.RunAll(t, factory())
}

func TestConformanceWithIndexLag(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("a negative-control subprocess runs only its TestBroken case")
	}
	testkit.RunAll(t, factory(memstore.WithIndexLag(3)))
}

// brokenRun runs suite against a store broken by the knob named in brokenEnv; outside a
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
// the named conformance case fail (the test binary re-runs itself with the knob set).
func TestNegativeControls(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("already inside a negative-control subprocess")
	}
	controls := []struct {
		knob, test string
		mustFail   []string // case names (as go test prints them) that must fail
	}{
		{"no-epoch-check", "TestBrokenEventLog", []string{"SupersededAfterHigherFence", "SupersededAfterHigherAppend"}},
		{"unconditional-lease", "TestBrokenLocks", []string{"NoOverlapUnderContention"}},
		{"merge-upsert", "TestBrokenInstances", []string{"re-Upsert_fully_replaces_and_clears_omitted_optionals"}},
		{"update-keeps-durable", "TestBrokenDurableFields", []string{"one_patch_clearing_all_four_clears_all_four_and_keeps_the_run"}},
	}
	for _, c := range controls {
		t.Run(c.knob, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+c.test+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.knob)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("the store broken by %s passed %s (err %v); output:\n%s", c.knob, c.test, err, out)
			}
			for _, name := range c.mustFail {
				re := regexp.MustCompile(`--- FAIL: ` + regexp.QuoteMeta(c.test) + `/\S*` + regexp.QuoteMeta(name) + `\b`)
				if !re.Match(out) {
					t.Errorf("%s did not fail case %q under %s; output:\n%s", c.test, name, c.knob, tail(out, 4000))
				}
			}
			t.Logf("%s: %d failing cases", c.knob, bytes.Count(out, []byte("--- FAIL: "+c.test+"/")))
		})
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
