package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/latency"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// plain is one plain HTTP call with a JSON body (what curl or any language does), in the
// dev server's default tenant; it answers the status and the decoded JSON answer.
func plain(t *testing.T, base, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: status %d, not JSON: %s", method, path, res.StatusCode, b)
		}
	}
	return res.StatusCode, m
}

// startShipped starts run runID and launches agent in its sandbox with plain calls; it
// answers the agent route's shipping.
func startShipped(t *testing.T, base, runID, agent string) string {
	t.Helper()
	st, m := plain(t, base, http.MethodPost, "/v1/runs",
		fmt.Sprintf(`{"runId":%q,"threadId":"thread-%s","sandbox":{"id":"default","provider":"local-process"}}`, runID, runID))
	if st != http.StatusOK {
		t.Fatalf("start: %d %v", st, m)
	}
	body, _ := json.Marshal(map[string]string{"cursor": m["cursor"].(string), "command": agent})
	st, m = plain(t, base, http.MethodPost, "/v1/runs/"+runID+"/agent", string(body))
	if st != http.StatusOK || m["launched"] != true {
		t.Fatalf("agent: %d %v", st, m)
	}
	s, _ := m["shipping"].(string)
	return s
}

// readAll long-polls the run's log from the start until it is closed or want events are
// there, answering every event's data and whether the log closed.
func readEvents(t *testing.T, base, runID string, want int, within time.Duration) ([]string, bool) {
	t.Helper()
	var got []string
	after := 0.0
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		st, m := plain(t, base, http.MethodGet, fmt.Sprintf("/v1/runs/%s/events?after=%d&waitMs=2000", runID, int64(after)), "")
		if st != http.StatusOK {
			t.Fatalf("read: %d %v", st, m)
		}
		for _, e := range m["events"].([]any) {
			d, _ := json.Marshal(e.(map[string]any)["data"])
			got = append(got, strings.Trim(string(d), `"`))
		}
		after = m["next"].(float64)
		if m["closed"] == true {
			return got, true
		}
		if want > 0 && len(got) >= want {
			return got, false
		}
	}
	t.Fatalf("read %d events of %s in %s: %q", len(got), runID, within, got)
	return nil, false
}

func wantNumbers(t *testing.T, got []string, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("got %d events, want 1..%d exactly once: %q", len(got), n, got)
	}
	for i, g := range got {
		if g != strconv.Itoa(i+1) {
			t.Fatalf("event %d is %q, want %d (1..%d exactly once, in order)", i, g, i+1, n)
		}
	}
}

func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

// shipFiles lists shipper pid files left under a dev server's sandboxes.
func shipFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".ship.pid") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestShipFallback: a sandbox that cannot reach the API's public URL (a closed port) runs
// no shipper; the agent route answers shipping host and the host pump moves the lines.
func TestShipFallback(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		if got := startShipped(t, dev.URL, "run-fb", `for i in 1 2 3; do echo $i; done`); got != "host" {
			t.Fatalf("shipping %q, want host", got)
		}
		if f := shipFiles(t, dev.SandboxDir); len(f) != 0 {
			t.Fatalf("a shipper ran: %v", f)
		}
		code, out, errOut := sk(t, dev, "attach", "run-fb")
		if code != 0 {
			t.Fatalf("attach (the host pump): exit %d: %s %s", code, out, errOut)
		}
		got, closed := readEvents(t, dev.URL, "run-fb", 0, 20*time.Second)
		if !closed {
			t.Fatal("the log is not closed")
		}
		wantNumbers(t, got, 3)
	}, "--public-url", closedPort(t), "--reap-every", "1h")
}

// TestShipNoHost: no host at all — plain HTTP start and agent only, the reaper off. A
// reader sees 1..N exactly once, in order, while the agent still runs (it waits on a gate
// the test opens only then); once the agent exits the run ends completed, its log closed.
func TestShipNoHost(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		const n = 30
		var took []time.Duration
		for i := range max(*noHostRuns, 1) {
			runID := fmt.Sprintf("run-nh%d", i)
			gate := filepath.Join(t.TempDir(), "gate")
			agent := fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo $i; i=$((i+1)); sleep 0.01; done; while [ ! -e '%s' ]; do sleep 0.02; done`, n, gate)
			if got := startShipped(t, dev.URL, runID, agent); got != "sandbox" {
				t.Fatalf("shipping %q, want sandbox", got)
			}
			got, closed := readEvents(t, dev.URL, runID, n, 20*time.Second)
			if closed {
				t.Fatal("the log closed before the agent exited")
			}
			wantNumbers(t, got, n)
			if err := os.WriteFile(gate, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			opened := time.Now()
			took = append(took, waitPlainStatus(t, dev.URL, runID, "completed", 20*time.Second).Sub(opened))
			all, closed := readEvents(t, dev.URL, runID, 0, 10*time.Second)
			if !closed {
				t.Fatal("the log is not closed")
			}
			wantNumbers(t, all, n)
		}
		t.Logf("agent exit → completed: %s (load %s)", latency.Summary(took), loadavg())
	}, "--reap-every", "1h")
}

// noHostRuns is how many runs TestShipNoHost runs per backend; its exit → completed figure
// is a p99 only with -no-host-runs 20 or more (the default keeps the test quick).
var noHostRuns = flag.Int("no-host-runs", 1, "TestShipNoHost: runs per backend")

// runStatus is the run's status and whether its log is closed (a read from its end).
func runStatus(t *testing.T, base, runID string) string {
	t.Helper()
	st, m := plain(t, base, http.MethodGet, "/v1/runs/"+runID, "")
	if st != http.StatusOK {
		t.Fatalf("get: %d %v", st, m)
	}
	return m["run"].(map[string]any)["status"].(string)
}

// waitPlainStatus polls the run until its status is want (bounded).
func waitPlainStatus(t *testing.T, base, runID, want string, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := runStatus(t, base, runID)
		if s == want {
			return time.Now()
		}
		if s != "running" && s != "detached" || time.Now().After(deadline) {
			t.Fatalf("run %s is %s, want %s", runID, s, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
