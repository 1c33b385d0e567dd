package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/driver"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// Defaults of the push section (docs/design.md §8.1).
const (
	DefaultPushLines    = 60
	DefaultPushWatchers = 1000
	DefaultPushIdle     = 10 * time.Second
	// pushTenants spread the idle watchers so each tenant stays within the default cap of
	// push connections per server (wire.DefaultMaxConnections).
	pushTenants = 4
	// devPushPoll is `sandkeep dev --push-poll`'s default: a table's idle subscription
	// re-reads the log this often for writes of other processes.
	devPushPoll = 2 * time.Second
	// pushSettle separates a subscription's acknowledgement from the idle window.
	pushSettle = time.Second
)

// Push is the push section: agent line → subscribed watcher, an idle watcher's cost, many
// idle watchers on one server, and the cost model of a watched run.
type Push struct {
	Delivery []*PushDelivery // memory, dynalite
	Idle     []*PushIdle     // dynalite: push (no poll), push (dev's poll), a long poll
	Watchers []*PushWatchers // memory, dynalite (`--push-poll 0`); none when skipped
	Cost     PushCost
}

// PushDelivery is one backend's agent line → pump → log → push → subscribed watcher.
type PushDelivery struct {
	Backend  string
	Delay    *OpStats
	Messages int    // updates (push messages with events) the watcher received
	Via      string // how the watcher received them (apiclient.ViaPush)
	Reads    int    // GET …/events requests the server saw (a push watcher makes none)
}

// PushIdle is what one idle watcher cost over a window in which nothing was written.
type PushIdle struct {
	Name     string
	Window   time.Duration
	Dynamo   int            // DynamoDB calls in the window
	ByAPI    map[string]int // by API
	Requests int            // HTTP requests the watcher made in the window
	// Held is the time requests of the watcher were open on the server in the window: in a
	// deployment, function-seconds (a long poll holds a Wait function; a push connection
	// holds none).
	Held time.Duration
}

// PushWatchers is n idle watchers (each subscribed to an open run) on one server.
type PushWatchers struct {
	Backend             string
	N                   int
	Goroutines          int   // more than before they connected
	HeapBytes, RSSBytes int64 // more than before (heap in use after a GC; the process's RSS)
	Setup               time.Duration
	// Idle is the window after setup over which Dynamo, the backend's calls, were counted
	// (dynalite only: the cost of the watchers' waiting).
	Idle   time.Duration
	Dynamo map[string]int
}

// Published on-demand prices, us-east-1, as of 2026-12-01 (docs/bench.md states them).
const (
	priceWSConnMinute  = 0.25 / 1e6     // API Gateway WebSocket, per connection-minute
	priceWSMessage     = 1.00 / 1e6     // API Gateway WebSocket, per message (32 KB units)
	priceHTTPRequest   = 1.00 / 1e6     // API Gateway HTTP API, per request (a Lambda function URL: none)
	priceLambdaRequest = 0.20 / 1e6     // Lambda, per invocation
	priceLambdaGBs     = 0.0000133334   // Lambda arm64 (template.yaml's Architectures), per GB-second
	priceRRU           = 0.125 / 1e6    // DynamoDB on-demand, per read request unit
	priceWRU           = 0.625 / 1e6    // DynamoDB on-demand, per write request unit
	priceLogsGB        = 0.50 / 1e9     // CloudWatch Logs ingestion (standard class), per byte (GB as 10^9: the higher figure)
	lambdaGB           = 256.0 / 1024   // template.yaml Globals MemorySize
	costRunSeconds     = 600            // the modelled run: ten minutes
	costRunEvents      = 500            // with 500 events, one watcher
	costLongPollWaitMs = wire.MaxWaitMs // the CLI's and viewer's long poll
)

// PushCost is the cost model of a ten-minute run with 500 events and one watcher.
type PushCost struct {
	MessagesPerEvent float64 // push messages per event (measured, dynalite delivery)
	IdleReadsPush    float64 // DynamoDB reads per second of idle waiting over push (measured)
	IdleReadsPoll    float64 // the same for a long poll (measured)
	Push, LongPoll   []CostLine
}

// CostLine is one priced item of the model.
type CostLine struct {
	What     string
	Quantity float64
	Unit     string
	Dollars  float64
}

// Total sums lines.
func Total(lines []CostLine) float64 {
	t := 0.0
	for _, l := range lines {
		t += l.Dollars
	}
	return t
}

// pushSection runs the push section.
func (e *env) pushSection(ctx context.Context, table string) (*Push, error) {
	p := &Push{}
	for _, name := range []string{"memory", "dynalite"} {
		var backend contract.Backend = memstore.New()
		if name == "dynalite" {
			backend = dynamostore.New(dynamostore.Config{Client: e.client, Table: table})
		}
		fmt.Fprintf(e.cfg.Progress, "bench: push delivery on %s (%d lines every %s to a subscribed watcher)\n", name, e.cfg.PushLines, agentInterval)
		de, err := newAgentEnv(name, backend, nil, e.cfg.PushLines, e.quiet, &httpapi.PushConfig{})
		if err != nil {
			return nil, err
		}
		d, err := de.pushDelay(ctx)
		de.stopAll()
		if err != nil {
			return nil, fmt.Errorf("bench: push delivery on %s: %w", name, err)
		}
		p.Delivery = append(p.Delivery, d)
	}
	fmt.Fprintf(e.cfg.Progress, "bench: an idle watcher on dynalite, %s each: push, push with --push-poll %s, long poll\n", e.cfg.PushIdle, devPushPoll)
	for _, v := range []struct {
		name string
		poll time.Duration
		push bool
	}{{"push (`--push-poll 0`)", 0, true}, {"push (`--push-poll 2s`, dev's default on a table)", devPushPoll, true}, {"long poll (`waitMs=20000`)", 0, false}} {
		backend := dynamostore.New(dynamostore.Config{Client: e.client, Table: table})
		var pc *httpapi.PushConfig
		if v.push {
			pc = &httpapi.PushConfig{PollEvery: v.poll}
		}
		de, err := newAgentEnv("dynalite", backend, e.counter.Snapshot, 0, e.quiet, pc)
		if err != nil {
			return nil, err
		}
		idle, err := de.idle(ctx, v.name, v.push, e.cfg.PushIdle)
		de.stopAll()
		if err != nil {
			return nil, fmt.Errorf("bench: idle watcher (%s): %w", v.name, err)
		}
		p.Idle = append(p.Idle, idle)
	}
	for _, name := range []string{"memory", "dynalite"} {
		if e.cfg.PushWatchers == 0 {
			break
		}
		fmt.Fprintf(e.cfg.Progress, "bench: %d idle watchers on one server (%s)\n", e.cfg.PushWatchers, name)
		var backend contract.Backend = memstore.New()
		var dynamo func() map[string]int
		if name == "dynalite" {
			backend, dynamo = dynamostore.New(dynamostore.Config{Client: e.client, Table: table}), e.counter.Snapshot
		}
		// PollEvery 0 is `sandkeep dev --push-poll 0`: only this server's writes push.
		de, err := newAgentEnv(name, backend, dynamo, 0, e.quiet, &httpapi.PushConfig{})
		if err != nil {
			return nil, err
		}
		w, err := de.watchers(ctx, e.cfg.PushWatchers, e.cfg.PushIdle)
		de.stopAll()
		if err != nil {
			return nil, fmt.Errorf("bench: idle watchers (%s): %w", name, err)
		}
		w.Backend = name
		p.Watchers = append(p.Watchers, w)
	}
	p.Cost = costModel(p)
	return p, nil
}

// pushDelay: the agent prints its clock every agentInterval; a drive pumps it; a watcher
// subscribed over push receives each line; its delay is the watcher's clock minus the line's.
func (e *agentEnv) pushDelay(ctx context.Context) (*PushDelivery, error) {
	d := &PushDelivery{Backend: e.name, Delay: newOp("push delivery", 0, false)}
	cmd := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do date +%%s%%N; i=$((i+1)); sleep %.3f; done`, e.lines, agentInterval.Seconds())
	tr, st, err := e.launch(ctx, "push-delivery", cmd)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	driven := make(chan error, 1)
	go func() {
		res, err := driver.Drive(dctx, tr, driver.Config{RunID: "push-delivery", LeaseMs: st.LeaseMs, Logger: e.logger})
		if err == nil && res.Outcome != driver.Completed {
			err = fmt.Errorf("bench: the delivery run ended %s", res.Outcome)
		}
		driven <- err
	}()
	sub := e.client.Subscribe(ctx, map[string]int64{"push-delivery": 0})
	defer sub.Close()
	for {
		u, err := sub.Next(ctx)
		got := time.Now()
		if err == nil {
			err = u.Err
		}
		if err != nil {
			return nil, fmt.Errorf("bench: watch: %w", err)
		}
		if len(u.Events) > 0 {
			d.Messages++
		}
		for _, ev := range u.Events {
			var ns int64
			if err := json.Unmarshal(ev.Data, &ns); err != nil {
				return nil, fmt.Errorf("bench: line %s is not the agent's clock", ev.Data)
			}
			d.Delay.Samples = append(d.Delay.Samples, got.Sub(time.Unix(0, ns)))
		}
		if u.Closed {
			break
		}
	}
	d.Via = sub.Via()
	d.Reads = e.routes.count("GET events")
	if err := <-driven; err != nil {
		return nil, err
	}
	if n := len(d.Delay.Samples); n != e.lines {
		return nil, fmt.Errorf("bench: the watcher received %d lines, want %d", n, e.lines)
	}
	return d, nil
}

// idle: a watcher of an open run nobody writes to, over window: the DynamoDB calls and the
// HTTP requests it costs (push: the subscription is made before the window opens).
func (e *agentEnv) idle(ctx context.Context, name string, push bool, window time.Duration) (*PushIdle, error) {
	runID := "idle-" + randHex(4)
	if _, err := e.client.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}}); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", runID, err)
	}
	out := &PushIdle{Name: name, Window: window}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex
		held time.Duration
		reqs int
		done = make(chan error, 1)
	)
	if push {
		sub := e.client.Subscribe(wctx, map[string]int64{runID: 0})
		defer sub.Close()
		go func() { _, err := sub.Next(wctx); done <- err }()
		for deadline := time.Now().Add(30 * time.Second); sub.Heard().IsZero(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("bench: the watcher was not subscribed within 30 s (via %q)", sub.Via())
			}
		}
		if sub.Via() != apiclient.ViaPush {
			return nil, fmt.Errorf("bench: the watcher subscribed via %q", sub.Via())
		}
		// The acknowledgement precedes the subscription's catch-up read: the window opens
		// once that read is surely done, so it counts the waiting alone.
		time.Sleep(pushSettle)
	}
	before, routes0, t0 := e.dynamoNow(), e.routes.total(), time.Now()
	if !push {
		go func() {
			for wctx.Err() == nil {
				s := time.Now()
				_, err := e.client.ReadEvents(wctx, runID, apiclient.ReadOptions{Wait: costLongPollWaitMs * time.Millisecond})
				mu.Lock()
				held += time.Since(s)
				reqs++
				mu.Unlock()
				if err != nil && wctx.Err() == nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	select {
	case err := <-done:
		return nil, fmt.Errorf("bench: the idle watcher ended: %v", err)
	case <-time.After(window):
	}
	out.Dynamo, out.ByAPI = e.dynamoDelta(before)
	out.Window = time.Since(t0)
	if push {
		out.Requests = e.routes.total() - routes0
		return out, nil
	}
	cancel()
	<-done
	mu.Lock()
	out.Held, out.Requests = min(held, out.Window), reqs
	mu.Unlock()
	return out, nil
}

// watchers: n raw WebSocket clients (no goroutine, a few hundred bytes of heap each, so
// what grows is the server's), each subscribed to its tenant's open run, then idle.
func (e *agentEnv) watchers(ctx context.Context, n int, idle time.Duration) (*PushWatchers, error) {
	addr := strings.TrimPrefix(e.client.BaseURL(), "http://")
	runs := map[string]string{}
	for i := range pushTenants {
		tenant := fmt.Sprintf("watchers-%d", i)
		c, err := apiclient.New(apiclient.Config{BaseURL: e.client.BaseURL(), Tenant: tenant})
		if err != nil {
			return nil, err
		}
		runID := "watched-" + strconv.Itoa(i)
		if _, err := c.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
			Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}}); err != nil {
			return nil, fmt.Errorf("bench: start %s: %w", runID, err)
		}
		runs[tenant] = runID
	}
	g0, heap0, rss0 := footprint()
	t0 := time.Now()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		tenant := fmt.Sprintf("watchers-%d", i%pushTenants)
		c, err := rawWatcher(ctx, addr, tenant, runs[tenant])
		if err != nil {
			return nil, fmt.Errorf("bench: watcher %d: %w", i, err)
		}
		conns = append(conns, c)
	}
	w := &PushWatchers{N: n, Setup: time.Since(t0)}
	g1, heap1, rss1 := footprint()
	w.Goroutines, w.HeapBytes, w.RSSBytes = g1-g0, heap1-heap0, rss1-rss0
	if e.dynamo != nil {
		// Each subscription's catch-up read follows its acknowledgement: the window opens
		// once the last is surely done, so it counts the waiting alone.
		time.Sleep(pushSettle)
		before := e.dynamoNow()
		time.Sleep(idle)
		w.Idle = idle
		_, w.Dynamo = diffCounts(before, e.dynamoNow())
	}
	return w, nil
}

// total is every request counted so far.
func (c *routeCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

// footprint is the process's goroutines, heap in use after a GC, and resident set.
func footprint() (int, int64, int64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), int64(ms.HeapInuse), rss()
}

// rss is the process's resident set in bytes (Linux; 0 elsewhere).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// rawWatcher upgrades one TCP connection by hand, subscribes to runID and reads the
// server's `subscribed`: from then on the server holds the subscription and this side holds
// only the socket.
func rawWatcher(ctx context.Context, addr, tenant, runID string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n%s: %s\r\n\r\n",
		wire.SubscribePath, addr, base64.StdEncoding.EncodeToString(key), wire.PushSubprotocol, apiclient.TenantHeader, tenant)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		c.Close()
		return nil, fmt.Errorf("upgrade answered %s", resp.Status)
	}
	after := int64(0)
	payload, _ := json.Marshal(wire.PushRequest{Type: wire.PushSubscribe, RunID: runID, After: &after})
	if _, err := c.Write(maskedText(payload)); err != nil {
		c.Close()
		return nil, err
	}
	// The server's first frame: unmasked text, a short payload.
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil {
		c.Close()
		return nil, err
	}
	size := int(hdr[1] & 0x7f)
	if size == 126 {
		ext := make([]byte, 2)
		if _, err := io.ReadFull(br, ext); err != nil {
			c.Close()
			return nil, err
		}
		size = int(ext[0])<<8 | int(ext[1])
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(br, body); err != nil {
		c.Close()
		return nil, err
	}
	var m wire.PushMessage
	if err := json.Unmarshal(body, &m); err != nil || m.Type != wire.PushSubscribed {
		c.Close()
		return nil, fmt.Errorf("first message %q", body)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// maskedText is one client text frame of WebSocket framing: FIN and text opcode, a masked
// payload under 126 bytes (a client must mask what it sends).
func maskedText(payload []byte) []byte {
	mask := make([]byte, 4)
	_, _ = rand.Read(mask)
	f := append([]byte{0x81, 0x80 | byte(len(payload))}, mask...)
	for i, b := range payload {
		f = append(f, b^mask[i%4])
	}
	return f
}

// costModel prices a ten-minute run with 500 events watched by one watcher, over push
// (docs/design.md §8.1's deployed design) and over today's long polls, from the counts
// measured above and the published prices.
func costModel(p *Push) PushCost {
	c := PushCost{MessagesPerEvent: 1}
	for _, d := range p.Delivery {
		if d.Backend == "dynalite" && d.Delay.N() > 0 {
			c.MessagesPerEvent = float64(d.Messages) / float64(d.Delay.N())
		}
	}
	for _, i := range p.Idle {
		rate := PerSecond(i.Dynamo, i.Window)
		switch {
		case strings.HasPrefix(i.Name, "push (`--push-poll 0`"):
			c.IdleReadsPush = rate
		case strings.HasPrefix(i.Name, "long poll"):
			c.IdleReadsPoll = rate
		}
	}
	events := float64(costRunEvents)
	msgs := events*c.MessagesPerEvent + 3 // + the subscribe, subscribed and closed
	c.Push = []CostLine{
		{"WebSocket connection-minutes", costRunSeconds / 60, "min", costRunSeconds / 60 * priceWSConnMinute},
		{"WebSocket messages (events, subscribe, subscribed, closed)", msgs, "msg", msgs * priceWSMessage},
		{"Lambda invocations ($connect, subscribe, $disconnect)", 3, "req", 3 * priceLambdaRequest},
		{"Lambda time of those, 0.1 s each at 256 MB", 3 * 0.1 * lambdaGB, "GB-s", 3 * 0.1 * lambdaGB * priceLambdaGBs},
		{"Lambda time of PostToConnection in the append path, 20 ms per append", events * 0.02 * lambdaGB, "GB-s", events * 0.02 * lambdaGB * priceLambdaGBs},
		{"DynamoDB reads of the run's subscription Query (consistent): once after the subscribe in each writing process, one modelled (the listing is kept between appends)", 1, "RRU", 1 * priceRRU},
		{"DynamoDB: connection and subscription items, put and deleted, and the subscribe's watch marker", 5, "WRU", 5 * priceWRU},
		{"DynamoDB: subscribe's run resolve, its marker's tail read and catch-up pages", 4, "RRU", 4 * priceRRU},
		{"DynamoDB reads of idle waiting (measured rate × 600 s)", c.IdleReadsPush * costRunSeconds, "RRU", c.IdleReadsPush * costRunSeconds * priceRRU},
	}
	polls := costRunSeconds/(costLongPollWaitMs/1000.0) + events // each event ends a poll
	c.LongPoll = []CostLine{
		{"HTTP API requests (a poll per 20 s idle, one per event)", polls, "req", polls * priceHTTPRequest},
		{"Lambda invocations of the Wait function", polls, "req", polls * priceLambdaRequest},
		{"Lambda time: a Wait function held for the whole run at 256 MB", costRunSeconds * lambdaGB, "GB-s", costRunSeconds * lambdaGB * priceLambdaGBs},
		{"DynamoDB reads of waiting (measured rate × 600 s)", c.IdleReadsPoll * costRunSeconds, "RRU", c.IdleReadsPoll * costRunSeconds * priceRRU},
		{"DynamoDB reads per poll: run resolve, first read, the woken read", 3 * polls, "RRU", 3 * polls * priceRRU},
	}
	return c
}

// markdownPush writes the push section.
func markdownPush(b io.Writer, p *Push) {
	if p == nil {
		return
	}
	fmt.Fprint(b, "\n### Push: agent line → pump → log → push → subscribed watcher\n\n")
	fmt.Fprint(b, "A local-process agent writes its clock every 100 ms; `driver.Drive` over `apitransport.Transport` pumps it through the HTTP API (loopback, default pump wait); a watcher holds an `apiclient.Subscription` (GET /v1/subscribe, the dev server's in-process fan-out).\n\n")
	fmt.Fprint(b, "| backend | lines | delivery p50 ms | p99 ms | aim p50 ≤ 100 ms, p99 ≤ 300 ms | push messages | via | long polls |\n|---|---:|---:|---:|---|---:|---|---:|\n")
	for _, d := range p.Delivery {
		p50, p99 := d.Delay.Percentile(50), d.Delay.Percentile(99)
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %d | %s | %d |\n", d.Backend, d.Delay.N(), ms(p50), ms(p99),
			yesNo(p50 <= 100*time.Millisecond && p99 <= 300*time.Millisecond), d.Messages, d.Via, d.Reads)
	}
	fmt.Fprint(b, "\n#### An idle watcher (dynalite; nothing written during the window, which opens 1 s after a push subscription's acknowledgement)\n\n")
	fmt.Fprint(b, "| watcher | window s | DynamoDB calls | per second | HTTP requests | request-seconds held / s (deployed: function-seconds) |\n|---|---:|---|---:|---:|---:|\n")
	for _, i := range p.Idle {
		fmt.Fprintf(b, "| %s | %.1f | %d (%s) | %.2f | %d | %.2f |\n", i.Name, i.Window.Seconds(), i.Dynamo, orDash(byAPICell(i.ByAPI, 1)),
			PerSecond(i.Dynamo, i.Window), i.Requests, i.Held.Seconds()/i.Window.Seconds())
	}
	for _, w := range p.Watchers {
		fmt.Fprintf(b, "\n#### %d idle watchers on one server (%s backend, `--push-poll 0`, %d tenants)\n\n", w.N, w.Backend, pushTenants)
		fmt.Fprint(b, "| watchers | goroutines added | per watcher | heap in use added MiB | per watcher KiB | RSS added MiB | per watcher KiB | setup s | DynamoDB calls while idle | per second |\n|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
		calls, rate := "–", "–"
		if w.Idle > 0 {
			n := sum(w.Dynamo)
			calls = fmt.Sprintf("%d over %.0f s (%s)", n, w.Idle.Seconds(), orDash(byAPICell(w.Dynamo, 1)))
			rate = fmt.Sprintf("%.2f", PerSecond(n, w.Idle))
		}
		fmt.Fprintf(b, "| %d | %d | %.2f | %.1f | %.1f | %.1f | %.1f | %.2f | %s | %s |\n", w.N, w.Goroutines, float64(w.Goroutines)/float64(w.N),
			float64(w.HeapBytes)/(1<<20), float64(w.HeapBytes)/1024/float64(w.N), float64(w.RSSBytes)/(1<<20),
			float64(w.RSSBytes)/1024/float64(w.N), w.Setup.Seconds(), calls, rate)
	}
	c := p.Cost
	fmt.Fprintf(b, "\n#### Cost of a ten-minute run with 500 events and one watcher (%.2f push messages per event, idle reads %.2f/s over push and %.2f/s by long poll, as measured above)\n\n",
		c.MessagesPerEvent, c.IdleReadsPush, c.IdleReadsPoll)
	for _, m := range []struct {
		name  string
		lines []CostLine
	}{{"push (deployed design, docs/design.md §8.1)", c.Push}, {"long poll (today)", c.LongPoll}} {
		fmt.Fprintf(b, "| %s | quantity | $ |\n|---|---:|---:|\n", m.name)
		for _, l := range m.lines {
			fmt.Fprintf(b, "| %s | %.1f %s | %.7f |\n", l.What, l.Quantity, l.Unit, l.Dollars)
		}
		fmt.Fprintf(b, "| **total** | | **%.5f** |\n\n", Total(m.lines))
	}
}
