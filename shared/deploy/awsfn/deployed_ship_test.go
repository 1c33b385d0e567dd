package awsfn

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/latency"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/proctest"
)

// hostedLocal is local-process under another name, so the functions launch agents on it
// (they refuse local-process itself, which would run them on the function's host).
type hostedLocal struct{ *localprocess.Provider }

func (hostedLocal) Name() string { return "hosted" }

// shipGateway is the Ship function's URL in front of it for a shipper (docs/design.md §9):
// each HTTP request becomes the function URL's event (no route, no authorizer), and the
// function's answer becomes the HTTP answer.
func shipGateway(t *testing.T, fn *API) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(&lambdaevent.Gateway{Handler: fn.Handle}) // no Route: a function URL
	t.Cleanup(srv.Close)
	return srv
}

// shiftClock is the wall clock moved forward by hand: a lease lapses without waiting it out.
type shiftClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *shiftClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *shiftClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off += d
}

// shipDeployment is the deployed functions in this process on one dynalite table, their
// provider local-process under another name, the Ship function behind shipGateway at the
// PublicUrl every function is told (template.yaml's parameter; the reaper, without it, the
// API's own URL), and the functions' clock movable.
type shipDeployment struct {
	t                     *testing.T
	dir                   string
	clock                 *shiftClock
	resolve, wait, cancel *API
	reaper                *ReaperHandler
	lease                 time.Duration
	mu                    sync.Mutex
	runs                  []string // whose agent and shipper groups are killed at the end
}

func newShipDeployment(t *testing.T) *shipDeployment {
	t.Helper()
	client := dynamotest.Client(t)
	table := dynamotest.FreshTable(t, client)
	dir, err := os.MkdirTemp("/tmp", "sandkeep-deployed-ship-")
	if err != nil {
		t.Fatal(err)
	}
	d := &shipDeployment{t: t, dir: dir, clock: &shiftClock{}}
	t.Cleanup(func() {
		// Every agent and shipper leads its own group: none outlives the test.
		for _, runID := range d.runs {
			for _, ext := range []string{journal.ExtPID, journal.ExtShipPID} {
				if g := d.pidOf(runID, ext); g > 1 { // never 0 or -1: kill(0), kill(-1) reach far more
					_ = syscall.Kill(-g, syscall.SIGKILL)
				}
			}
		}
		os.RemoveAll(dir)
	})
	deps := Deps{DynamoDB: client, Provider: hostedLocal{localprocess.New(dir)}, Logger: NewLogger(io.Discard, ""), Now: d.clock.Now}
	env := map[string]string{
		EnvTable: table, EnvProvider: ProviderLocalProcess, EnvSandboxDir: dir, EnvCursorKey: "deployed ship test key, long enough",
		EnvTrustedRoleARNs: "arn:aws:iam::123456789012:role/service/app", EnvDetachedTTLSeconds: "900",
	}
	api := func(fn Function) *API {
		cfg, err := Load(t.Context(), fn, envOf(env), nil)
		if err != nil {
			t.Fatal(err)
		}
		a, err := NewAPI(cfg, deps)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	env[EnvPublicURL] = shipGateway(t, api(Ship)).URL
	d.resolve, d.wait, d.cancel = api(Resolve), api(Wait), api(Cancel)
	rcfg, err := Load(t.Context(), Reaper, envOf(env), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.reaper, err = NewReaper(rcfg, deps, ReaperSweep); err != nil {
		t.Fatal(err)
	}
	d.lease = rcfg.DriverLease
	return d
}

// send is one API Gateway event to fn, in tenant acme; it wants want.
func (d *shipDeployment) send(fn *API, want int, method, key, path, query string, body any) map[string]any {
	d.t.Helper()
	resp, m := call(d.t, fn, event(method, key, path, query, body, map[string]string{"x-sandkeep-tenant": "acme"}, nil))
	if resp.StatusCode != want {
		d.t.Fatalf("%s: %d %v", key, resp.StatusCode, m)
	}
	return m
}

// launch starts runID and its agent through the Resolve function; the agent is shipped.
func (d *shipDeployment) launch(runID, agent string) {
	d.t.Helper()
	d.mu.Lock()
	d.runs = append(d.runs, runID)
	d.mu.Unlock()
	st := d.send(d.resolve, 200, "POST", "POST /v1/runs", "/v1/runs", "",
		map[string]any{"runId": runID, "threadId": "thread-" + runID, "sandbox": map[string]any{"id": "default", "provider": "hosted"}})
	a := d.send(d.resolve, 200, "POST", "POST /v1/runs/{runId}/agent", "/v1/runs/"+runID+"/agent", "", map[string]any{"cursor": st["cursor"], "command": agent})
	if a["shipping"] != "sandbox" {
		d.t.Fatalf("agent of %s: %v, want shipping sandbox", runID, a)
	}
}

// lines reads runID's log through the Wait function until want events are there.
func (d *shipDeployment) lines(runID string, want int) []string {
	d.t.Helper()
	var got []string
	after := 0.0
	for deadline := time.Now().Add(20 * time.Second); len(got) < want; {
		if time.Now().After(deadline) {
			d.t.Fatalf("%s: %d lines stored, want %d: %q", runID, len(got), want, got)
		}
		m := d.send(d.wait, 200, "GET", "GET /v1/runs/{runId}/events", "/v1/runs/"+runID+"/events", fmt.Sprintf("after=%d&waitMs=1000", int64(after)), nil)
		for _, e := range m["events"].([]any) {
			b, _ := json.Marshal(e.(map[string]any)["data"])
			got = append(got, strings.Trim(string(b), `"`))
		}
		after = m["next"].(float64)
	}
	return got
}

// status is runID's status and whether its log is closed, read through the functions.
func (d *shipDeployment) status(runID string) (string, bool) {
	d.t.Helper()
	g := d.send(d.resolve, 200, "GET", "GET /v1/runs/{runId}", "/v1/runs/"+runID, "", nil)
	m := d.send(d.wait, 200, "GET", "GET /v1/runs/{runId}/events", "/v1/runs/"+runID+"/events", "after=0", nil)
	return fmt.Sprint(g["run"].(map[string]any)["status"]), m["closed"] == true
}

// pidOf is the pid a file of runID's (journal.ExtPID, journal.ExtShipPID) names, 0 if none.
func (d *shipDeployment) pidOf(runID, ext string) int {
	var pid int
	_ = filepath.WalkDir(d.dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if _, id, x, ok := journal.SplitName(e.Name()); ok && id == runID && x == ext {
				b, _ := os.ReadFile(p)
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
		}
		return nil
	})
	return pid
}

// TestDeployedReaperReships: the Reaper function, built from the environment
// template.yaml gives it (the API's URL, the cursor key), replaces a shipped run's dead
// shipper once its driver lease lapsed, as the dev server's reaper does
// (docs/design.md §8.3): the Resolve function launches the agent with a shipper that ships through the Ship
// function; the shipper is killed, the lease lapses (the functions' clock moved), one
// scheduled sweep answers reshipped, and the new shipper stores the rest: 1..N exactly
// once, the run completed, with no host.
func TestDeployedReaperReships(t *testing.T) {
	d := newShipDeployment(t)
	const runID, n = "run-rs", 8
	gate := filepath.Join(d.dir, "gate")
	d.launch(runID, fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo $i; [ $i -ne 4 ] || while [ ! -e '%s' ]; do sleep 0.02; done; i=$((i+1)); done`, n, gate))
	d.lines(runID, 4)
	old := d.pidOf(runID, journal.ExtShipPID)
	if old <= 1 {
		t.Fatalf("no shipper pid file (%d)", old)
	}
	if err := syscall.Kill(-old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(old, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the killed shipper %d lives on", old)
		}
	}

	// The lease lapses with nobody renewing it, and the sweep meets it once its reclaimAt
	// (the lease's end rounded up to a whole lease) has passed; one sweep replaces the shipper.
	d.clock.Add(2*d.lease + time.Second)
	out, err := d.reaper.Handle(t.Context(), nil)
	if err != nil || !strings.Contains(string(out), `"runId":"run-rs"`) || !strings.Contains(string(out), `"outcome":"reshipped"`) {
		t.Fatalf("sweep: %s, %v; want run-rs reshipped", out, err)
	}
	now := d.pidOf(runID, journal.ExtShipPID)
	if now == old || now <= 1 || syscall.Kill(now, 0) != nil {
		t.Fatalf("the shipper after the sweep: pid %d (killed %d)", now, old)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := d.lines(runID, n)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s, closed := d.status(runID)
		if s == "completed" && closed {
			break
		}
		if s != "running" && s != "completed" || time.Now().After(deadline) {
			t.Fatalf("run %s (log closed %v), want completed", s, closed)
		}
	}
	if all := d.lines(runID, n); fmt.Sprint(all) != fmt.Sprint(got) || len(all) != n {
		t.Fatalf("log %q", all)
	}
	for i, g := range got {
		if g != strconv.Itoa(i+1) {
			t.Fatalf("line %d is %q: want 1..%d exactly once, in order: %q", i, g, n, got)
		}
	}
}

// deployedCancels is how many runs TestDeployedCancel cancels; its figures are a p99 only
// with -deployed-cancels 20 or more (the default keeps the test quick).
var deployedCancels = flag.Int("deployed-cancels", 3, "TestDeployedCancel: runs cancelled")

// TestDeployedCancel: a shipped run cancelled through the Cancel function with no host
// (docs/design.md §13): its handler records the cancel and kills the agent's process group
// through the provider (agentrun.Service.CancelShipped); the shipper seals and ships the
// journal through the Ship function and ends the run aborted, its log closed. The times
// from the cancel's event to the agent's group gone and to the run aborted are logged with
// the load average (docs/bench.md); the deadlines only bound the polling.
func TestDeployedCancel(t *testing.T) {
	d := newShipDeployment(t)
	var gone, aborted []time.Duration
	for i := range max(*deployedCancels, 1) {
		runID := fmt.Sprintf("run-dc%d", i)
		d.launch(runID, `echo "{\"pid\":$$}"; sleep 600; echo never`)
		d.lines(runID, 1)
		pg := d.pidOf(runID, journal.ExtPID)
		if pg <= 1 || !proctest.GroupLive(pg) {
			t.Fatalf("%s: the agent's group %d is not running", runID, pg)
		}
		t0 := time.Now()
		d.send(d.cancel, 202, "POST", "POST /v1/runs/{runId}/cancel", "/v1/runs/"+runID+"/cancel", "", map[string]any{})
		var tg, ta time.Duration
		for deadline := time.Now().Add(20 * time.Second); tg == 0 || ta == 0; time.Sleep(5 * time.Millisecond) {
			if tg == 0 && !proctest.GroupLive(pg) {
				tg = time.Since(t0)
			}
			if ta == 0 {
				if s, closed := d.status(runID); s == "aborted" && closed {
					ta = time.Since(t0)
				} else if s != "running" && s != "aborted" {
					t.Fatalf("%s: %s (log closed %v), want aborted", runID, s, closed)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: group gone after %v, aborted after %v (0: not yet)", runID, tg, ta)
			}
		}
		gone, aborted = append(gone, tg), append(aborted, ta)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("cancel → agent's group gone: %s; → aborted, log closed: %s (load %s)", latency.Summary(gone), latency.Summary(aborted), strings.TrimSpace(string(load)))
}
