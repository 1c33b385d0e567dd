package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// shipCancels is how many runs TestShipCancelNoHost cancels per backend; its cancel →
// aborted figure is a p99 only with -ship-cancels 20 or more (the default keeps the test
// quick).
var shipCancels = flag.Int("ship-cancels", 1, "TestShipCancelNoHost: runs cancelled per backend")

// TestShipCancelNoHost: no host at all — plain HTTP start and agent, a silent agent, the
// reaper off — then a plain cancel: the run ends aborted, its log closed, and the agent's
// process group is gone (the cancel route killed it through the provider; the shipper
// sealed, shipped and ended the run). The cancel → aborted times are logged; the deadlines
// only bound the polling.
func TestShipCancelNoHost(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		var took []time.Duration
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
			pg := pgrpOf(t, first.PID)
			t0 := time.Now()
			if st, m := plain(t, dev.URL, http.MethodPost, "/v1/runs/"+runID+"/cancel", ""); st != http.StatusAccepted {
				t.Fatalf("cancel: %d %v", st, m)
			}
			took = append(took, waitPlainStatus(t, dev.URL, runID, "aborted", 20*time.Second).Sub(t0))
			if _, closed := readEvents(t, dev.URL, runID, 0, 10*time.Second); !closed {
				t.Fatal("the aborted run's log is not closed")
			}
			deadline := time.Now().Add(10 * time.Second)
			for groupLive(pg) {
				if time.Now().After(deadline) {
					t.Fatalf("the agent's process group %d is still alive after the abort", pg)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		slices.Sort(took)
		p := func(q float64) time.Duration { return took[min(int(q*float64(len(took))), len(took)-1)] }
		t.Logf("cancel → aborted over %d cancels: p50 %s p99 %s max %s (load %s)",
			len(took), p(0.5), p(0.99), took[len(took)-1], loadavg())
	}, "--reap-every", "1h")
}

// pgrpOf answers the process group of a live pid (from /proc).
func pgrpOf(t *testing.T, pid int) int {
	t.Helper()
	f := procStat(pid)
	if len(f) < 3 {
		t.Fatalf("no process %d", pid)
	}
	pg, err := strconv.Atoi(f[2])
	if err != nil || pg <= 1 {
		t.Fatalf("process %d: group %q", pid, f[2])
	}
	return pg
}

// procStat answers the fields of /proc/PID/stat after the command name (state first).
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := bytes.LastIndexByte(b, ')')
	if err != nil || i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// groupLive reports whether a live (not zombie) process of group pg exists.
func groupLive(pg int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(s)))
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pg) {
			return true
		}
	}
	return false
}
