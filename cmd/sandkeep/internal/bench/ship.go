package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore/callcount"
)

// Defaults and aims of the shipper section (docs/design.md §6, §8.2).
const (
	DefaultShipLines    = 60
	DefaultShipChatty   = 300
	DefaultShipSilent   = 25 * time.Second // over one shipper heartbeat (20 s)
	DefaultShipLaunches = 10
	// shipChattyEvery is the chatty agent's pace: a line every 10 ms (100 lines a second).
	shipChattyEvery = 10 * time.Millisecond

	AimShipStored        = 50 * time.Millisecond // line written → stored, p50
	AimShipProviderCalls = 1.0                   // provider calls per run-minute after launch
	AimShipRequests      = 20.0                  // API requests per 100 lines of a chatty agent
	AimShipBusy          = 2 * time.Second       // server busy time per run-minute
	AimShipLaunch        = time.Second           // the shipper's added launch time, p50
)

// Ship is the shipper section: two servers on one table and one cursor key (as two
// `sandkeep dev --table T` with SANDKEEP_CURSOR_KEY); runs are launched through A with a
// real shipper (the sh script, real curl) beside a local-process agent, and read on B.
type Ship struct {
	Lines int
	// Delivery: agent line → reader, per reader (long poll on B, push on B, push on A).
	Delivery []*OpStats
	// Stored: agent line → stored by server A (its keeper's write landed).
	Stored *OpStats
	// Runs are the shipped runs measured after launch: provider calls, requests, DynamoDB
	// calls and the ship routes' handler time.
	Runs []*ShipRun
	// Launch: the agent route's time through A (a shipper started) and through B (no
	// shipper: B has no public URL, like `sandkeep dev --no-ship`).
	LaunchShip, LaunchNoShip *OpStats
	// Deployed is the deployed push path (docs/design.md §8.1).
	Deployed *Deployed
}

// ShipRun is what one shipped run cost server A from the agent route's answer to the
// run's end.
type ShipRun struct {
	Name        string
	Lines       int
	Window      time.Duration // agent route's answer → the log closed
	Provider    int
	ProviderBy  map[string]int
	Requests    int            // ship route requests (probe, ship, end) at A
	RequestsBy  map[string]int // every request at A by route, the ship routes among them
	Dynamo      int            // DynamoDB calls of server A
	DynamoBy    map[string]int
	Busy        time.Duration // handler time of the ship routes at A
	BusyMax     time.Duration // the longest ship request
	Status      string
	LinesStored int
}

// busyCounter counts an API's requests and sums their handler time, by route (method and
// last path segment).
type busyCounter struct {
	next http.Handler
	mu   sync.Mutex
	n    map[string]int
	busy map[string]time.Duration
	max  map[string]time.Duration
}

func newBusyCounter(next http.Handler) *busyCounter {
	return &busyCounter{next: next, n: map[string]int{}, busy: map[string]time.Duration{}, max: map[string]time.Duration{}}
}

// routeKey names a request's route as the report does: "POST ship", "POST end", "GET ship".
func routeKey(r *http.Request) string {
	return r.Method + " " + r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
}

func (c *busyCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := routeKey(r)
	t0 := time.Now()
	c.next.ServeHTTP(w, r)
	d := time.Since(t0)
	c.mu.Lock()
	c.n[key]++
	c.busy[key] += d
	c.max[key] = max(c.max[key], d)
	c.mu.Unlock()
}

// awaitCount waits (bounded) until key has been answered n times: a request counts once
// its handler returned, which may be after what it wrote was seen.
func (c *busyCounter) awaitCount(ctx context.Context, key string, n int) error {
	for deadline := time.Now().Add(30 * time.Second); ; {
		c.mu.Lock()
		got := c.n[key]
		c.mu.Unlock()
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("bench: %d %s requests answered, want %d", got, key, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type busySnap struct {
	n    map[string]int
	busy map[string]time.Duration
}

func (c *busyCounter) snap() busySnap {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := busySnap{n: map[string]int{}, busy: map[string]time.Duration{}}
	for k, v := range c.n {
		s.n[k] = v
		s.busy[k] = c.busy[k]
	}
	return s
}

// shipRouteKeys are the ship routes' keys (docs/design.md §8.2).
var shipRouteKeys = []string{"GET ship", "POST ship", "POST end"}

// landedLog records when server A's keeper landed each log write (keeper.LogPush): the
// time a line is stored.
type landedLog struct {
	mu sync.Mutex
	at []landing
}

type landing struct {
	run  string
	last int64
	at   time.Time
}

// Landed is keeper.LogPush.
func (l *landedLog) Landed(_ context.Context, key keeper.RunKey, w keeper.Landing) {
	now := time.Now()
	l.mu.Lock()
	l.at = append(l.at, landing{key.RunID, w.Last, now})
	l.mu.Unlock()
}

// storedAt is when the write holding offset of run landed (false: unknown).
func (l *landedLog) storedAt(run string, offset int64) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.at {
		if x.run == run && x.last >= offset {
			return x.at, true
		}
	}
	return time.Time{}, false
}

// shipServer is one `sandkeep dev`-equivalent server: httpapi.New over its own keeper and
// store client (its DynamoDB calls counted apart) and its own local-process provider.
type shipServer struct {
	base    string
	k       *keeper.Keeper
	client  *apiclient.Client
	routes  *busyCounter
	calls   *callcount.Counter
	prov    *countedLocal
	landed  *landedLog
	stopAll func()
}

// The public URLs newShipServer takes besides an address.
const (
	publicSelf = "self" // its own address (`sandkeep dev`'s default)
	publicNone = ""     // none: no shipper is started (`sandkeep dev --no-ship`)
)

// newShipServer serves the API as `sandkeep dev` does (dev authentication, push with the
// dev default poll) over table, signing with key, giving shippers public (publicSelf,
// publicNone or an address).
func (e *env) newShipServer(table string, key []byte, public string) (*shipServer, error) {
	dir, err := os.MkdirTemp("", "sandkeep-bench-ship-")
	if err != nil {
		return nil, err
	}
	s := &shipServer{calls: callcount.New(), prov: newCountedLocal(dir), landed: &landedLog{}}
	client := dynamostore.LocalClient(e.cfg.Endpoint, s.calls.Attach)
	backend := dynamostore.New(dynamostore.Config{Client: client, Table: table})
	s.k, err = keeper.New(keeper.Config{Backend: backend, Providers: []contract.Provider{s.prov}, Logger: e.quiet, Push: s.landed})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	ln, base, err := loopbackListener()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if public == publicSelf {
		public = base
	}
	s.base = base
	s.routes = newBusyCounter(httpapi.New(httpapi.Config{Keeper: s.k, Auth: httpapi.DevAuth{}, CursorKey: key, Logger: e.quiet,
		PublicURL: public, Push: &httpapi.PushConfig{PollEvery: devPushPoll}}))
	stop := serveOn(ln, s.routes)
	if s.client, err = apiclient.New(apiclient.Config{BaseURL: base, Tenant: Tenant}); err != nil {
		stop()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.stopAll = func() {
		s.k.Drain()
		stop()
		// Nothing launched may outlive the section (every run ended already).
		_, _, _ = s.prov.StopStarted()
		_ = os.RemoveAll(dir)
	}
	return s, nil
}

// shipSection runs the shipper section on a fresh table.
func (e *env) shipSection(ctx context.Context, table string) (*Ship, error) {
	key := []byte("bench-shared-cursor-key-" + randHex(16))
	a, err := e.newShipServer(table, key, publicSelf)
	if err != nil {
		return nil, err
	}
	defer a.stopAll()
	b, err := e.newShipServer(table, key, publicNone)
	if err != nil {
		return nil, err
	}
	defer b.stopAll()
	out := &Ship{Lines: e.cfg.ShipLines}

	fmt.Fprintf(e.cfg.Progress, "bench: shipper delivery (%d lines every %s, shipped through server A, read on server B)\n", e.cfg.ShipLines, agentInterval)
	run, err := e.shipDelivery(ctx, a, b, out)
	if err != nil {
		return nil, fmt.Errorf("bench: shipper delivery: %w", err)
	}
	out.Runs = append(out.Runs, run)

	fmt.Fprintf(e.cfg.Progress, "bench: a chatty shipped agent (%d lines, one every %s)\n", e.cfg.ShipChatty, shipChattyEvery)
	cmd := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo '{"n":'$i'}'; i=$((i+1)); sleep %.3f; done`, e.cfg.ShipChatty, shipChattyEvery.Seconds())
	if run, err = e.shipRun(ctx, a, b, "chatty", "ship-chatty-"+randHex(4), cmd, e.cfg.ShipChatty); err != nil {
		return nil, fmt.Errorf("bench: chatty shipped run: %w", err)
	}
	out.Runs = append(out.Runs, run)

	fmt.Fprintf(e.cfg.Progress, "bench: a silent shipped agent (%s)\n", e.cfg.ShipSilent)
	cmd = fmt.Sprintf("sleep %.3f", e.cfg.ShipSilent.Seconds())
	if run, err = e.shipRun(ctx, a, b, "silent", "ship-silent-"+randHex(4), cmd, 0); err != nil {
		return nil, fmt.Errorf("bench: silent shipped run: %w", err)
	}
	out.Runs = append(out.Runs, run)

	fmt.Fprintf(e.cfg.Progress, "bench: %d launches with a shipper (server A) and without (server B)\n", e.cfg.ShipLaunches)
	if err := e.shipLaunches(ctx, a, b, out); err != nil {
		return nil, fmt.Errorf("bench: launches: %w", err)
	}
	fmt.Fprintf(e.cfg.Progress, "bench: the deployed push path (%d lines shipped to the Ship function, pushed through a management endpoint stand-in; then %s idle)\n", e.cfg.ShipLines, e.cfg.PushIdle)
	if out.Deployed, err = e.deployedSection(ctx, table); err != nil {
		return nil, fmt.Errorf("bench: deployed push path: %w", err)
	}
	return out, nil
}

// counters is server A's counts at one moment.
type counters struct {
	prov   map[string]int
	routes busySnap
	dynamo map[string]int
	t      time.Time
}

func (s *shipServer) counters() counters {
	return counters{prov: s.prov.Counts(), routes: s.routes.snap(), dynamo: s.calls.Snapshot(), t: time.Now()}
}

// since fills r with what A did from c0 to now.
func (s *shipServer) since(r *ShipRun, c0 counters) {
	c1 := s.counters()
	r.Window = c1.t.Sub(c0.t)
	r.Provider, r.ProviderBy = diffCounts(c0.prov, c1.prov)
	_, r.RequestsBy = diffCounts(c0.routes.n, c1.routes.n)
	r.Dynamo, r.DynamoBy = diffCounts(c0.dynamo, c1.dynamo)
	for _, k := range shipRouteKeys {
		r.Requests += r.RequestsBy[k]
		r.Busy += c1.routes.busy[k] - c0.routes.busy[k]
	}
	r.BusyMax = 0
	s.routes.mu.Lock()
	for _, k := range shipRouteKeys {
		r.BusyMax = max(r.BusyMax, s.routes.max[k])
	}
	s.routes.mu.Unlock()
}

// awaitEnd long-polls runID on s (the other server: its reads are not A's) until the log
// closes; it returns the lines read and the run's status.
func awaitEnd(ctx context.Context, s *shipServer, runID string) (int, string, error) {
	var after int64
	n := 0
	deadline := time.Now().Add(5 * time.Minute)
	for {
		page, err := s.client.ReadEvents(ctx, runID, apiclient.ReadOptions{After: after, Limit: wire.MaxReadLimit, Wait: agentReaderWait})
		if err != nil {
			return n, "", err
		}
		n += len(page.Events)
		after = page.Next
		if page.Closed {
			break
		}
		if time.Now().After(deadline) {
			return n, "", fmt.Errorf("%s: the log did not close within 5 minutes", runID)
		}
	}
	rec, err := s.client.GetRun(ctx, runID)
	if err != nil {
		return n, "", err
	}
	return n, string(rec.Status), nil
}

// shipRun launches command through a, waits on b for the end, and counts what a did after
// the agent route answered.
func (e *env) shipRun(ctx context.Context, a, b *shipServer, name, runID, command string, lines int) (*ShipRun, error) {
	st, err := a.client.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", runID, err)
	}
	r := &ShipRun{Name: name, Lines: lines}
	ag, err := a.client.Agent(ctx, runID, wire.AgentRequest{Cursor: st.Cursor, Command: command})
	if err != nil {
		return nil, fmt.Errorf("agent of %s: %w", runID, err)
	}
	if ag.Shipping != wire.ShippingSandbox {
		return nil, fmt.Errorf("the agent of %s is shipped by %q", runID, ag.Shipping)
	}
	// The shipper's probe happened inside the agent route; what follows is the run's own.
	c0 := a.counters()
	if r.LinesStored, r.Status, err = awaitEnd(ctx, b, runID); err != nil {
		return nil, err
	}
	if err := a.routes.awaitCount(ctx, "POST end", c0.routes.n["POST end"]+1); err != nil {
		return nil, err
	}
	a.since(r, c0)
	if r.LinesStored != lines || r.Status != string(contract.StatusCompleted) {
		return nil, fmt.Errorf("%s: %d lines stored (want %d), status %s", runID, r.LinesStored, lines, r.Status)
	}
	return r, nil
}

// shipDelivery: the agent writes its clock every agentInterval; its shipper ships through
// A; a long-polling reader and a push subscriber on B and a push subscriber on A receive
// each line. Also when A stored each line (A's keeper's landed writes).
func (e *env) shipDelivery(ctx context.Context, a, b *shipServer, out *Ship) (*ShipRun, error) {
	runID := "ship-delivery-" + randHex(4)
	st, err := a.client.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	poll := newOp("long poll on B", 0, false)
	pushB := newOp("push on B", 0, false)
	pushA := newOp("push on A", 0, false)
	out.Stored = newOp("stored by A", 0, false)
	out.Delivery = []*OpStats{poll, pushB, pushA}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 3)
	clock := func(ev contract.Event) (time.Time, error) {
		var ns int64
		if err := json.Unmarshal(ev.Data, &ns); err != nil {
			return time.Time{}, fmt.Errorf("line %s is not the agent's clock", ev.Data)
		}
		return time.Unix(0, ns), nil
	}
	var mu sync.Mutex
	var events []contract.Event // as the long poll read them
	go func() {
		var after int64
		for {
			page, err := b.client.ReadEvents(rctx, runID, apiclient.ReadOptions{After: after, Limit: wire.MaxReadLimit, Wait: agentReaderWait})
			got := time.Now()
			if err != nil {
				errs <- fmt.Errorf("long poll: %w", err)
				return
			}
			for _, ev := range page.Events {
				at, err := clock(ev)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				poll.Samples = append(poll.Samples, got.Sub(at))
				events = append(events, ev)
				mu.Unlock()
			}
			after = page.Next
			if page.Closed {
				errs <- nil
				return
			}
		}
	}()
	subscribe := func(s *shipServer, op *OpStats) *apiclient.Subscription {
		sub := s.client.Subscribe(rctx, map[string]int64{runID: 0})
		go func() {
			for {
				u, err := sub.Next(rctx)
				got := time.Now()
				if err == nil {
					err = u.Err
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", op.Name, err)
					return
				}
				for _, ev := range u.Events {
					at, err := clock(ev)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					op.Samples = append(op.Samples, got.Sub(at))
					mu.Unlock()
				}
				if u.Closed {
					if sub.Via() != apiclient.ViaPush {
						err = fmt.Errorf("%s: the watcher followed via %q", op.Name, sub.Via())
					}
					errs <- err
					return
				}
			}
		}()
		return sub
	}
	subB := subscribe(b, pushB)
	defer subB.Close()
	subA := subscribe(a, pushA)
	defer subA.Close()
	for _, sub := range []*apiclient.Subscription{subA, subB} {
		for deadline := time.Now().Add(30 * time.Second); sub.Heard().IsZero(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, errors.New("a watcher was not subscribed within 30 s")
			}
		}
	}
	cmd := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do date +%%s%%N; i=$((i+1)); sleep %.3f; done`, e.cfg.ShipLines, agentInterval.Seconds())
	ag, err := a.client.Agent(ctx, runID, wire.AgentRequest{Cursor: st.Cursor, Command: cmd})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if ag.Shipping != wire.ShippingSandbox {
		return nil, fmt.Errorf("the agent is shipped by %q", ag.Shipping)
	}
	r := &ShipRun{Name: "delivery", Lines: e.cfg.ShipLines}
	c0 := a.counters()
	timeout := time.NewTimer(5 * time.Minute)
	defer timeout.Stop()
	for range 3 {
		select {
		case err := <-errs:
			if err != nil {
				return nil, err
			}
		case <-timeout.C:
			return nil, errors.New("the readers did not see the log close within 5 minutes")
		}
	}
	if err := a.routes.awaitCount(ctx, "POST end", c0.routes.n["POST end"]+1); err != nil {
		return nil, err
	}
	a.since(r, c0)
	rec, err := b.client.GetRun(ctx, runID)
	if err != nil {
		return nil, err
	}
	r.Status, r.LinesStored = string(rec.Status), len(events)
	for _, op := range out.Delivery {
		if op.N() != e.cfg.ShipLines {
			return nil, fmt.Errorf("%s received %d lines, want %d", op.Name, op.N(), e.cfg.ShipLines)
		}
	}
	if r.Status != string(contract.StatusCompleted) {
		return nil, fmt.Errorf("the run ended %s", r.Status)
	}
	for _, ev := range events {
		at, _ := clock(ev)
		if stored, ok := a.landed.storedAt(runID, ev.Offset); ok {
			out.Stored.Samples = append(out.Stored.Samples, stored.Sub(at))
		}
	}
	return r, nil
}

// shipLaunches times the agent route through A (a shipper started beside the agent) and
// through B (none), alternately, each launch on a new run of a new thread.
func (e *env) shipLaunches(ctx context.Context, a, b *shipServer, out *Ship) error {
	out.LaunchShip = newOp("agent route, shipper started (A)", 0, false)
	out.LaunchNoShip = newOp("agent route, no shipper (B)", 0, false)
	var shipped []string
	for i := range e.cfg.ShipLaunches {
		for _, v := range []struct {
			s  *shipServer
			op *OpStats
		}{{a, out.LaunchShip}, {b, out.LaunchNoShip}} {
			runID := fmt.Sprintf("launch-%d-%s", i, randHex(4))
			st, err := v.s.client.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
				Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
			if err != nil {
				return fmt.Errorf("start %s: %w", runID, err)
			}
			t0 := time.Now()
			ag, err := v.s.client.Agent(ctx, runID, wire.AgentRequest{Cursor: st.Cursor, Command: "true"})
			v.op.Samples = append(v.op.Samples, time.Since(t0))
			if err != nil {
				return fmt.Errorf("agent of %s: %w", runID, err)
			}
			want := wire.ShippingHost
			if v.s == a {
				want = wire.ShippingSandbox
				shipped = append(shipped, runID)
			}
			if ag.Shipping != want {
				return fmt.Errorf("the agent of %s is shipped by %q, want %q", runID, ag.Shipping, want)
			}
			if v.s == b {
				// Nobody pumps it: end it (its agent exited already) so nothing is left.
				if _, err := b.client.Finish(ctx, runID, wire.FinishRequest{Cursor: st.Cursor, Status: string(contract.StatusAborted)}); err != nil && !errors.Is(err, contract.ErrTerminalRun) {
					return fmt.Errorf("finish %s: %w", runID, err)
				}
			}
		}
	}
	// Every shipped launch ends by itself (its shipper ends the run); wait for them, so no
	// shipper outlives the section.
	for _, runID := range shipped {
		if _, status, err := awaitEnd(ctx, b, runID); err != nil || status != string(contract.StatusCompleted) {
			return fmt.Errorf("launched run %s ended %q: %v", runID, status, err)
		}
	}
	return nil
}

// markdownShip writes the shipper section.
func markdownShip(b *strings.Builder, s *Ship) {
	if s == nil {
		return
	}
	b.WriteString("\n### Shipper (docs/design.md §8.2): agent line → shipper → server A → one table → reader on server B\n\n")
	b.WriteString("Two API servers in this process, each `httpapi.New` with dev authentication and push (`--push-poll 2s`), its own keeper, store client (DynamoDB calls counted apart) and local-process provider (calls counted), on one dynalite table with one cursor key (two `sandkeep dev --table T` sharing `SANDKEEP_CURSOR_KEY`). A has a public URL (its own address), B none (`--no-ship`). Runs are started and launched through A, whose agent route starts the real shipper (the sh script, real curl) beside the agent; the shipper ships through A; readers read on B (and a push watcher on A, the one-server case). In-process rather than `sandkeep dev` processes so that handler time, provider calls and each server's DynamoDB calls are counted at their source; the handler stack is the one `sandkeep dev` serves (without the viewer's static pages).\n\n")
	fmt.Fprintf(b, "| agent line (one every %s) → | lines | p50 ms | p99 ms | aim |\n|---|---:|---:|---:|---|\n", agentInterval)
	fmt.Fprintf(b, "| stored by A (the shipper's part: journal → A's append landed) | %d | %s | %s | p50 ≤ %d ms: %s |\n", s.Stored.N(),
		ms(s.Stored.Percentile(50)), ms(s.Stored.Percentile(99)), AimShipStored.Milliseconds(), yesNo(s.Stored.Percentile(50) <= AimShipStored))
	for _, d := range s.Delivery {
		aim := "—"
		switch d.Name {
		case "push on A":
			aim = fmt.Sprintf("push, dev: p50 ≤ 100, p99 ≤ 300 ms: %s", yesNo(d.Percentile(50) <= 100*time.Millisecond && d.Percentile(99) <= 300*time.Millisecond))
		case "long poll on B":
			aim = "bounded by B's 500 ms re-read of the table"
		case "push on B":
			aim = "bounded by B's 2 s poll of the table (`--push-poll`)"
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s |\n", d.Name, d.N(), ms(d.Percentile(50)), ms(d.Percentile(99)), aim)
	}
	b.WriteString("\n#### What a shipped run costs server A after its launch\n\n")
	b.WriteString("From the agent route's answer to the log's close (read on B). Requests: the ship routes' (ship, end; the probe is inside the launch). Busy: the ship routes' summed handler time at A (deployed: the Ship function's billed time).\n\n")
	b.WriteString("| run | lines | run s | provider calls | per run-minute | ship requests | per 100 lines | DynamoDB calls (A; delivery: with A's push watcher's reads) | per 100 lines | busy ms | per run-minute s | longest ship request so far ms |\n")
	b.WriteString("|---|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|\n")
	for _, r := range s.Runs {
		mins := r.Window.Minutes()
		per100 := func(n int) string {
			if r.Lines == 0 {
				return "—"
			}
			return fmt.Sprintf("%.1f", float64(n)*100/float64(r.Lines))
		}
		fmt.Fprintf(b, "| %s | %d | %.1f | %d (%s) | %.2f | %d (%s) | %s | %d (%s) | %s | %.1f | %.3f | %s |\n", r.Name, r.Lines, r.Window.Seconds(),
			r.Provider, byAPICell(r.ProviderBy, 1), float64(r.Provider)/mins, r.Requests, shipRoutesCell(r.RequestsBy), per100(r.Requests),
			r.Dynamo, byAPICell(r.DynamoBy, 1), per100(r.Dynamo), float64(r.Busy)/float64(time.Millisecond), r.Busy.Seconds()/mins, ms(r.BusyMax))
	}
	prov, mins, reqs, lines, busy := 0, 0.0, 0, 0, time.Duration(0)
	for _, r := range s.Runs {
		prov += r.Provider
		mins += r.Window.Minutes()
		busy += r.Busy
		if r.Name == "chatty" {
			reqs, lines = r.Requests, r.Lines
		}
	}
	fmt.Fprintf(b, "\nAims: provider calls per run-minute after launch ≤ %.0f: %s (%.2f over all three runs); ship requests per 100 lines of the chatty agent ≤ %.0f: %s; busy time per run-minute ≤ %.0f s: %s (%.3f s over all three runs; the silent run's row is the idle shipper's).\n",
		AimShipProviderCalls, yesNo(float64(prov)/mins <= AimShipProviderCalls), float64(prov)/mins,
		AimShipRequests, yesNo(lines > 0 && float64(reqs)*100/float64(lines) <= AimShipRequests),
		AimShipBusy.Seconds(), yesNo(busy.Seconds()/mins <= AimShipBusy.Seconds()), busy.Seconds()/mins)
	if s.LaunchShip != nil {
		added := s.LaunchShip.Percentile(50) - s.LaunchNoShip.Percentile(50)
		b.WriteString("\n#### Launch: the agent route with and without a shipper (alternating, a new run and thread each, agent `true`)\n\n")
		b.WriteString("| launch | n | p50 ms | p99 ms |\n|---|---:|---:|---:|\n")
		for _, o := range []*OpStats{s.LaunchShip, s.LaunchNoShip} {
			fmt.Fprintf(b, "| %s | %d | %s | %s |\n", o.Name, o.N(), ms(o.Percentile(50)), ms(o.Percentile(99)))
		}
		fmt.Fprintf(b, "\nThe shipper adds %s ms at p50 (aim ≤ %d ms: %s): its start, its probe of the API (curl GET /v1/ship) and the agent route's polls for its pid file.\n",
			ms(added), AimShipLaunch.Milliseconds(), yesNo(added <= AimShipLaunch))
	}
	markdownDeployed(b, s.Deployed)
}

// shipRoutesCell renders the ship routes' requests by route.
func shipRoutesCell(by map[string]int) string {
	var parts []string
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range by {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		if slices.Contains(shipRouteKeys, k) {
			parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
		}
	}
	return orDash(strings.Join(parts, ", "))
}
