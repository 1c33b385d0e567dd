package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/latency"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// devCall is one answer of the dev server.
type devCall struct {
	status int
	header http.Header
	body   map[string]any
}

// devRequest sends one request to dev as tenant (with extra headers) and decodes its JSON body.
func devRequest(t *testing.T, dev *clitest.Dev, method, path, tenant string, body any, headers map[string]string) devCall {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(clitest.Context(t), method, dev.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if tenant != "" {
		req.Header.Set(httpapi.TenantHeader, tenant)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 40 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := devCall{status: resp.StatusCode, header: resp.Header}
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			t.Fatalf("%s %s: %d with a body that is not a JSON object: %q", method, path, resp.StatusCode, raw)
		}
	}
	return out
}

// want fails unless the answer has status (and, for a problem, code).
func (c devCall) want(t *testing.T, what string, status int, code string) devCall {
	t.Helper()
	if c.status != status || code != "" && c.body["code"] != code {
		t.Fatalf("%s: %d %v, want %d %s", what, c.status, c.body, status, code)
	}
	return c
}

func startBodyFor(runID string) map[string]any {
	return map[string]any{"runId": runID, "threadId": "thread-" + runID,
		"sandbox": map[string]any{"id": "default", "provider": "local-process"}}
}

func fairLoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// TestDevWaitingBoundPerTenant: against a real `sandkeep dev --max-waiting 3` on each
// backend, tenant A holds its three waiting places with idle 20 s long polls; one more
// waiting request of A — a long poll or a waiting pump — is 429 too-many-waiting with
// Retry-After, while A's non-waiting read is served; tenant B meanwhile appends, launches
// an agent, pumps (waiting), long-polls and finishes as if A were idle. B's append
// latency is logged with A idle and A at its bound (measured, never asserted). On the old
// main A's fourth poll waited like the others (no bound). B's run is host-driven
// (--no-ship): with a shipper in its sandbox, the shipper could end the run before a pump
// saw the agent's exit, and the pump would rightly answer 410 terminal-run.
func TestDevWaitingBoundPerTenant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		const tenantA, tenantB = "tenant-a", "tenant-b"
		curA := devRequest(t, dev, "POST", "/v1/runs", tenantA, startBodyFor("run-a"), nil).want(t, "start A", 200, "").body["cursor"]
		sb := devRequest(t, dev, "POST", "/v1/runs", tenantB, startBodyFor("run-b"), nil).want(t, "start B", 200, "")
		cursor := sb.body["cursor"].(string)
		appendB := func(n int) []time.Duration {
			var ds []time.Duration
			for i := range n {
				t0 := time.Now()
				r := devRequest(t, dev, "POST", "/v1/runs/run-b/events", tenantB,
					map[string]any{"cursor": cursor, "events": []any{map[string]any{"data": map[string]any{"i": i}}}}, nil)
				ds = append(ds, time.Since(t0))
				cursor = r.want(t, "append B", 200, "").body["cursor"].(string)
			}
			return ds
		}
		const n = 100
		idle := appendB(n)
		loadIdle := fairLoadAvg()

		// A fills its bound: three idle long polls, each asked again while a probe holds a
		// place (429) or when its 20 s wait ends empty (a loaded machine can take longer
		// than that over B's work below), until the event that releases A.
		var wg sync.WaitGroup
		polls := make(chan devCall, 3)
		for range 3 {
			wg.Go(func() {
				for {
					c := devRequest(t, dev, "GET", "/v1/runs/run-a/events?waitMs=20000", tenantA, nil, nil)
					if evs, _ := c.body["events"].([]any); c.status != http.StatusTooManyRequests && (c.status != 200 || len(evs) > 0) {
						polls <- c
						return
					}
				}
			})
		}
		// Sequential probes of 1 ms: a 429 means three other requests of A hold its places.
		probe := func() devCall {
			return devRequest(t, dev, "GET", "/v1/runs/run-a/events?waitMs=1", tenantA, nil, nil)
		}
		// atBound probes until one is refused (bounded): a poll asked again leaves its
		// place free for a moment.
		atBound := func(what string) devCall {
			t.Helper()
			deadline := time.Now().Add(clitest.Deadline)
			p := probe()
			for p.status != http.StatusTooManyRequests {
				if time.Now().After(deadline) {
					t.Fatalf("%s: tenant A not at its bound of 3 waiting requests: probe answered %d %v", what, p.status, p.body)
				}
				p.want(t, what+": A's probe below the bound", 200, "")
				p = probe()
			}
			return p
		}
		p := atBound("A's polls")
		if p.body["code"] != "too-many-waiting" || p.header.Get("Retry-After") == "" || p.header.Get("Content-Type") != httpapi.ProblemContentType {
			t.Fatalf("A past its bound: %d %v %v", p.status, p.header, p.body)
		}
		devRequest(t, dev, "POST", "/v1/runs/run-a/pump", tenantA, map[string]any{"cursor": curA, "waitMs": 1000}, nil).
			want(t, "A's waiting pump past its bound", http.StatusTooManyRequests, "too-many-waiting")
		devRequest(t, dev, "GET", "/v1/runs/run-a/events", tenantA, nil, nil).want(t, "A's read without waitMs", 200, "")

		// B, with A at its bound.
		busy := appendB(n)
		loadBusy := fairLoadAvg()
		devRequest(t, dev, "POST", "/v1/runs/run-b/agent", tenantB,
			map[string]any{"cursor": cursor, "command": "echo one; sleep 1; echo two"}, nil).want(t, "B's agent", 200, "")
		var exited bool
		for pumps := 0; !exited; pumps++ {
			if pumps > 60 {
				t.Fatal("B's agent never exited through its pumps")
			}
			r := devRequest(t, dev, "POST", "/v1/runs/run-b/pump", tenantB, map[string]any{"cursor": cursor, "waitMs": 2000}, nil).
				want(t, "B's waiting pump", 200, "")
			cursor, exited = r.body["cursor"].(string), r.body["exited"] == true
		}
		rb := devRequest(t, dev, "GET", fmt.Sprintf("/v1/runs/run-b/events?after=%d&waitMs=1000", n), tenantB, nil, nil).want(t, "B's long poll", 200, "")
		if evs, _ := rb.body["events"].([]any); len(evs) < 2 {
			t.Fatalf("B's long poll after the pumps: %v", rb.body)
		}
		devRequest(t, dev, "POST", "/v1/runs/run-b/finish", tenantB, map[string]any{"cursor": cursor, "status": "completed"}, nil).
			want(t, "B's finish", 200, "")
		// A is still at its bound.
		atBound("A after B's work").want(t, "A after B's work", http.StatusTooManyRequests, "too-many-waiting")

		// Releasing A: an event wakes its polls (dynalite: at the next re-read).
		sa := devRequest(t, dev, "POST", "/v1/runs/run-a/attach", tenantA, map[string]any{}, nil).want(t, "attach A", 200, "")
		devRequest(t, dev, "POST", "/v1/runs/run-a/events", tenantA,
			map[string]any{"cursor": sa.body["cursor"], "events": []any{map[string]any{"data": "wake"}}}, nil).want(t, "append A", 200, "")
		wg.Wait()
		close(polls)
		for c := range polls {
			if c.want(t, "A's long poll", 200, ""); len(c.body["events"].([]any)) != 1 {
				t.Fatalf("A's long poll woke with %v", c.body)
			}
		}
		probe().want(t, "A's places given back", 200, "")

		t.Logf("tenant B append latency, %d appends each: A idle p50 %.2f ms p99 %.2f ms (loadavg %s); A at its bound of 3 waiting p50 %.2f ms p99 %.2f ms (loadavg %s)",
			n, msOf(latency.Percentile(idle, 50)), msOf(latency.Percentile(idle, 99)), loadIdle, msOf(latency.Percentile(busy, 50)), msOf(latency.Percentile(busy, 99)), loadBusy)
	}, "--max-waiting", "3", "--no-ship") // B's run is driven by its pumps: a shipper would end it first
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// rawRequest writes request on a fresh connection to dev and reads one answer.
func rawRequest(t *testing.T, dev *clitest.Dev, request string) (*http.Response, map[string]any) {
	t.Helper()
	addr := strings.TrimPrefix(dev.URL, "http://")
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(clitest.Deadline))
	if _, err := io.WriteString(c, strings.ReplaceAll(request, "HOST", addr)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", request, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(raw) > 0 && json.Unmarshal(raw, &m) != nil {
		t.Fatalf("%q: %d %q is not JSON", request, resp.StatusCode, raw)
	}
	return resp, m
}

// TestDevMalformedAndOrigins: a real `sandkeep dev` answers a bad %-escape in the path
// or the query with problem+json 400 invalid (they were a plain-text 400 and a 200 with
// the default limit), a browser of a foreign origin with 403 forbidden-origin even with
// the tenant header (it was 401 unauthenticated), and serves an origin given with
// --allow-origin, preflight and CORS headers included.
func TestDevMalformedAndOrigins(t *testing.T) {
	t.Parallel()
	const allowed = "http://localhost:5173"
	dev := clitest.StartDev(t, nil, "--allow-origin", allowed)
	for _, target := range []string{"/v1/runs/%zz", "/v1/runs/a%E0%A4%A/events", "/v1/runs?limit=%zz", "/v1/runs/r/events?waitMs=%2"} {
		resp, m := rawRequest(t, dev, "GET "+target+" HTTP/1.1\r\nHost: HOST\r\n\r\n")
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != httpapi.ProblemContentType || m["code"] != "invalid" || m["requestId"] == "" {
			t.Errorf("GET %s: %d %q %v", target, resp.StatusCode, resp.Header.Get("Content-Type"), m)
		}
	}
	foreign := devRequest(t, dev, "GET", "/v1/runs", "acme", nil, map[string]string{"Origin": "http://localhost:5174"}).
		want(t, "foreign origin", 403, "forbidden-origin")
	if d, _ := foreign.body["detail"].(string); !strings.Contains(d, "--allow-origin http://localhost:5174") {
		t.Errorf("the refusal does not say how to allow the origin: %q", d)
	}
	ok := devRequest(t, dev, "POST", "/v1/runs", "acme", startBodyFor("run-o"), map[string]string{"Origin": allowed}).want(t, "allowed origin", 200, "")
	if ok.header.Get("Access-Control-Allow-Origin") != allowed {
		t.Errorf("allowed origin's answer without Access-Control-Allow-Origin: %v", ok.header)
	}
	resp, _ := rawRequest(t, dev, "OPTIONS /v1/runs HTTP/1.1\r\nHost: HOST\r\nOrigin: "+allowed+
		"\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type, x-sandkeep-tenant\r\n\r\n")
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != allowed ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), httpapi.TenantHeader) {
		t.Errorf("preflight of the allowed origin: %d %v", resp.StatusCode, resp.Header)
	}
	if code, _, stderr := clitest.Run(t, nil, clitest.Binary(t), "dev", "--allow-origin", "localhost:5173"); code != 2 || !strings.Contains(stderr, "origin") {
		t.Errorf("dev --allow-origin localhost:5173: exit %d: %s", code, stderr)
	}
}
