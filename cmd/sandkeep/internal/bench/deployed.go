package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore/callcount"
)

// Deployed is the deployed push path measured in this process, as
// docs/design.md §8.1 and §9 have it: shipper → the Ship function's handler (awsfn.NewAPI
// behind lambdaevent.Gateway as its function URL, in process) → dynalite → its keeper's
// push deliverer → PostToConnection (SigV4) to a stand-in of the management endpoint,
// which stands for the subscribed client.
type Deployed struct {
	Lines    int
	Delay    *OpStats // agent line → the post carrying it received
	Posts    int      // PostToConnection calls during the run (events, closed)
	EvPosts  int      // of them, messages carrying events
	Batches  int      // ship requests that stored events (POST ship answered with new events)
	Requests map[string]int
	// ShipBusy is the Ship function's handler time over the run (function-seconds).
	ShipBusy time.Duration
	// ShipDynamo are the Ship function's DynamoDB calls over the run, by API.
	ShipDynamo map[string]int
	// The same requests split for the cost model (perRequest): Appends are the POST ship
	// requests after the run's first that appended (a PutItem), each a batch; Once are the
	// others (the probe, the first request's fence, heartbeats, the end), paid once a run.
	Appends, OnceRequests    int
	AppendDynamo, OnceDynamo map[string]int
	AppendBusy, OnceBusy     time.Duration
	// AppendLogBytes and OnceLogBytes are what the Ship function wrote to its log in those
	// requests (its request log lines at the INFO level template.yaml sets, and the EMF
	// lines written at once): what CloudWatch Logs ingests. A routine ship answer writes
	// neither (httpapi.QuietShip); its Requests datum goes to a sum written once a minute.
	AppendLogBytes, OnceLogBytes int
	// SumLogBytes is the Requests sums of the run's requests, written once at its end as
	// one minute's (every route of the run in it: a minute of a longer run holds no more).
	SumLogBytes int
	// PushFn are the push function's invocations to subscribe ($connect, subscribe) and
	// their handler time and DynamoDB calls.
	PushFnCalls  int
	PushFnBusy   time.Duration
	PushFnDynamo map[string]int
	// Idle is an idle subscription's window: DynamoDB calls of both functions, function
	// invocations and posts (all must be 0).
	IdleWindow                         time.Duration
	IdleDynamo, IdleInvokes, IdlePosts int
	DriverLease                        time.Duration
	// Provider is the provider calls of every function after the launch (the Ship
	// function's and the launcher's).
	Provider int
}

// mgmtStandIn stands in for the WebSocket API's management endpoint and its client:
// every PostToConnection is recorded with its arrival time (the subscribed client's
// receipt). shared/testkit/pushtest is the tests' stand-in, which also verifies signatures;
// the benchmark ships in the operator binary, which links no test support
// (internal/shipped), so this one checks the signature's shape only.
type mgmtStandIn struct {
	mu      sync.Mutex
	posts   []mgmtPost
	changed chan struct{}
}

type mgmtPost struct {
	conn string
	msg  wire.PushMessage
	at   time.Time
}

const mgmtStage = "bench"

func newMgmtStandIn() *mgmtStandIn { return &mgmtStandIn{changed: make(chan struct{})} }

func (m *mgmtStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	at := time.Now()
	conn, ok := strings.CutPrefix(r.URL.EscapedPath(), "/"+mgmtStage+"/@connections/")
	id, err := url.PathUnescape(conn)
	var msg wire.PushMessage
	switch {
	case r.Method != http.MethodPost || !ok || err != nil || id == "":
		http.Error(w, `{"message":"no such route"}`, http.StatusNotFound)
		return
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=") || r.Header.Get("X-Amz-Date") == "":
		http.Error(w, `{"message":"not signed"}`, http.StatusForbidden)
		return
	case json.Unmarshal(body, &msg) != nil:
		http.Error(w, `{"message":"not a push message"}`, http.StatusBadRequest)
		return
	}
	m.mu.Lock()
	m.posts = append(m.posts, mgmtPost{conn: id, msg: msg, at: at})
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// await waits (bounded) until done holds over conn's posts, checked at every post.
func (m *mgmtStandIn) await(ctx context.Context, conn string, timeout time.Duration, done func([]mgmtPost) bool) ([]mgmtPost, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		ch := m.changed
		var mine []mgmtPost
		for _, p := range m.posts {
			if p.conn == conn {
				mine = append(mine, p)
			}
		}
		m.mu.Unlock()
		if done(mine) {
			return mine, nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return mine, fmt.Errorf("connection %s: %d posts, not done within %s", conn, len(mine), timeout)
		case <-ctx.Done():
			return mine, ctx.Err()
		}
	}
}

// shipRequest is one request the Ship function answered: its route, its DynamoDB calls by
// API and its handler time.
type shipRequest struct {
	key      string
	calls    map[string]int
	busy     time.Duration
	logBytes int
}

// perRequest records each request's own DynamoDB calls: the run's one shipper sends one
// request at a time, so the calls between a request's start and its answer are its own
// (overlapping requests would share theirs; the totals stay exact either way).
type perRequest struct {
	next  http.Handler
	calls *callcount.Counter
	logs  *byteCounter
	mu    sync.Mutex
	reqs  []shipRequest
}

func (p *perRequest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	before, logged, t0 := p.calls.Snapshot(), p.logs.n.Load(), time.Now()
	p.next.ServeHTTP(w, r)
	busy := time.Since(t0)
	_, by := diffCounts(before, p.calls.Snapshot())
	p.mu.Lock()
	p.reqs = append(p.reqs, shipRequest{key: routeKey(r), calls: by, busy: busy, logBytes: int(p.logs.n.Load() - logged)})
	p.mu.Unlock()
}

// byteCounter counts what a function writes to its log (stdout in Lambda) and drops it.
type byteCounter struct{ n atomic.Int64 }

func (c *byteCounter) Write(b []byte) (int, error) {
	c.n.Add(int64(len(b)))
	return len(b), nil
}

// since returns the requests answered after the first i.
func (p *perRequest) since(i int) []shipRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]shipRequest(nil), p.reqs[min(i, len(p.reqs)):]...)
}

func (p *perRequest) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

// split sorts a run's requests into its batches (the POST ship requests after the first
// that appended) and what the run pays once.
func (d *Deployed) split(reqs []shipRequest) {
	d.AppendDynamo, d.OnceDynamo = map[string]int{}, map[string]int{}
	first := true
	for _, r := range reqs {
		to, n, busy, logged := d.OnceDynamo, &d.OnceRequests, &d.OnceBusy, &d.OnceLogBytes
		if r.key == "POST ship" {
			if !first && r.calls["PutItem"] > 0 {
				to, n, busy, logged = d.AppendDynamo, &d.Appends, &d.AppendBusy, &d.AppendLogBytes
			}
			first = false
		}
		*n++
		*busy += r.busy
		*logged += r.logBytes
		for api, c := range r.calls {
			to[api] += c
		}
	}
}

func (m *mgmtStandIn) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.posts)
}

// deployedSection measures the deployed push path on table.
func (e *env) deployedSection(ctx context.Context, table string) (*Deployed, error) {
	key := []byte("bench-deployed-cursor-key-" + randHex(16))
	mgmt := newMgmtStandIn()
	mgmtBase, stopMgmt, err := loopbackServer(mgmt)
	if err != nil {
		return nil, err
	}
	defer stopMgmt()
	endpoint := mgmtBase + "/" + mgmtStage
	const region = "us-east-1"
	poster, err := push.NewManagement(endpoint, region, credentials.NewStaticCredentialsProvider("AKIDBENCHPUSH", "bench secret", ""), nil)
	if err != nil {
		return nil, err
	}
	env := map[string]string{
		awsfn.EnvTable: table, awsfn.EnvCursorKey: string(key), awsfn.EnvPushEndpoint: endpoint, awsfn.EnvProvider: awsfn.ProviderLocalProcess,
	}
	getenv := func(k string) string { return env[k] }
	shipCfg, err := awsfn.Load(ctx, awsfn.Ship, getenv, nil)
	if err != nil {
		return nil, err
	}
	// The server that starts runs and launches agents (the agent route's function); its
	// shippers are given the Ship function's address. The Ship function holds the same
	// provider (a deployment's functions share one provider account): its calls are counted.
	ln, shipBase, err := loopbackListener()
	if err != nil {
		return nil, err
	}
	launcher, err := e.newShipServer(table, key, shipBase)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	defer launcher.stopAll()
	shipCalls, pushCalls := callcount.New(), callcount.New()
	// The Ship function logs as deployed (JSON at INFO, EMF metrics), into a byte counter.
	// Its metrics' clock is held on one minute, so its Requests sums are written once, at
	// the run's end (SumLogBytes), never inside a request's bytes; the model prices them
	// once a minute.
	shipLog := &byteCounter{}
	sumMinute := time.Now()
	shipMetrics := emf.NewWithClock(shipLog, func() time.Time { return sumMinute })
	shipFn, err := awsfn.NewAPI(shipCfg, awsfn.Deps{DynamoDB: dynamostore.LocalClient(e.cfg.Endpoint, shipCalls.Attach),
		Logger: awsfn.NewLogger(shipLog, "INFO"), Metrics: shipMetrics, PushPoster: poster, Provider: launcher.prov})
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	attrib := &perRequest{next: &lambdaevent.Gateway{Handler: shipFn.Handle}, calls: shipCalls, logs: shipLog} // no Route: the function URL
	front := newBusyCounter(attrib)
	defer serveOn(ln, front)()
	// The push function's routes ($connect, a client's subscribe) over their own client.
	pushClient := dynamostore.LocalClient(e.cfg.Endpoint, pushCalls.Attach)
	pushBackend := awsfn.NewBackend(shipCfg, pushClient, time.Now)
	pk, err := keeper.New(keeper.Config{Backend: pushBackend, DriverLease: shipCfg.DriverLease, Logger: e.quiet})
	if err != nil {
		return nil, err
	}
	routes := push.NewRoutes(push.RoutesConfig{Keeper: pk, Store: pushBackend, Logger: e.quiet,
		Deliverer: push.NewDeliverer(push.Config{Store: pushBackend, Log: pushBackend.Log(), Poster: poster, Logger: e.quiet})})

	d := &Deployed{Lines: e.cfg.ShipLines, Delay: newOp("deployed push", 0, false), DriverLease: shipCfg.DriverLease}
	tenant := httpapi.MapTenant(Tenant)
	subscribe := func(runID string) (string, error) {
		conn := "conn-" + randHex(6)
		t0 := time.Now()
		defer func() {
			if d.PushFnCalls == 0 {
				d.PushFnCalls, d.PushFnBusy = 2, time.Since(t0)
			}
		}()
		if err := routes.Connect(ctx, tenant, conn); err != nil {
			return "", fmt.Errorf("$connect: %w", err)
		}
		after := int64(0)
		body, _ := json.Marshal(wire.PushRequest{Type: wire.PushSubscribe, RunID: runID, After: &after})
		if err := routes.Message(ctx, conn, randHex(8), body); err != nil {
			return "", fmt.Errorf("subscribe: %w", err)
		}
		if _, err := mgmt.await(ctx, conn, 30*time.Second, func(ps []mgmtPost) bool { return len(ps) > 0 }); err != nil {
			return "", err
		}
		return conn, nil
	}

	// The delivery run.
	runID := "deployed-" + randHex(4)
	st, err := launcher.client.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	p0 := pushCalls.Snapshot()
	conn, err := subscribe(runID)
	if err != nil {
		return nil, err
	}
	_, d.PushFnDynamo = diffCounts(p0, pushCalls.Snapshot())
	if ps, _ := mgmt.await(ctx, conn, 0, func([]mgmtPost) bool { return true }); len(ps) != 1 || ps[0].msg.Type != wire.PushSubscribed {
		return nil, fmt.Errorf("the subscribe was answered %+v", ps)
	}
	cmd := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do date +%%s%%N; i=$((i+1)); sleep %.3f; done`, e.cfg.ShipLines, agentInterval.Seconds())
	q0 := attrib.count() // from the launch on: the probe and the first request are the run's too
	ag, err := launcher.client.Agent(ctx, runID, wire.AgentRequest{Cursor: st.Cursor, Command: cmd})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if ag.Shipping != wire.ShippingSandbox {
		return nil, fmt.Errorf("the agent is shipped by %q", ag.Shipping)
	}
	r0, l0, posts0, pv0 := front.snap(), shipCalls.Snapshot(), mgmt.count(), launcher.prov.Counts()
	ps, err := mgmt.await(ctx, conn, 5*time.Minute, func(ps []mgmtPost) bool {
		return len(ps) > 0 && ps[len(ps)-1].msg.Type == wire.PushClosed
	})
	if err != nil {
		return nil, err
	}
	// The closed message is posted inside the end request: let it answer before counting.
	if _, status, err := awaitEnd(ctx, launcher, runID); err != nil || status != "completed" {
		return nil, fmt.Errorf("the deployed run ended %q: %v", status, err)
	}
	if err := front.awaitCount(ctx, "POST end", r0.n["POST end"]+1); err != nil {
		return nil, err
	}
	r1 := front.snap()
	_, d.Requests = diffCounts(r0.n, r1.n)
	for _, k := range shipRouteKeys {
		d.ShipBusy += r1.busy[k] - r0.busy[k]
	}
	_, d.ShipDynamo = diffCounts(l0, shipCalls.Snapshot())
	d.split(attrib.since(q0))
	sums := shipLog.n.Load()
	shipMetrics.Flush()
	d.SumLogBytes = int(shipLog.n.Load() - sums)
	d.Posts = mgmt.count() - posts0
	d.Provider, _ = diffCounts(pv0, launcher.prov.Counts())
	var last int64
	for _, p := range ps {
		if p.msg.Type != wire.PushEvents || len(p.msg.Events) == 0 {
			continue
		}
		d.EvPosts++
		for _, ev := range p.msg.Events {
			if ev.Offset <= last {
				return nil, fmt.Errorf("event %d posted twice or out of order", ev.Offset)
			}
			last = ev.Offset
			var ns int64
			if err := json.Unmarshal(ev.Data, &ns); err != nil {
				return nil, fmt.Errorf("line %s is not the agent's clock", ev.Data)
			}
			d.Delay.Samples = append(d.Delay.Samples, p.at.Sub(time.Unix(0, ns)))
		}
	}
	if d.Delay.N() != e.cfg.ShipLines {
		return nil, fmt.Errorf("the subscriber received %d lines, want %d", d.Delay.N(), e.cfg.ShipLines)
	}
	d.Batches = d.EvPosts

	// An idle subscription: an open run nobody writes to.
	idleRun := "deployed-idle-" + randHex(4)
	if _, err := launcher.client.Start(ctx, wire.StartRequest{RunID: idleRun, ThreadID: "thread-" + idleRun,
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}}); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	if _, err := subscribe(idleRun); err != nil {
		return nil, err
	}
	i0, il0, ip0, iposts := front.snap(), shipCalls.Snapshot(), pushCalls.Snapshot(), mgmt.count()
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(e.cfg.PushIdle):
	}
	d.IdleWindow = time.Since(t0)
	n1, _ := diffCounts(il0, shipCalls.Snapshot())
	n2, _ := diffCounts(ip0, pushCalls.Snapshot())
	d.IdleDynamo = n1 + n2
	d.IdleInvokes, _ = diffCounts(i0.n, front.snap().n)
	d.IdlePosts = mgmt.count() - iposts
	return d, nil
}

// isWrite reports whether a DynamoDB API writes (priced in write request units).
func isWrite(api string) bool {
	switch api {
	case "PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem":
		return true
	}
	return false
}

// splitRW sums calls by API into writes and reads.
func splitRW(by map[string]int) (w, r int) {
	for api, n := range by {
		if isWrite(api) {
			w += n
		} else {
			r += n
		}
	}
	return w, r
}

// shippedCost prices a ten-minute run with 500 events, one watcher, shipped by its
// sandbox and pushed through the deployed path, from what the deployed run counted and the
// published prices (docs/bench.md states them), with perBatch events to a batch. Each
// batch costs what the measured run's appending requests cost on average (one ship
// request, its append and its push); what the run paid once (the probe, the first
// request's fence, the end and its closed message) is added once, not scaled with the
// batches. The measured run's batching (its lines per post) is the shipper's real one; 1
// is events too far apart to share the shipper's linger. The ship requests reach the Ship
// function through its function URL (template.yaml), which charges nothing beside Lambda's
// own invocation and time: no API Gateway request is priced. Two items are modelled, not
// measured here: a post's round trip to the management endpoint (the stand-in is on
// loopback) and the index writes of a lease renewal (from template.yaml's indexes).
func shippedCost(d *Deployed, perBatch float64) []CostLine {
	events := float64(costRunEvents)
	batches := events / max(perBatch, 1)
	apps := float64(max(d.Appends, 1))
	each := func(n int) float64 { return float64(n) / apps * batches }
	aw, ar := splitRW(d.AppendDynamo)
	ow, or := splitRW(d.OnceDynamo)
	pw, pr := splitRW(d.PushFnDynamo)
	reqs := batches + float64(d.OnceRequests)
	msgs := batches + float64(max(d.Posts-d.EvPosts, 0)) + 2 // a post per batch, closed, the subscribe and its answer
	renewals := float64(costRunSeconds) / agentrun.ShipRenewAfter(d.DriverLease).Seconds()
	gbs := (each(int(d.AppendBusy.Microseconds()))/1e6 + d.OnceBusy.Seconds()) * lambdaGB
	postGBs := batches * postRoundTrip.Seconds() * lambdaGB
	sumMinutes := math.Ceil(costRunSeconds / emf.SumPeriod.Seconds())
	logBytes := each(d.AppendLogBytes) + float64(d.OnceLogBytes) + sumMinutes*float64(d.SumLogBytes)
	pushGBs := (d.PushFnBusy.Seconds() * 3 / 2) * lambdaGB // $disconnect as long as one of the two
	return []CostLine{
		{fmt.Sprintf("Ship requests through the Ship function's URL (one per batch, and the run's %d others; a function URL has no charge of its own)", d.OnceRequests), reqs, "req", 0},
		{"Lambda invocations of the Ship function (the same requests)", reqs, "req", reqs * priceLambdaRequest},
		{"Lambda time of the Ship function, arm64 (measured handler time of each appending request, append and push inside it, and of the run's others)", gbs, "GB-s", gbs * priceLambdaGBs},
		{fmt.Sprintf("Lambda time waiting on each post's round trip to the management endpoint (modelled: %v a post; measured against a loopback stand-in above)", postRoundTrip), postGBs, "GB-s", postGBs * priceLambdaGBs},
		{fmt.Sprintf("CloudWatch Logs ingestion of the Ship function's request log and EMF lines (measured: %.0f bytes per appending request, %d once, %d of Requests sums a minute for %.0f minutes)", float64(d.AppendLogBytes)/apps, d.OnceLogBytes, d.SumLogBytes, sumMinutes), logBytes / 1e3, "KB", logBytes * priceLogsGB},
		{fmt.Sprintf("DynamoDB writes per batch (%s per appending request)", byAPICell(writesOf(d.AppendDynamo), int(apps))), each(aw), "WRU", each(aw) * priceWRU},
		{fmt.Sprintf("DynamoDB reads per batch (%s per appending request)", byAPICell(readsOf(d.AppendDynamo), int(apps))), each(ar), "RRU", each(ar) * priceRRU},
		{fmt.Sprintf("DynamoDB of the run's other requests, once (%s)", byAPICell(d.OnceDynamo, 1)), float64(ow + or), "RU", float64(ow)*priceWRU + float64(or)*priceRRU},
		{fmt.Sprintf("DynamoDB: the lease renewed in the answers, one UpdateItem per half lease and its index writes (modelled: %.2f WRU each on average)", renewalWRU), renewals * renewalWRU, "WRU", renewals * renewalWRU * priceWRU},
		{"WebSocket messages (one PostToConnection per batch, closed, the subscribe and its answer)", msgs, "msg", msgs * priceWSMessage},
		{"WebSocket connection-minutes", costRunSeconds / 60, "min", costRunSeconds / 60 * priceWSConnMinute},
		{"Lambda invocations of the push function ($connect, subscribe, $disconnect)", 3, "req", 3 * priceLambdaRequest},
		{"Lambda time of those (measured)", pushGBs, "GB-s", pushGBs * priceLambdaGBs},
		{"DynamoDB of those (measured connect and subscribe; $disconnect as 2 writes)", float64(pw + pr + 2), "RU", float64(pw+2)*priceWRU + float64(pr)*priceRRU},
		{"DynamoDB and function time of idle waiting (measured: calls in the idle window)", float64(d.IdleDynamo), "RU", float64(d.IdleDynamo) * priceRRU * costRunSeconds / max(d.IdleWindow.Seconds(), 1)},
	}
}

const (
	// postRoundTrip is a PostToConnection's round trip inside a region, which the Ship
	// function waits out in its request (the push section's model assumes the same).
	postRoundTrip = 20 * time.Millisecond
	// renewalWRU is a lease renewal's write units on average: every renewal writes the run
	// item (up to 1 KB): 1; no other index holds what it writes (runsByThread projects the
	// record, not the lease: TestRenewalWritesNoOtherIndex). reclaimAt moves only when the
	// lease's end passes a whole driver lease (contract.LeaseReclaimAt), once in the 2
	// renewals of a half lease; that one also pays reclaimCandidates' delete and put (2),
	// and no refused call, since the Ship function's store left the run in the step before
	// (TestRenewalWritesNoReclaimIndex; a container that did not pays 1 more): (1 + 3) / 2.
	renewalWRU = 2.0
)

func writesOf(by map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range by {
		if isWrite(k) {
			out[k] = v
		}
	}
	return out
}

func readsOf(by map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range by {
		if !isWrite(k) {
			out[k] = v
		}
	}
	return out
}

// markdownDeployed writes the deployed push path and its cost model.
func markdownDeployed(b *strings.Builder, d *Deployed) {
	if d == nil {
		return
	}
	b.WriteString("\n### Push, deployed path (docs/design.md §8.1): shipper → Ship function (its function URL) → dynalite → push deliverer → PostToConnection → subscribed client\n\n")
	b.WriteString("In this process: the Ship function is `awsfn.NewAPI` (function `ship`, the push endpoint set) behind an adapter that turns each HTTP request into its function URL's payload 2.0 event, so its keeper's deliverer (`push.Deliverer`) posts what each append stored, SigV4-signed by `push.Management`, to a loopback stand-in of the management endpoint that records each post's arrival (the client's receipt; API Gateway's own hop is not in it). The subscription is made through the push function's routes (`push.Routes`: $connect, subscribe). The run is started and launched through a dev-style server whose public URL is the Ship function's address, so the real shipper (sh, curl) ships to it. shared/testkit/pushtest is the tests' stand-in (it also verifies each signature); the operator binary links no test support, so the benchmark carries its own (signature shape only).\n\n")
	b.WriteString("| path | lines | p50 ms | p99 ms | aim p50 ≤ 100 ms, p99 ≤ 300 ms | posts (with events) | events per post | ship requests | Ship function DynamoDB calls | Ship function busy ms |\n|---|---:|---:|---:|---|---|---:|---|---|---:|\n")
	reqs := 0
	for _, k := range shipRouteKeys {
		reqs += d.Requests[k]
	}
	fmt.Fprintf(b, "| agent line → post received | %d | %s | %s | %s | %d (%d) | %.2f | %d (%s) | %d (%s) | %.1f |\n", d.Delay.N(),
		ms(d.Delay.Percentile(50)), ms(d.Delay.Percentile(99)), yesNo(d.Delay.Percentile(50) <= 100*time.Millisecond && d.Delay.Percentile(99) <= 300*time.Millisecond),
		d.Posts, d.EvPosts, float64(d.Delay.N())/float64(max(d.EvPosts, 1)), reqs, shipRoutesCell(d.Requests),
		sum(d.ShipDynamo), byAPICell(d.ShipDynamo, 1), float64(d.ShipBusy)/float64(time.Millisecond))
	fmt.Fprintf(b, "\nProvider calls after the launch: %d. ", d.Provider)
	fmt.Fprintf(b, "An idle subscription (an open run nobody writes to), %.1f s: %d DynamoDB calls (both functions), %d function invocations, %d posts — 0 reads and 0 function-seconds per second of waiting: %s.\n",
		d.IdleWindow.Seconds(), d.IdleDynamo, d.IdleInvokes, d.IdlePosts, yesNo(d.IdleDynamo == 0 && d.IdleInvokes == 0))
	perPost := float64(d.Delay.N()) / float64(max(d.EvPosts, 1))
	lines := shippedCost(d, perPost)
	fmt.Fprintf(b, "\n#### Cost of a ten-minute run with 500 events and one watcher, shipped and pushed (the counts above per ship request, %.2f events a batch as the shipper batched them above)\n\n| item | quantity | $ |\n|---|---:|---:|\n", perPost)
	for _, l := range lines {
		fmt.Fprintf(b, "| %s | %.1f %s | %.7f |\n", l.What, l.Quantity, l.Unit, l.Dollars)
	}
	fmt.Fprintf(b, "| **total** (aim ≤ $0.001: %s) | | **%.5f** |\n", yesNo(Total(lines) <= 0.001), Total(lines))
	fmt.Fprintf(b, "\nThe same run with its 500 events 1.2 s apart, each a batch of its own (a line after a quiet check is sent at once): **%.5f**.\n", Total(shippedCost(d, 1)))
}

func sum(by map[string]int) int {
	n := 0
	for _, v := range by {
		n += v
	}
	return n
}
