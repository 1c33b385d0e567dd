package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// sweepsAs reads GET /v1/reaper/sweeps of dev as tenant: the raw body and its sweeps.
func sweepsAs(t *testing.T, dev *clitest.Dev, tenant string) (string, []sweepSeen) {
	t.Helper()
	req, err := http.NewRequestWithContext(clitest.Context(t), http.MethodGet, dev.URL+"/v1/reaper/sweeps?limit=20", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Sandkeep-Tenant", tenant)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/reaper/sweeps as %s: %d %s %v", tenant, res.StatusCode, b, err)
	}
	var page struct{ Sweeps []sweepSeen }
	if err := json.Unmarshal(b, &page); err != nil {
		t.Fatalf("sweeps of %s: %v\n%s", tenant, err, b)
	}
	return string(b), page.Sweeps
}

// sweepSeen is one sweep as a tenant reads it.
type sweepSeen struct {
	Seq    int64
	Report struct {
		Considered int
		Outcomes   map[string]int
		Sandboxes  map[string]int
		Runs       []struct {
			Tenant, RunID, Outcome, Status, Sandbox string
		}
	}
}

// TestSweepsShowEachTenantOnlyItsOwnRuns: two tenants each leave a detached run on a dev
// server whose reaper sweeps twice a second: tenant-a's agent exits (finalized), tenant-b's
// never does (expired after the TTL). Each tenant's GET /v1/reaper/sweeps shows its own
// run's outcome, counts made from its own runs alone, and nothing derived from the other's:
// not its run, not its tenant name, not the sweep-wide probe or housekeeping counts, the
// sweep's duration or error text.
func TestSweepsShowEachTenantOnlyItsOwnRuns(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		runs := map[string]struct{ run, agent, outcome string }{
			"tenant-a": {"a-run", `echo '{"n":1}'; sleep 1; echo '{"n":2}'`, "finalized"},
			"tenant-b": {"b-secret-run", `echo '{"n":1}'; sleep 60`, "expired"},
		}
		for tenant, r := range runs {
			host := skStart(t, dev, "run", "--tenant", tenant, "--thread", "th-"+r.run, "--run", r.run, "--", r.agent)
			host.WaitLines(t, 1)
			host.Signal(t, syscall.SIGINT)
			if code := host.Wait(t); code != exitDetached {
				t.Fatalf("%s: run after SIGINT: exit %d\n%s", tenant, code, host.Stderr)
			}
		}
		// Both runs were acted on by some sweep, as each tenant sees it. A run once seen stays
		// seen. The server keeps its latest 20 sweeps; a sweep every 2 s keeps each run's sweep
		// in that window for 40 s, while the second run is started and both are checked.
		seen := map[string]bool{}
		for deadline := time.Now().Add(clitest.Deadline); ; time.Sleep(100 * time.Millisecond) {
			for tenant, r := range runs {
				_, sweeps := sweepsAs(t, dev, tenant)
				for _, s := range sweeps {
					for _, e := range s.Report.Runs {
						if e.RunID == r.run && e.Outcome == r.outcome {
							seen[tenant] = true
						}
					}
				}
			}
			if len(seen) == len(runs) {
				break
			}
			if time.Now().After(deadline) {
				a, _ := sweepsAs(t, dev, "tenant-a")
				b, _ := sweepsAs(t, dev, "tenant-b")
				t.Fatalf("not both runs swept within %v:\ntenant-a: %s\ntenant-b: %s", clitest.Deadline, a, b)
			}
		}
		for tenant, r := range runs {
			other := "tenant-a"
			if tenant == other {
				other = "tenant-b"
			}
			raw, sweeps := sweepsAs(t, dev, tenant)
			for _, leak := range []string{runs[other].run, other, `"probed"`, `"swept"`, `"finishedAt"`, `"error"`, `"planned"`} {
				if strings.Contains(raw, leak) {
					t.Errorf("%s sees %s:\n%s", tenant, leak, raw)
				}
			}
			seen := false
			for _, s := range sweeps {
				outs, boxes := 0, 0
				for _, n := range s.Report.Outcomes {
					outs += n
				}
				for _, n := range s.Report.Sandboxes {
					boxes += n
				}
				if s.Report.Considered != len(s.Report.Runs) || outs != len(s.Report.Runs) || boxes > len(s.Report.Runs) {
					t.Errorf("%s: sweep %d counts %d considered, %d outcomes, %d sandboxes for %d runs of its own", tenant, s.Seq,
						s.Report.Considered, outs, boxes, len(s.Report.Runs))
				}
				for _, e := range s.Report.Runs {
					if e.Tenant != tenant || e.RunID != r.run {
						t.Errorf("%s sees run %s of %q", tenant, e.RunID, e.Tenant)
					}
					if e.Outcome == r.outcome {
						seen = true
						if e.Sandbox == "" || (r.outcome == "finalized") != (e.Status == "completed") {
							t.Errorf("%s: entry %+v; want its end status and its sandbox's fate", tenant, e)
						}
					}
				}
			}
			if !seen {
				t.Errorf("%s does not see its run %s %s:\n%s", tenant, r.run, r.outcome, raw)
			}
		}
	}, "--reap-every", "2s", "--detached-ttl", "3s", "--no-ship")
}
