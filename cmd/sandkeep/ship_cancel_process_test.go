package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/latency"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
	"github.com/sandkeep/sandkeep/shared/testkit/proctest"
)

// shipCancels is how many runs TestShipCancelNoHost cancels per backend; its figures are a
// p99 only with -ship-cancels 20 or more (the default keeps the test quick).
var shipCancels = flag.Int("ship-cancels", 1, "TestShipCancelNoHost: runs cancelled per backend")

// TestShipCancelNoHost: no host at all — plain HTTP start and agent, a silent agent, the
// reaper off — then a plain cancel: the run ends aborted, its log closed, and the agent's
// process group is gone (the cancel route killed it through the provider; the shipper
// sealed, shipped and ended the run). The times from the cancel to the group gone and to
// the run aborted are logged (docs/bench.md); the deadlines only bound the polling.
func TestShipCancelNoHost(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		var gone, aborted []time.Duration
		for i := range max(*shipCancels, 1) {
			runID := fmt.Sprintf("run-cx%d", i)
			agent := `echo "{\"pid\":$$}"; sleep 600; echo never`
			if got := startShipped(t, dev.URL, runID, agent); got != "sandbox" {
				t.Fatalf("shipping %q, want sandbox", got)
			}
			got, _ := readEvents(t, dev.URL, runID, 1, 20*time.Second)
			var first struct{ PID int }
			if err := json.Unmarshal([]byte(got[0]), &first); err != nil || first.PID <= 1 {
				t.Fatalf("the agent's first line %q: %v", got[0], err)
			}
			pg, ok := proctest.GroupOf(first.PID)
			if !ok || pg <= 1 {
				t.Fatalf("the agent %d: no process group (%d)", first.PID, pg)
			}
			t0 := time.Now()
			if st, m := plain(t, dev.URL, http.MethodPost, "/v1/runs/"+runID+"/cancel", ""); st != http.StatusAccepted {
				t.Fatalf("cancel: %d %v", st, m)
			}
			var tg, ta time.Duration
			for deadline := time.Now().Add(20 * time.Second); tg == 0 || ta == 0; time.Sleep(5 * time.Millisecond) {
				if tg == 0 && !proctest.GroupLive(pg) {
					tg = time.Since(t0)
				}
				if ta == 0 {
					switch s := runStatus(t, dev.URL, runID); s {
					case "aborted":
						ta = time.Since(t0)
					case "running", "detached":
					default:
						t.Fatalf("run %s is %s, want aborted", runID, s)
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("group gone after %v, aborted after %v (0: not yet)", tg, ta)
				}
			}
			if _, closed := readEvents(t, dev.URL, runID, 0, 10*time.Second); !closed {
				t.Fatal("the aborted run's log is not closed")
			}
			gone, aborted = append(gone, tg), append(aborted, ta)
		}
		t.Logf("cancel → agent's group gone: %s; → aborted: %s (load %s)", latency.Summary(gone), latency.Summary(aborted), loadavg())
	}, "--reap-every", "1h")
}
