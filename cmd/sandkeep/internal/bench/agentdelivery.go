package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/driver"
	"github.com/sandkeep/sandkeep/shared/host/driver/apitransport"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// Defaults of the agent delivery section.
const (
	DefaultAgentLines  = 60
	agentInterval      = 100 * time.Millisecond // between two lines of the agent
	agentBatches       = 20                     // pumped batches measured for calls per batch
	DefaultAgentSilent = 12 * time.Second       // the silent drive's window (over one pump wait)
	// agentReaderWait is the long poll a viewer uses (the CLI's: the API's maximum).
	agentReaderWait = wire.MaxWaitMs * time.Millisecond
)

// AgentDelivery is the agent delivery section of one backend: an agent's lines travel journal →
// pump (the API's, driven by driver.Drive over apitransport.Transport, default settings) →
// the log → a long-polling reader (GET …/events?waitMs=20000).
type AgentDelivery struct {
	Backend string // "memory" or "dynalite"
	// Delay is, per line, from the agent writing it (its own clock reading, in the line) to
	// the reader receiving it.
	Delay *OpStats
	// Batches pumped while nothing else ran, and the DynamoDB calls they made (dynalite).
	Batches      int
	BatchCalls   int
	BatchByAPI   map[string]int
	BatchEvents  int
	SilentWindow time.Duration
	SilentPumps  int            // pump requests of a drive whose agent is silent
	SilentBeats  int            // heartbeats in the same window
	SilentDynamo int            // DynamoDB calls in the same window (dynalite)
	SilentByAPI  map[string]int // by API
	HasDynamo    bool
}

// Aims of the agent delivery section.
const (
	AimDeliveryMemory   = 100 * time.Millisecond
	AimDeliveryDynalite = 300 * time.Millisecond
	AimSilentPumps      = 2.0 // per second
)

// PerSecond is n over window.
func PerSecond(n int, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return float64(n) / window.Seconds()
}

// routeCounter counts the API requests by the route's last path segment.
type routeCounter struct {
	next http.Handler
	mu   sync.Mutex
	n    map[string]int
}

func (c *routeCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	seg := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	c.mu.Lock()
	c.n[r.Method+" "+seg]++
	c.mu.Unlock()
	c.next.ServeHTTP(w, r)
}

func (c *routeCounter) count(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// agentEnv is one backend's API, served in this process over loopback HTTP.
type agentEnv struct {
	name   string
	routes *routeCounter
	client *apiclient.Client
	dynamo func() map[string]int // DynamoDB calls so far by API (nil: memory)
	lines  int
	// silentFor is the silent drive's window.
	silentFor time.Duration
	logger    *slog.Logger
	stopAll   func()
}

// newAgentEnv serves the whole API (dev authentication) over backend with local-process
// sandboxes under a temporary directory; push (nil: none) serves GET /v1/subscribe.
func newAgentEnv(name string, backend contract.Backend, dynamo func() map[string]int, lines int, quiet *slog.Logger, push *httpapi.PushConfig) (*agentEnv, error) {
	dir, err := os.MkdirTemp("", "sandkeep-bench-")
	if err != nil {
		return nil, err
	}
	k, err := keeper.New(keeper.Config{Backend: backend, Providers: []contract.Provider{localprocess.New(dir)}, Logger: quiet})
	if err != nil {
		return nil, err
	}
	key := []byte("bench-cursor-key-" + randHex(16))
	rc := &routeCounter{next: httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{}, CursorKey: key, Logger: quiet, Push: push}), n: map[string]int{}}
	base, stop, err := loopbackServer(rc)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	c, err := apiclient.New(apiclient.Config{BaseURL: base, Tenant: Tenant})
	if err != nil {
		stop()
		return nil, err
	}
	return &agentEnv{name: name, routes: rc, client: c, dynamo: dynamo, lines: lines, logger: quiet,
		stopAll: func() { k.Drain(); stop(); _ = os.RemoveAll(dir) }}, nil
}

// dynamoDelta returns the DynamoDB calls since before, in total and by API.
func (e *agentEnv) dynamoDelta(before map[string]int) (int, map[string]int) {
	if e.dynamo == nil {
		return 0, nil
	}
	now := e.dynamo()
	by := map[string]int{}
	total := 0
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			by[k] = d
			total += d
		}
	}
	return total, by
}

func (e *agentEnv) dynamoNow() map[string]int {
	if e.dynamo == nil {
		return nil
	}
	return e.dynamo()
}

// launch starts a run and its agent; it returns the transport and the start's answer.
func (e *agentEnv) launch(ctx context.Context, runID, command string) (*apitransport.Transport, wire.StartResponse, error) {
	st, err := e.client.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
	if err != nil {
		return nil, st, fmt.Errorf("bench: start %s: %w", runID, err)
	}
	if _, err := e.client.Agent(ctx, runID, wire.AgentRequest{Cursor: st.Cursor, Command: command}); err != nil {
		return nil, st, fmt.Errorf("bench: agent of %s: %w", runID, err)
	}
	return apitransport.New(e.client, runID, st.Cursor), st, nil
}

// measure runs the three measurements of the section.
func (e *agentEnv) measure(ctx context.Context) (*AgentDelivery, error) {
	d := &AgentDelivery{Backend: e.name, Delay: newOp("agent delivery", 0, false), HasDynamo: e.dynamo != nil}
	if err := e.delay(ctx, d); err != nil {
		return nil, err
	}
	if err := e.batches(ctx, d); err != nil {
		return nil, err
	}
	if err := e.silent(ctx, d); err != nil {
		return nil, err
	}
	return d, nil
}

// delay: the agent prints its clock every agentInterval; a drive pumps (defaults) and a
// reader long-polls; each line's delay is the reader's clock minus the line's.
func (e *agentEnv) delay(ctx context.Context, d *AgentDelivery) error {
	cmd := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do date +%%s%%N; i=$((i+1)); sleep %.3f; done`, e.lines, agentInterval.Seconds())
	tr, st, err := e.launch(ctx, "delivery", cmd)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	driven := make(chan error, 1)
	go func() {
		res, err := driver.Drive(dctx, tr, driver.Config{RunID: "delivery", LeaseMs: st.LeaseMs, Logger: e.logger})
		if err == nil && res.Outcome != driver.Completed {
			err = fmt.Errorf("bench: the delivery run ended %s", res.Outcome)
		}
		driven <- err
	}()
	var after int64
	for {
		page, err := e.client.ReadEvents(ctx, "delivery", apiclient.ReadOptions{After: after, Limit: wire.MaxReadLimit, Wait: agentReaderWait})
		got := time.Now()
		if err != nil {
			return fmt.Errorf("bench: read: %w", err)
		}
		for _, ev := range page.Events {
			var ns int64
			if err := json.Unmarshal(ev.Data, &ns); err != nil {
				return fmt.Errorf("bench: line %s is not the agent's clock", ev.Data)
			}
			d.Delay.Samples = append(d.Delay.Samples, got.Sub(time.Unix(0, ns)))
		}
		after = page.Next
		if page.Closed {
			break
		}
	}
	if err := <-driven; err != nil {
		return err
	}
	if n := len(d.Delay.Samples); n != e.lines {
		return fmt.Errorf("bench: the reader received %d lines, want %d", n, e.lines)
	}
	return nil
}

// batches: pump requests issued one at a time (default wait) while nothing else runs; the
// DynamoDB calls of those that stored events, per batch.
func (e *agentEnv) batches(ctx context.Context, d *AgentDelivery) error {
	lines := agentBatches * 2
	cmd := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo '{"line":'$i'}'; i=$((i+1)); sleep %.3f; done; sleep 30`, lines, agentInterval.Seconds())
	tr, _, err := e.launch(ctx, "batches", cmd)
	if err != nil {
		return err
	}
	defer e.abort(ctx, tr)
	d.BatchByAPI = map[string]int{}
	// A loaded machine pumps slower than the agent prints: fewer batches of more lines each
	// (the figures are per batch), so the agent's last line also ends the measure.
	for attempts := 0; d.Batches < agentBatches && d.BatchEvents < lines && attempts < 4*agentBatches; attempts++ {
		before := e.dynamoNow()
		pr, err := tr.Pump(ctx, agentrun.MaxPumpWait)
		if err != nil {
			return fmt.Errorf("bench: pump: %w", err)
		}
		if pr.Appended == 0 {
			continue
		}
		n, by := e.dynamoDelta(before)
		d.Batches++
		d.BatchEvents += pr.Appended
		d.BatchCalls += n
		for k, v := range by {
			d.BatchByAPI[k] += v
		}
	}
	if d.Batches < agentBatches && d.BatchEvents < lines {
		return fmt.Errorf("bench: only %d pumped batches (%d lines)", d.Batches, d.BatchEvents)
	}
	return nil
}

// silent: a drive of a silent agent, with the default pump wait: pump requests, heartbeats
// and DynamoDB calls per second.
func (e *agentEnv) silent(ctx context.Context, d *AgentDelivery) error {
	tr, st, err := e.launch(ctx, "silent", "sleep 60")
	if err != nil {
		return err
	}
	defer e.abort(ctx, tr)
	// Let the launch settle: the first pumps see the journal appear.
	if _, err := tr.Pump(ctx, 0); err != nil {
		return fmt.Errorf("bench: pump: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, e.silentFor)
	defer cancel()
	pumps0, beats0, dyn0 := e.routes.count("POST pump"), e.routes.count("POST heartbeat"), e.dynamoNow()
	t0 := time.Now()
	res, err := driver.Drive(dctx, tr, driver.Config{RunID: "silent", LeaseMs: st.LeaseMs, Logger: e.logger})
	d.SilentWindow = time.Since(t0)
	if err == nil || ctx.Err() != nil {
		return fmt.Errorf("bench: the silent drive ended %s (%v)", res.Outcome, err)
	}
	d.SilentPumps = e.routes.count("POST pump") - pumps0
	d.SilentBeats = e.routes.count("POST heartbeat") - beats0
	d.SilentDynamo, d.SilentByAPI = e.dynamoDelta(dyn0)
	return nil
}

// abort ends a measurement's run (killing its agent) so nothing outlives the section.
func (e *agentEnv) abort(ctx context.Context, tr *apitransport.Transport) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if _, err := tr.Finish(fctx, keeper.FinishInput{Status: contract.StatusAborted}); err != nil && !errors.Is(err, contract.ErrTerminalRun) {
		fmt.Fprintf(os.Stderr, "bench: abort a measurement run: %v\n", err)
	}
}

// deliveries runs the section on the in-memory backend and on a fresh table of the endpoint.
func (e *env) agentDeliveries(ctx context.Context, table string) ([]*AgentDelivery, error) {
	var out []*AgentDelivery
	for _, name := range []string{"memory", "dynalite"} {
		var backend contract.Backend = memstore.New()
		var dyn func() map[string]int
		if name == "dynalite" {
			backend = dynamostore.New(dynamostore.Config{Client: e.client, Table: table})
			dyn = e.counter.Snapshot
		}
		fmt.Fprintf(e.cfg.Progress, "bench: agent delivery on %s (%d lines every %s, then %d pumped batches, then %s of a silent agent)\n",
			name, e.cfg.AgentLines, agentInterval, agentBatches, e.cfg.AgentSilent)
		de, err := newAgentEnv(name, backend, dyn, e.cfg.AgentLines, e.quiet, nil)
		if err == nil {
			de.silentFor = e.cfg.AgentSilent
		}
		if err != nil {
			return nil, err
		}
		d, err := de.measure(ctx)
		de.stopAll()
		if err != nil {
			return nil, fmt.Errorf("bench: agent delivery on %s: %w", name, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// markdownAgentDelivery writes the agent delivery section (it extends the long-poll rows,
// whose last column is the idle reader's DynamoDB read rate).
func markdownAgentDelivery(b io.Writer, ds []*AgentDelivery) {
	if len(ds) == 0 {
		return
	}
	fmt.Fprint(b, "\n### Agent delivery: agent line → pump → long-polling reader\n\n")
	fmt.Fprint(b, "The long-poll rows above, with a real agent in front: a local-process agent writes its clock every 100 ms; `driver.Drive` over `apitransport.Transport` pumps it through the HTTP API (loopback, default pump wait); a reader long-polls `waitMs=20000`. Calls per batch: pump requests issued one at a time, nothing else running. Silent: a drive of an agent that prints nothing. The idle reader's DynamoDB reads per second are the long-poll rows' last column.\n\n")
	fmt.Fprint(b, "| backend | lines | delivery p50 ms | p99 ms | aim p50 | DynamoDB calls / pumped batch | pumps / s, agent silent | heartbeats / s | DynamoDB calls / s, silent drive | aim pumps / s |\n")
	fmt.Fprint(b, "|---|---:|---:|---:|---|---|---:|---:|---|---|\n")
	for _, d := range ds {
		aim := AimDeliveryMemory
		if d.Backend != "memory" {
			aim = AimDeliveryDynalite
		}
		batch, silentDyn := "— (no DynamoDB)", "—"
		if d.HasDynamo {
			batch = fmt.Sprintf("%.2f (%s; %.1f events / batch)", float64(d.BatchCalls)/float64(max(d.Batches, 1)),
				byAPICell(d.BatchByAPI, d.Batches), float64(d.BatchEvents)/float64(max(d.Batches, 1)))
			silentDyn = fmt.Sprintf("%.2f (%s in %.1f s)", PerSecond(d.SilentDynamo, d.SilentWindow), byAPICell(d.SilentByAPI, 1), d.SilentWindow.Seconds())
		}
		pumps := PerSecond(d.SilentPumps, d.SilentWindow)
		fmt.Fprintf(b, "| %s | %d | %s | %s | ≤ %d ms: %s | %s | %.2f | %.2f | %s | ≤ %.0f: %s |\n",
			d.Backend, d.Delay.N(), ms(d.Delay.Percentile(50)), ms(d.Delay.Percentile(99)), aim.Milliseconds(),
			yesNo(d.Delay.Percentile(50) <= aim), batch, pumps, PerSecond(d.SilentBeats, d.SilentWindow),
			silentDyn, AimSilentPumps, yesNo(pumps <= AimSilentPumps))
	}
}
