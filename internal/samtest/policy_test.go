package samtest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/pushtest"
)

// clock is the wall clock every function of a deployment under test reads; tests move it
// forward to age rows and detachments (leases use the monotonic clock, unaffected).
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }
func newClock() *clock                   { return &clock{} }
func (c *clock) String() string          { return time.Duration(c.offset.Load()).String() }

// deployment is the five functions over one dynalite table, each with its own client and
// call counter, like five Lambdas with five roles.
type deployment struct {
	t        *testing.T
	clock    *clock
	apis     map[awsfn.Function]*awsfn.API
	reaper   *awsfn.ReaperHandler
	counters map[awsfn.Function]*dynamotest.Counter
	queries  map[awsfn.Function]*queryTargets
	// providers is each function's provider (a function that never calls one holds none).
	providers map[awsfn.Function]*countingProvider
	tenant    string
	seq       int
	// push is the push function; standin the management endpoint every function posts to.
	push    *awsfn.PushAPI
	standin *pushtest.StandIn
}

const testCursorKey = "policy test cursor key, 32 bytes"

// The role the test deployments trust to name tenants, and the userArn API Gateway's IAM
// authorizer reports for a session of it (assumed-role ARNs omit the role's path).
const (
	callerRole    = "arn:aws:iam::123456789012:role/service/agent-host"
	callerSession = "arn:aws:sts::123456789012:assumed-role/agent-host/i-0abc123"
)

func trustedRoles(t *testing.T) awsfn.TrustedRoles {
	t.Helper()
	r, err := awsfn.ParseTrustedRoles(callerRole)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newDeployment(t *testing.T) *deployment {
	t.Helper()
	table := dynamotest.FreshTable(t, dynamotest.Client(t))
	d := &deployment{t: t, clock: newClock(), apis: map[awsfn.Function]*awsfn.API{},
		counters: map[awsfn.Function]*dynamotest.Counter{}, queries: map[awsfn.Function]*queryTargets{},
		providers: map[awsfn.Function]*countingProvider{}, tenant: "acme", standin: pushtest.Start(t)}
	poster, err := push.NewManagement(d.standin.Endpoint(), pushtest.Region, pushtest.Credentials(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sandboxes := t.TempDir()
	logger := slog.New(slog.DiscardHandler)
	for _, fn := range awsfn.Functions() {
		c := dynamotest.NewCounter()
		d.counters[fn] = c
		cfg := awsfn.Config{
			Function: fn, Table: table, AuthMode: awsfn.AuthIAM, TrustedRoles: trustedRoles(t), TenantClaim: "tenant",
			Provider: awsfn.ProviderLocalProcess, SandboxDir: sandboxes,
			LockLease: 15 * time.Second, DriverLease: time.Minute, LogRetention: 24 * time.Hour,
			PushEndpoint: d.standin.Endpoint(),
		}
		q := &queryTargets{}
		d.queries[fn] = q
		d.providers[fn] = &countingProvider{Provider: localprocess.New(sandboxes)}
		deps := awsfn.Deps{DynamoDB: dynamotest.Client(t, c.Attach, q.attach), Logger: logger, Now: d.clock.now, Provider: d.providers[fn],
			PushPoster: poster}
		if fn == awsfn.Push {
			if d.push, err = awsfn.NewPush(cfg, deps); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if fn == awsfn.Reaper {
			cfg.DetachedTTL, cfg.InstanceRetention = 15*time.Minute, time.Hour
			h, err := awsfn.NewReaper(cfg, deps, awsfn.ReaperSweep)
			if err != nil {
				t.Fatal(err)
			}
			d.reaper = h
			continue
		}
		cfg.CursorKey = []byte(testCursorKey)
		if fn == awsfn.Ship { // as awsfn.Load gives it: no caller's authentication
			cfg.AuthMode, cfg.TrustedRoles, cfg.TenantClaim = "", awsfn.TrustedRoles{}, ""
		}
		api, err := awsfn.NewAPI(cfg, deps)
		if err != nil {
			t.Fatal(err)
		}
		d.apis[fn] = api
	}
	return d
}

// queryTargets records whether a client's Queries read the base table, an index, or both
// (IAM authorises index queries on <table>/index/<name>).
type queryTargets struct{ table, index atomic.Bool }

func (q *queryTargets) attach(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("queryTargets",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if qi, ok := in.Parameters.(*dynamodb.QueryInput); ok {
					if qi.IndexName != nil {
						q.index.Store(true)
					} else {
						q.table.Store(true)
					}
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	})
}

// routeOf maps a concrete request to its docs/design.md §8 route key and owning function.
func routeOf(method, p string) (key string, fn awsfn.Function) {
	for _, f := range awsfn.Functions() {
		var keys []string
		for _, r := range awsfn.Routes(f) {
			keys = append(keys, r.Pattern())
		}
		if key, ok := lambdaevent.Routes(keys...)(method, p); ok {
			return key, f
		}
	}
	return "", ""
}

// apiGatewayEvent builds the payload-2.0 event API Gateway sends for an IAM-signed call.
func apiGatewayEvent(method, routeKey, p, query, tenant string, body any, seq int) events.APIGatewayV2HTTPRequest {
	return lambdaevent.Request{Method: method, RouteKey: routeKey, Path: p, Query: query,
		Header: map[string]string{"host": "api.example", httpapi.TenantHeader: tenant}, RequestID: fmt.Sprintf("req%06d=", seq),
		Authorizer: lambdaevent.IAM("123456789012", callerSession)}.JSON(body).Event()
}

// do sends one request to the function owning its route and returns status and body.
func (d *deployment) do(method, target string, body any) (int, map[string]any) {
	d.t.Helper()
	p, query, _ := strings.Cut(target, "?")
	key, fn := routeOf(method, p)
	if fn == "" {
		d.t.Fatalf("%s %s is no docs/design.md §8 route", method, p)
	}
	d.seq++
	resp, err := d.apis[fn].Handle(context.Background(), apiGatewayEvent(method, key, p, query, d.tenant, body, d.seq))
	if err != nil {
		d.t.Fatal(err)
	}
	var m map[string]any
	if resp.StatusCode == 204 && resp.Body == "" {
		return resp.StatusCode, nil // the store routes' writes answer no body
	}
	if err := json.Unmarshal([]byte(resp.Body), &m); err != nil {
		d.t.Fatalf("%s %s: %d body %q", method, target, resp.StatusCode, resp.Body)
	}
	return resp.StatusCode, m
}

// shipWant sends a ship route's request to the Ship function as its function URL does
// (docs/design.md §9): routeKey $default and no authorizer, the token in Authorization,
// the raw body base64-encoded. It asserts the status and returns the body.
func (d *deployment) shipWant(status int, method, target, token, body string) map[string]any {
	d.t.Helper()
	p, query, _ := strings.Cut(target, "?")
	d.seq++
	req := lambdaevent.Request{Method: method, Path: p, Query: query, Body: []byte(body), RequestID: fmt.Sprintf("req%06d=", d.seq),
		Header: map[string]string{"host": "shipid.lambda-url.us-east-1.on.aws", "content-type": wire.ShipContentType}}
	if token != "" {
		req.Header["authorization"] = "Bearer " + token
	}
	resp, err := d.apis[awsfn.Ship].Handle(context.Background(), req.FunctionURL())
	if err != nil || resp.StatusCode != status {
		d.t.Fatalf("%s %s: %d %v, want %d: %s", method, target, resp.StatusCode, err, status, resp.Body)
	}
	var m map[string]any
	if resp.Body != "" {
		if err := json.Unmarshal([]byte(resp.Body), &m); err != nil {
			d.t.Fatalf("%s %s: body %q", method, target, resp.Body)
		}
	}
	return m
}

// want asserts a status and returns the body.
func (d *deployment) want(status int, method, target string, body any) map[string]any {
	d.t.Helper()
	got, m := d.do(method, target, body)
	if got != status {
		d.t.Fatalf("%s %s: %d, want %d: %v", method, target, got, status, m)
	}
	return m
}

// ws sends one WebSocket API event to the push function: $connect signed by the trusted
// role's session naming the tenant, $disconnect, or a message.
func (d *deployment) ws(route, connID, body string) events.APIGatewayProxyResponse {
	d.t.Helper()
	d.seq++
	ev := lambdaevent.WebSocket{Route: route, ConnID: connID, Body: body,
		Header:    map[string]string{"Host": "push.example", httpapi.TenantHeader: d.tenant},
		RequestID: fmt.Sprintf("ws%06d=", d.seq), Stage: "dev", UserARN: callerSession}.Event()
	resp, err := d.push.Handle(context.Background(), ev)
	if err != nil || resp.StatusCode != 200 {
		d.t.Fatalf("%s on %s: %v %+v", route, connID, err, resp)
	}
	return resp
}

// watch opens connection conn and subscribes it to runID from the start.
func (d *deployment) watch(conn, runID string) {
	d.t.Helper()
	d.ws("$connect", conn, "")
	d.ws("subscribe", conn, `{"type":"subscribe","runId":"`+runID+`"}`)
	if msgs := d.standin.Messages(d.t, conn); len(msgs) == 0 || msgs[0].Type != "subscribed" {
		d.t.Fatalf("%s: subscribe to %s answered %+v", conn, runID, msgs)
	}
}

func startBody(run, thread string, extra map[string]any) map[string]any {
	sb := map[string]any{"id": "default", "provider": "local-process"}
	for k, v := range extra {
		sb[k] = v
	}
	return map[string]any{"runId": run, "threadId": thread, "sandbox": sb}
}

// drive runs every route of docs/design.md §8 through the adapters, on success and refusal paths (a
// refusal re-reads the item: GetItem), then reaper sweeps over detached, cancelled and
// idle state. Each step is one a production caller can take.
func (d *deployment) drive() {
	t := d.t
	// Resolve: created, resumed, taken over, attach, get, snapshot, active run.
	s1 := d.want(200, "POST", "/v1/runs", startBody("run-1", "thread-1", nil))
	if s1["outcome"] != "created" {
		t.Fatalf("first start: %v", s1)
	}
	c1 := s1["cursor"].(string)
	// A watcher of run-1 (the push function): the log function's append and finish push
	// to it, the finish's close ends its subscription.
	d.watch("w1", "run-1")
	a := d.want(200, "POST", "/v1/runs/run-1/events", map[string]any{"cursor": c1, "events": []any{map[string]any{"data": "x", "src": 10}}})
	d.want(200, "GET", "/v1/runs/run-1/events?after=0&limit=10", nil)
	d.want(200, "POST", "/v1/runs/run-1/heartbeat", map[string]any{"cursor": a["cursor"]})
	d.want(200, "POST", "/v1/runs/run-1/finish", map[string]any{"cursor": a["cursor"], "status": "completed"})
	d.want(200, "POST", "/v1/runs/run-1/finish", map[string]any{"cursor": a["cursor"], "status": "completed"}) // retried: idempotent
	d.want(200, "GET", "/v1/runs/run-1/events?after=0&limit=10", nil)                                          // closed
	if msgs := d.standin.Messages(t, "w1"); len(msgs) != 3 || msgs[1].Type != "events" || msgs[2].Type != "closed" {
		t.Fatalf("run-1's watcher received %+v", msgs)
	}
	// Another watcher subscribes, unsubscribes and disconnects.
	d.watch("w2", "run-1")
	d.ws("$connect", "w3", "")
	d.ws("unsubscribe", "w3", `{"type":"unsubscribe","runId":"run-1"}`)
	d.ws("$disconnect", "w3", "")
	// An aborted run: finish kills its agent and removes its journal, in its sandbox.
	sa := d.want(200, "POST", "/v1/runs", startBody("run-a", "thread-a", nil))
	d.want(200, "POST", "/v1/runs/run-a/finish", map[string]any{"cursor": sa["cursor"], "status": "aborted"})
	d.want(409, "POST", "/v1/runs/run-1/events", map[string]any{"cursor": a["cursor"], "events": []any{map[string]any{"data": 1}}})
	d.want(410, "POST", "/v1/runs/run-1/attach", map[string]any{})
	d.want(202, "POST", "/v1/runs/run-1/cancel", map[string]any{}) // terminal: no-op

	s2 := d.want(200, "POST", "/v1/runs", startBody("run-2", "thread-1", nil))
	if s2["outcome"] != "resumed" {
		t.Fatalf("second start on the thread: %v", s2)
	}
	s2b := d.want(200, "POST", "/v1/runs", startBody("run-2", "thread-1", nil))
	if s2b["outcome"] != "taken-over" {
		t.Fatalf("retried start: %v", s2b)
	}
	d.want(409, "POST", "/v1/runs/run-2/heartbeat", map[string]any{"cursor": s2["cursor"]}) // superseded
	d.want(409, "POST", "/v1/runs/run-2/detach", map[string]any{"cursor": s2["cursor"]})
	d.want(409, "POST", "/v1/runs/run-2/events", map[string]any{"cursor": s2["cursor"], "events": []any{map[string]any{"data": 1}}})
	d.want(409, "POST", "/v1/runs/run-2/finish", map[string]any{"cursor": s2["cursor"], "status": "completed"})
	at := d.want(200, "POST", "/v1/runs/run-2/attach", map[string]any{})
	d.want(200, "GET", "/v1/runs/run-2", nil)
	d.want(200, "GET", "/v1/threads/thread-1/active-run", nil)
	d.want(200, "GET", "/v1/threads/idle-thread/active-run", nil)
	d.want(200, "GET", "/v1/runs?limit=1", nil)
	d.want(200, "GET", "/v1/runs?threadId=thread-1&status=running", nil)
	d.want(200, "GET", "/v1/runs/run-2/view", nil)
	d.want(404, "GET", "/v1/runs/nope/view", nil)
	d.want(200, "POST", "/v1/runs/run-2/snapshot", map[string]any{"cursor": at["cursor"], "label": "s"})
	d.want(404, "GET", "/v1/runs/nope", nil)
	d.want(404, "POST", "/v1/runs/nope/attach", map[string]any{})
	d.want(409, "POST", "/v1/runs", startBody("run-2", "thread-other", nil))
	// Detach (twice: the first detachment stays), unknown run.
	d.want(200, "POST", "/v1/runs/run-2/detach", map[string]any{"cursor": at["cursor"]})
	d.want(200, "POST", "/v1/runs/run-2/detach", map[string]any{"cursor": at["cursor"]})
	d.want(404, "POST", "/v1/runs/nope/detach", map[string]any{"cursor": at["cursor"]})
	d.want(404, "POST", "/v1/runs/nope/heartbeat", map[string]any{"cursor": at["cursor"]})

	// Cancel: a run, a thread's active run, an idle thread, an unknown run.
	s3 := d.want(200, "POST", "/v1/runs", startBody("run-3", "thread-3", nil))
	d.want(202, "POST", "/v1/threads/thread-3/cancel", map[string]any{})
	hb := d.want(200, "POST", "/v1/runs/run-3/heartbeat", map[string]any{"cursor": s3["cursor"]})
	if hb["cancelRequested"] != true {
		t.Fatalf("cancel did not reach the driver: %v", hb)
	}
	d.want(404, "POST", "/v1/threads/thread-idle/cancel", map[string]any{})
	d.want(404, "POST", "/v1/runs/nope/cancel", map[string]any{})
	s4 := d.want(200, "POST", "/v1/runs", startBody("run-4", "thread-4", map[string]any{"reuse": "none"}))
	d.want(202, "POST", "/v1/runs/run-4/cancel", map[string]any{})
	d.want(200, "POST", "/v1/runs/run-4/events", map[string]any{"cursor": s4["cursor"], "events": []any{map[string]any{"data": "after cancel"}}})
	d.want(200, "POST", "/v1/runs/run-4/detach", map[string]any{"cursor": s4["cursor"]})

	// A sandbox past its max age, idle beyond the driver lease: resolve reclaims it
	// (tombstone, destroy, delete) and creates a new one.
	s5 := d.want(200, "POST", "/v1/runs", startBody("run-5", "thread-5", nil))
	d.want(200, "POST", "/v1/runs/run-5/finish", map[string]any{"cursor": s5["cursor"], "status": "completed"})
	d.clock.advance(10 * time.Minute)
	s6 := d.want(200, "POST", "/v1/runs", startBody("run-6", "thread-5", map[string]any{"snapshotMaxAgeMs": 60_000}))
	if s6["outcome"] != "created" && s6["outcome"] != "restored" {
		t.Fatalf("start past max age: %v", s6)
	}
	d.want(200, "POST", "/v1/runs/run-6/detach", map[string]any{"cursor": s6["cursor"]})

	// Agent and pump. The functions never run a caller's command on their own host, so the
	// agent route refuses local-process (501, after resolving the run); the journal is
	// launched here as a provider sandbox's agent would run, and the log function pumps it
	// to its exit sentinel, refuses a superseded pumper and ends the run; an aborted finish
	// kills a live agent.
	s7 := d.want(200, "POST", "/v1/runs", startBody("run-7", "thread-7", map[string]any{"reuse": "none"}))
	d.want(501, "POST", "/v1/runs/run-7/agent", map[string]any{"cursor": s7["cursor"], "command": "true"})
	d.launch(s7, "run-7", `printf '{"n":1}\n{"n":2}\n'`)
	// run-7's watcher is gone by the time the wait function pumps: its 410 removes it.
	d.watch("w7", "run-7")
	d.standin.Gone("w7")
	p7 := d.pumpUntilExited("run-7", s7["cursor"])
	d.want(200, "POST", "/v1/runs/run-7/finish", map[string]any{"cursor": p7["cursor"], "status": "completed"})
	// The finish ran in the log function, the pump runs in the wait function, as in any
	// deployment of more than one container: the wait function, which saw the agent exit,
	// answers from its cached sandbox without a write (200, exited, nothing stored) or,
	// having read the run, 410.
	if st, m := d.do("POST", "/v1/runs/run-7/pump", map[string]any{"cursor": p7["cursor"]}); st != 410 &&
		(st != 200 || m["exited"] != true || m["appended"] != float64(0)) {
		t.Fatalf("pump after finish: %d %v, want 410 or 200 exited with nothing appended", st, m)
	}
	s8 := d.want(200, "POST", "/v1/runs", startBody("run-8", "thread-8", map[string]any{"reuse": "none"}))
	d.launch(s8, "run-8", `printf '{"n":1}\n'; sleep 300`)
	p8 := d.want(200, "POST", "/v1/runs/run-8/pump", map[string]any{"cursor": s8["cursor"], "waitMs": 5000})
	at8 := d.want(200, "POST", "/v1/runs/run-8/attach", map[string]any{})
	d.want(409, "POST", "/v1/runs/run-8/pump", map[string]any{"cursor": p8["cursor"]})
	d.want(200, "POST", "/v1/runs/run-8/finish", map[string]any{"cursor": at8["cursor"], "status": "aborted",
		"error": map[string]any{"message": "stopped", "code": "cancelled"}})

	// The reference store surface, as TanStack AI's stores call it: the instance map (get,
	// full replace twice, delete twice), an app-driven run (create, resume, patch, reads,
	// listings) that sandkeep's start and attach refuse, a patch of a sandkeep-driven run,
	// and a lock's acquire, refused second acquire, renew, release and stale renew.
	d.want(200, "GET", "/v1/store/instances/ts-key", nil)
	inst := map[string]any{"provider": "local-process", "providerSandboxId": "sb-ts", "threadId": "thread-ts", "updatedAt": 1, "latestSnapshotId": "snap"}
	d.want(204, "PUT", "/v1/store/instances/ts-key", inst)
	delete(inst, "latestSnapshotId")
	d.want(204, "PUT", "/v1/store/instances/ts-key", inst)
	d.want(204, "DELETE", "/v1/store/instances/ts-key", nil)
	d.want(204, "DELETE", "/v1/store/instances/ts-key", nil)
	app := map[string]any{"runId": "app-1", "threadId": "thread-ts", "startedAt": 1}
	d.want(200, "POST", "/v1/store/runs", app)
	d.want(200, "POST", "/v1/store/runs", app)
	d.want(204, "PATCH", "/v1/store/runs/app-1", map[string]any{"sandboxKey": "ts-key", "detachedSince": 5, "driverEpoch": 1})
	d.want(204, "PATCH", "/v1/store/runs/nope", map[string]any{"detachedSince": nil})
	d.want(409, "PATCH", "/v1/store/runs/run-2", map[string]any{"cancelRequested": true})
	d.want(409, "POST", "/v1/store/runs", map[string]any{"runId": "run-2", "threadId": "thread-1", "startedAt": 1})
	d.want(409, "POST", "/v1/runs/app-1/attach", map[string]any{})
	d.want(409, "POST", "/v1/runs", startBody("app-1", "thread-ts", nil))
	d.want(200, "GET", "/v1/store/runs/app-1", nil)
	d.want(200, "GET", "/v1/store/threads/thread-ts/active-run", nil)
	d.want(200, "GET", "/v1/store/threads/thread-ts/runs", nil)
	d.want(200, "GET", "/v1/store/reclaimable?now=10&ttlMs=1", nil)
	lk := d.want(200, "POST", "/v1/store/locks/sandbox:ts-key/acquire", map[string]any{})
	d.want(409, "POST", "/v1/store/locks/sandbox:ts-key/acquire", map[string]any{"waitMs": 0})
	d.want(200, "POST", "/v1/store/locks/sandbox:ts-key/renew", map[string]any{"token": lk["token"]})
	d.want(204, "POST", "/v1/store/locks/sandbox:ts-key/release", map[string]any{"token": lk["token"]})
	d.want(409, "POST", "/v1/store/locks/sandbox:ts-key/renew", map[string]any{"token": lk["token"]})
	d.want(204, "POST", "/v1/store/locks/sandbox:ts-key/release", map[string]any{"token": lk["token"]})

	// The ship routes, as a run's shipper reaches the Ship function through its URL: the
	// probe; a batch with the exit sentinel (stored, the lease renewed in the answer, pushed
	// to a watcher gone since, whose 410 removes it); a batch past the stored position
	// (ship-gap); the end, which settles the one-run sandbox through the provider; and a
	// superseded epoch's batch.
	s9 := d.want(200, "POST", "/v1/runs", startBody("run-9", "thread-9", map[string]any{"reuse": "none"}))
	d.watch("w9", "run-9")
	d.standin.Gone("w9")
	tok9 := shiptoken.Mint([]byte(testCursorKey), shiptoken.Claims{Tenant: d.tenant, RunID: "run-9",
		Epoch: int64(s9["driverEpoch"].(float64)), Expires: d.clock.now().Add(time.Minute)})
	d.shipWant(204, "GET", wire.ShipProbePath, "", "")
	sh := d.shipWant(200, "POST", "/v1/runs/run-9/ship?src=0", tok9, "{\"n\":1}\n"+journal.SentinelLine("run-9", 0)+"\n")
	if sh["state"] != wire.ShipExited {
		t.Fatalf("ship run-9: %v", sh)
	}
	d.shipWant(409, "POST", "/v1/runs/run-9/ship?src=999", sh["token"].(string), "x\n")
	d.clock.advance(10 * time.Second) // a run lasts longer than the reclaim margin: its end destroys the sandbox at once
	if end := d.shipWant(200, "POST", "/v1/runs/run-9/ship/end?code=0", sh["token"].(string), ""); end["status"] != "completed" {
		t.Fatalf("ship end run-9: %v", end)
	}
	if n := d.providers[awsfn.Ship].calls.Load(); n == 0 {
		t.Fatal("the ship end of a one-run sandbox's run made no provider call: the sandbox outlives its run")
	}
	s10 := d.want(200, "POST", "/v1/runs", startBody("run-10", "thread-10", nil))
	tok10 := shiptoken.Mint([]byte(testCursorKey), shiptoken.Claims{Tenant: d.tenant, RunID: "run-10",
		Epoch: int64(s10["driverEpoch"].(float64)), Expires: d.clock.now().Add(time.Hour)})
	d.want(200, "POST", "/v1/runs/run-10/attach", map[string]any{})
	d.shipWant(403, "POST", "/v1/runs/run-10/ship?src=0", tok10, "{\"n\":1}\n")

	// Reaper: the cancelled detached run (run-4) at once; after the TTL the detached runs
	// (run-2, run-6) and the lapsed run-3; after the retention the idle rows.
	d.sweep()
	d.clock.advance(20 * time.Minute)
	d.sweep()
	d.clock.advance(2 * time.Hour)
	d.sweep()
	d.sweep()
	st, body := d.do("GET", "/v1/runs/run-2", nil)
	if st != 200 || path(body, "run", "status") == "running" {
		t.Fatalf("the reaper left run-2 running after its TTL: %v", body)
	}
	// The app-driven run, detached far past the TTL, is its app's to finalize.
	st, body = d.do("GET", "/v1/store/runs/app-1", nil)
	if st != 200 || path(body, "run", "status") != "running" || path(body, "run", "detachedSince") != 5.0 {
		t.Fatalf("the reaper touched the app-driven run: %v", body)
	}
}

// launch starts agent journaled for runID in the sandbox start answered, as a provider
// sandbox runs it (through the local-process provider itself, not a function's).
func (d *deployment) launch(start map[string]any, runID, agent string) {
	d.t.Helper()
	ctx := contract.WithTenant(context.Background(), d.tenant)
	psid, _ := path(start, "sandbox", "providerSandboxId").(string)
	if _, err := journal.Launch(ctx, d.providers[awsfn.Log].Provider, psid, "", runID, agent); err != nil {
		d.t.Fatalf("launch %s: %v", runID, err)
	}
}

// pumpUntilExited pumps runID through the log function until its answer says exited.
func (d *deployment) pumpUntilExited(runID string, cursor any) map[string]any {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p := d.want(200, "POST", "/v1/runs/"+runID+"/pump", map[string]any{"cursor": cursor, "waitMs": 1000})
		if p["exited"] == true {
			return p
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s never exited: %v", runID, p)
		}
		cursor = p["cursor"]
	}
}

func (d *deployment) sweep() map[string]any {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := d.reaper.Handle(ctx, json.RawMessage(`{}`))
	if err != nil {
		d.t.Fatalf("sweep: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		d.t.Fatalf("sweep report %s: %v", out, err)
	}
	d.t.Logf("sweep at +%s: %s", d.clock, out)
	return m
}

// TestPoliciesEqualIssuedActions: each function's DynamoDB policy in template.yaml equals
// the set of DynamoDB actions its handlers issued while every route (and the reaper) was
// driven through the Lambda adapters against dynalite: nothing missing, nothing extra.
func TestPoliciesEqualIssuedActions(t *testing.T) {
	d := newDeployment(t)
	d.drive()
	tree := loadTree(t)
	for _, fn := range awsfn.Functions() {
		issued := d.counters[fn].Actions()
		granted := dynamoActions(t, tree, fn.LogicalID())
		t.Logf("%s issued %v", fn.LogicalID(), issued)
		if fmt.Sprint(issued) != fmt.Sprint(granted) {
			t.Errorf("%s: policy grants %v, handlers issued %v", fn.LogicalID(), granted, issued)
		}
		// Query resources: the table when it queried the table, index/* when an index.
		q := d.queries[fn]
		res := queryResources(t, tree, fn.LogicalID())
		if q.table.Load() != strings.Contains(res, "map[Fn::GetAtt:[Table Arn]]") || q.index.Load() != strings.Contains(res, "/index/*") {
			t.Errorf("%s: Query on table %v, on an index %v; Query resources granted %s", fn.LogicalID(), q.table.Load(), q.index.Load(), res)
		}
		for _, a := range issued {
			if a == "dynamodb:Scan" || a == "dynamodb:TransactWriteItems" {
				t.Errorf("%s issued %s", fn.LogicalID(), a)
			}
		}
	}
}

// queryResources renders the resources of fn's statements granting dynamodb:Query.
func queryResources(t *testing.T, tree map[string]any, fn string) string {
	stmts, _ := policyStatements(t, tree, fn)
	var out []string
	for _, s := range stmts {
		for _, a := range actionsOf(s) {
			if a == "dynamodb:Query" {
				out = append(out, fmt.Sprint(s["Resource"]))
			}
		}
	}
	return strings.Join(out, " ")
}
