package awsfn

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

// syncBuffer is a goroutine-safe sink for logs and metrics.
type syncBuffer = syncbuf.Buffer

// stack is the shared handler over memstore plus one adapter per API function.
type stack struct {
	backend *memstore.Store
	fns     map[Function]*API
	logs    *syncBuffer
	metrics *syncBuffer
	rec     *emf.Recorder // every function's, into metrics
}

// stackKey is the stack's cursor key; stackPushURL the push URL its JWT mode issues
// push tickets for (an IAM stack issues none: 501 unsupported).
const (
	stackKey     = "adapter test key, long enough!!"
	stackPushURL = "wss://push.example/dev"
)

func newStack(t *testing.T, authMode string) *stack {
	t.Helper()
	b := memstore.New()
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{localprocess.New(t.TempDir())}})
	if err != nil {
		t.Fatal(err)
	}
	var auth httpapi.Authenticator = httpapi.IAMAuth{}
	if authMode == AuthJWT {
		auth = httpapi.JWTAuth{}
	}
	s := &stack{backend: b, fns: map[Function]*API{}, logs: &syncBuffer{}, metrics: &syncBuffer{}}
	s.rec = emf.New(s.metrics)
	logger := NewLogger(s.logs, "")
	cfg := httpapi.Config{Keeper: k, Auth: auth, CursorKey: []byte(stackKey), Logger: logger}
	if authMode == AuthJWT {
		cfg.PushTicketURL = stackPushURL // as the template tells a JWT deployment's resolve function
	}
	h := httpapi.New(cfg)
	for _, f := range Functions() {
		if len(Routes(f)) > 0 {
			s.fns[f] = NewAPIAdapter(f, h, Auth{Mode: authMode, Trusted: testTrusted(t)}, logger, s.rec)
		}
	}
	return s
}

// trustedSession is the userArn API Gateway reports for a session of testTrusted's role
// (a role with a path: the session ARN omits it).
const trustedSession = "arn:aws:sts::123456789012:assumed-role/app/i-0abc123"

// testTrusted trusts the role arn:aws:iam::123456789012:role/service/app.
func testTrusted(t *testing.T) TrustedRoles {
	t.Helper()
	r, err := ParseTrustedRoles("arn:aws:iam::123456789012:role/service/app")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// event builds an API Gateway v2 event as API Gateway sends it: lower-case headers,
// routeKey, raw path and query, IAM identity unless claims are given.
func event(method, routeKey, path, query string, body any, headers map[string]string, claims map[string]string) events.APIGatewayV2HTTPRequest {
	auth := lambdaevent.IAM("123456789012", trustedSession)
	if claims != nil {
		auth = lambdaevent.JWT(claims)
	}
	h := map[string]string{"host": "abc.execute-api.us-east-1.amazonaws.com"}
	maps.Copy(h, headers)
	return lambdaevent.Request{Method: method, RouteKey: routeKey, Path: path, Query: query, Header: h,
		RequestID: "JKJaXmPLvHcESHA=", SourceIP: "203.0.113.9", Authorizer: auth}.JSON(body).Event()
}

func call(t *testing.T, a *API, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, map[string]any) {
	t.Helper()
	ctx := lambdacontext.NewContext(context.Background(), &lambdacontext.LambdaContext{AwsRequestID: "8f5e-lambda-id"})
	resp, err := a.Handle(ctx, ev)
	if err != nil {
		t.Fatalf("Handle returned an error: %v", err)
	}
	body := resp.Body
	if resp.IsBase64Encoded {
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			t.Fatal(err)
		}
		body = string(b)
	}
	var m map[string]any
	if resp.StatusCode == 204 && body == "" {
		return resp, nil // a store route's write answers no body
	}
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("%d body is not JSON: %q", resp.StatusCode, body)
	}
	return resp, m
}

func TestAdapterFlowIAM(t *testing.T) {
	s := newStack(t, AuthIAM)
	tenant := map[string]string{httpapi.TenantHeader: "acme"}
	start := map[string]any{"runId": "run-1", "threadId": "thread-1", "sandbox": map[string]any{"id": "default", "provider": "local-process"}}

	resp, m := call(t, s.fns[Resolve], event("POST", "POST /v1/runs", "/v1/runs", "", start, tenant, nil))
	if resp.StatusCode != 200 || m["outcome"] != "created" || resp.IsBase64Encoded {
		t.Fatalf("start: %d %v (base64 %v)", resp.StatusCode, m, resp.IsBase64Encoded)
	}
	// The request id is API Gateway's, made safe; never the caller's.
	if got := resp.Headers[httpapi.RequestIDHeader]; got != "JKJaXmPLvHcESHA" {
		t.Fatalf("request id %q", got)
	}
	cursor := m["cursor"].(string)

	// The run lives under the header's tenant.
	if st, err := refstore.Runs(s.backend.Runs()).Get(contract.WithTenant(t.Context(), "acme"), "run-1"); err != nil || st == nil {
		t.Fatalf("run under tenant acme: %v, %v", st, err)
	}

	resp, m = call(t, s.fns[Log], event("POST", "POST /v1/runs/{runId}/events", "/v1/runs/run-1/events", "",
		map[string]any{"cursor": cursor, "events": []any{map[string]any{"data": "a"}, map[string]any{"data": "b"}}}, tenant, nil))
	if resp.StatusCode != 200 || m["lastOffset"] != float64(2) {
		t.Fatalf("append: %d %v", resp.StatusCode, m)
	}
	// Query string reaches the handler (limit=1 still returns the whole first item).
	resp, m = call(t, s.fns[Wait], event("GET", "GET /v1/runs/{runId}/events", "/v1/runs/run-1/events", "after=0&limit=1", nil, tenant, nil))
	if resp.StatusCode != 200 || len(m["events"].([]any)) != 2 {
		t.Fatalf("read: %d %v", resp.StatusCode, m)
	}
	resp, m = call(t, s.fns[Wait], event("GET", "GET /v1/runs/{runId}/events", "/v1/runs/run-1/events", "after=2&limit=x", nil, tenant, nil))
	if resp.StatusCode != 400 || m["code"] != "invalid" {
		t.Fatalf("bad query: %d %v", resp.StatusCode, m)
	}

	resp, m = call(t, s.fns[Detach], event("POST", "POST /v1/runs/{runId}/detach", "/v1/runs/run-1/detach", "", map[string]any{"cursor": cursor}, tenant, nil))
	if resp.StatusCode != 200 {
		t.Fatalf("detach: %d %v", resp.StatusCode, m)
	}
	resp, m = call(t, s.fns[Cancel], event("POST", "POST /v1/threads/{threadId}/cancel", "/v1/threads/thread-1/cancel", "", map[string]any{}, tenant, nil))
	if resp.StatusCode != 202 {
		t.Fatalf("cancel thread: %d %v", resp.StatusCode, m)
	}

	// Another tenant sees nothing.
	resp, m = call(t, s.fns[Resolve], event("GET", "GET /v1/runs/{runId}", "/v1/runs/run-1", "", nil, map[string]string{httpapi.TenantHeader: "other"}, nil))
	if resp.StatusCode != 404 || m["code"] != "unknown-run" {
		t.Fatalf("other tenant: %d %v", resp.StatusCode, m)
	}

	// Requests and Superseded metrics: one Requests line per invocation, by route key.
	if n := strings.Count(s.metrics.String(), `"Requests":1`); n != 7 {
		t.Fatalf("%d Requests metric lines, want 7:\n%s", n, s.metrics.String())
	}
	if !strings.Contains(s.metrics.String(), `"Route":"POST /v1/runs/{runId}/events"`) {
		t.Fatalf("metrics lack the route key: %s", s.metrics.String())
	}
	// Every log line is JSON and carries the Lambda request id.
	for _, l := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil || line["awsRequestId"] != "8f5e-lambda-id" {
			t.Fatalf("log line %q: %v", l, err)
		}
	}
}

func TestAdapterServesOnlyItsRoutes(t *testing.T) {
	s := newStack(t, AuthIAM)
	tenant := map[string]string{httpapi.TenantHeader: "acme"}
	owner := map[string]Function{}
	for f, a := range s.fns {
		_ = a
		for _, r := range Routes(f) {
			owner[r.Pattern()] = f
		}
	}
	paths := map[string]string{
		"POST /v1/runs": "/v1/runs", "POST /v1/runs/{runId}/attach": "/v1/runs/r/attach", "GET /v1/runs/{runId}": "/v1/runs/r",
		"POST /v1/runs/{runId}/snapshot": "/v1/runs/r/snapshot", "GET /v1/threads/{threadId}/active-run": "/v1/threads/t/active-run",
		"POST /v1/runs/{runId}/heartbeat": "/v1/runs/r/heartbeat", "POST /v1/runs/{runId}/detach": "/v1/runs/r/detach",
		"POST /v1/runs/{runId}/cancel": "/v1/runs/r/cancel", "POST /v1/threads/{threadId}/cancel": "/v1/threads/t/cancel",
		"POST /v1/runs/{runId}/events": "/v1/runs/r/events", "GET /v1/runs/{runId}/events": "/v1/runs/r/events",
		"POST /v1/runs/{runId}/finish": "/v1/runs/r/finish", "POST /v1/runs/{runId}/agent": "/v1/runs/r/agent",
		"POST /v1/runs/{runId}/pump": "/v1/runs/r/pump",
		"GET /v1/ship":               "/v1/ship", "POST /v1/runs/{runId}/ship": "/v1/runs/r/ship",
		"POST /v1/runs/{runId}/ship/end": "/v1/runs/r/ship/end",
		"GET /v1/runs":                   "/v1/runs", "GET /v1/runs/{runId}/view": "/v1/runs/r/view",
		"GET /v1/store/instances/{key}": "/v1/store/instances/k", "PUT /v1/store/instances/{key}": "/v1/store/instances/k",
		"DELETE /v1/store/instances/{key}": "/v1/store/instances/k", "POST /v1/store/runs": "/v1/store/runs",
		"GET /v1/store/runs/{runId}": "/v1/store/runs/r", "PATCH /v1/store/runs/{runId}": "/v1/store/runs/r",
		"GET /v1/store/threads/{threadId}/active-run": "/v1/store/threads/t/active-run",
		"GET /v1/store/threads/{threadId}/runs":       "/v1/store/threads/t/runs", "GET /v1/store/reclaimable": "/v1/store/reclaimable",
		"POST /v1/store/locks/{key}/acquire": "/v1/store/locks/k/acquire", "POST /v1/store/locks/{key}/renew": "/v1/store/locks/k/renew",
		"POST /v1/store/locks/{key}/release": "/v1/store/locks/k/release",
		"POST /v1/push/ticket":               "/v1/push/ticket",
	}
	if len(paths) != len(owner) {
		t.Fatalf("test covers %d routes, functions serve %d", len(paths), len(owner))
	}
	refused := 0
	for pattern, path := range paths {
		method, _, _ := strings.Cut(pattern, " ")
		for f, a := range s.fns {
			resp, m := call(t, a, event(method, pattern, path, "", map[string]any{}, tenant, nil))
			if f == owner[pattern] {
				if resp.StatusCode == 404 && m["code"] == "invalid" {
					t.Errorf("%s refused its own route %s", f, pattern)
				}
				continue
			}
			if resp.StatusCode != 404 || m["code"] != "invalid" || m["requestId"] != "JKJaXmPLvHcESHA" {
				t.Errorf("%s served %s: %d %v", f, pattern, resp.StatusCode, m)
			}
			refused++
		}
	}
	if refused != len(paths)*(len(s.fns)-1) {
		t.Fatalf("%d refusals, want %d", refused, len(paths)*(len(s.fns)-1))
	}
}

func TestAdapterTenantTrust(t *testing.T) {
	start := map[string]any{"runId": "run-j", "threadId": "thread-j", "sandbox": map[string]any{"id": "default", "provider": "local-process"}}
	t.Run("IAM header without IAM authorizer is ignored", func(t *testing.T) {
		s := newStack(t, AuthIAM)
		ev := event("POST", "POST /v1/runs", "/v1/runs", "", start, map[string]string{httpapi.TenantHeader: "acme"}, nil)
		ev.RequestContext.Authorizer = nil
		resp, m := call(t, s.fns[Resolve], ev)
		if resp.StatusCode != 401 || m["code"] != "unauthenticated" {
			t.Fatalf("%d %v", resp.StatusCode, m)
		}
	})
	t.Run("JWT claims name the tenant, the header never does", func(t *testing.T) {
		s := newStack(t, AuthJWT)
		ev := event("POST", "POST /v1/runs", "/v1/runs", "", start, map[string]string{httpapi.TenantHeader: "victim"},
			map[string]string{"tenant": "user@example.com", "sub": "u1"})
		resp, m := call(t, s.fns[Resolve], ev)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, m)
		}
		mapped := httpapi.MapTenant("user@example.com")
		if st, _ := refstore.Runs(s.backend.Runs()).Get(contract.WithTenant(t.Context(), mapped), "run-j"); st == nil {
			t.Fatalf("run not under the claim's tenant %s", mapped)
		}
		if st, _ := refstore.Runs(s.backend.Runs()).Get(contract.WithTenant(t.Context(), "victim"), "run-j"); st != nil {
			t.Fatal("the header chose the tenant under JWT")
		}
		// No claims (an IAM-shaped event reaching a JWT deployment): unauthenticated.
		resp, m = call(t, s.fns[Resolve], event("GET", "GET /v1/runs/{runId}", "/v1/runs/run-j", "", nil, map[string]string{httpapi.TenantHeader: mapped}, nil))
		if resp.StatusCode != 401 {
			t.Fatalf("%d %v", resp.StatusCode, m)
		}
	})
}

func TestAdapterMalformedEvents(t *testing.T) {
	s := newStack(t, AuthIAM)
	ev := event("POST", "POST /v1/runs", "/v1/runs", "", map[string]any{}, map[string]string{httpapi.TenantHeader: "acme"}, nil)
	ev.Body = "%%% not base64"
	resp, m := call(t, s.fns[Resolve], ev)
	if resp.StatusCode != 400 || m["code"] != "invalid" {
		t.Fatalf("bad base64: %d %v", resp.StatusCode, m)
	}
	ev = events.APIGatewayV2HTTPRequest{} // a direct invoke with an empty payload
	resp, m = call(t, s.fns[Resolve], ev)
	if resp.StatusCode != 400 || m["requestId"] != "8f5e-lambda-id" {
		t.Fatalf("empty event: %d %v", resp.StatusCode, m)
	}
}

func TestResponseEncoding(t *testing.T) {
	a := NewAPIAdapter(Resolve, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("kind") {
		case "binary":
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write([]byte{0xff, 0x00, 0x01})
		case "cookies":
			http.SetCookie(w, &http.Cookie{Name: "a", Value: "1"})
			http.SetCookie(w, &http.Cookie{Name: "b", Value: "2"})
			w.Header().Add("Vary", "X-One")
			w.Header().Add("Vary", "X-Two")
			w.WriteHeader(204)
		default:
			// Echo what the handler saw of the request.
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(r.Body)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte(r.Method + " " + r.URL.RequestURI() + " " + r.Header.Get("Cookie") + " " + body.String() + " " + r.PathValue("runId")))
		}
	}), Auth{Mode: AuthIAM, Trusted: testTrusted(t)}, slog.New(slog.DiscardHandler), nil)

	resp, err := a.Handle(t.Context(), event("GET", "GET /v1/runs/{runId}", "/v1/runs/x", "kind=binary", nil, nil, nil))
	if err != nil || !resp.IsBase64Encoded || resp.Body != base64.StdEncoding.EncodeToString([]byte{0xff, 0, 1}) {
		t.Fatalf("binary: %+v %v", resp, err)
	}
	resp, _ = a.Handle(t.Context(), event("GET", "GET /v1/runs/{runId}", "/v1/runs/x", "kind=cookies", nil, nil, nil))
	if resp.StatusCode != 204 || len(resp.Cookies) != 2 || resp.Headers["Vary"] != "X-One,X-Two" || resp.Headers["Set-Cookie"] != "" {
		t.Fatalf("cookies: %+v", resp)
	}
	ev := event("GET", "GET /v1/runs/{runId}", "/v1/runs/x%2Dy", "a=1&b=2", nil, nil, nil)
	ev.Cookies = []string{"s=1", "t=2"}
	ev.Body, ev.IsBase64Encoded = "plain body", false
	resp, _ = a.Handle(t.Context(), ev)
	if resp.IsBase64Encoded || resp.Body != "GET /v1/runs/x%2Dy?a=1&b=2 s=1; t=2 plain body x-y" {
		t.Fatalf("echo: %q", resp.Body)
	}
}

// TestAdapterMalformedEscapes: through the adapter, a bad %-escape in the path or the
// query is problem+json 400 invalid on every route of every function (the query's was
// dropped silently and the route served with its default).
func TestAdapterMalformedEscapes(t *testing.T) {
	s := newStack(t, AuthIAM)
	tenant := map[string]string{httpapi.TenantHeader: "acme"}
	for f, a := range s.fns {
		for _, rt := range Routes(f) {
			good := strings.NewReplacer("{runId}", "r", "{threadId}", "t").Replace(rt.Path)
			bad := strings.NewReplacer("{runId}", "a%zz", "{threadId}", "a%E0%A4%A").Replace(rt.Path)
			if bad == rt.Path {
				bad += "%zz"
			}
			for _, ev := range []events.APIGatewayV2HTTPRequest{
				event(rt.Method, rt.Pattern(), good, "limit=%zz", map[string]any{}, tenant, nil),
				event(rt.Method, rt.Pattern(), good, "after=1;limit=2", map[string]any{}, tenant, nil),
				event(rt.Method, rt.Pattern(), bad, "", map[string]any{}, tenant, nil),
			} {
				resp, m := call(t, a, ev)
				if resp.StatusCode != 400 || m["code"] != "invalid" || resp.Headers["Content-Type"] != httpapi.ProblemContentType {
					t.Errorf("%s %s?%s on %s: %d %v", rt.Method, ev.RawPath, ev.RawQueryString, f, resp.StatusCode, m)
				}
			}
		}
	}
}

// TestWaitFunctionBoundsTenantWaits: a Wait function container built as the Lambda runs
// it (NewAPI, DynamoDB on dynalite) with MaxWaiting 1 holds one idle long poll of tenant
// acme; acme's next waiting request is 429 too-many-waiting with Retry-After, another
// tenant's is served; once acme's poll answers, its place is free again.
func TestWaitFunctionBoundsTenantWaits(t *testing.T) {
	client := dynamotest.Client(t)
	table := dynamotest.FreshTable(t, client)
	build := func(fn Function) *API {
		cfg := Config{Function: fn, Table: table, AuthMode: AuthIAM, TrustedRoles: testTrusted(t), TenantClaim: httpapi.DefaultTenantClaim,
			CursorKey: []byte("waiting test cursor key, 32 byte"), Provider: ProviderLocalProcess, SandboxDir: filepath.Join(t.TempDir(), "sb"),
			LockLease: 15 * time.Second, DriverLease: time.Minute, LogRetention: time.Hour, MaxWaiting: 1}
		api, err := NewAPI(cfg, Deps{DynamoDB: client, Logger: NewLogger(&syncBuffer{}, "")})
		if err != nil {
			t.Fatal(err)
		}
		return api
	}
	resolve, logFn, wait := build(Resolve), build(Log), build(Wait)
	as := func(tenant string) map[string]string { return map[string]string{httpapi.TenantHeader: tenant} }
	start := func(tenant string) string {
		body := map[string]any{"runId": "run-w", "threadId": "th-w", "sandbox": map[string]any{"id": "s", "provider": ProviderLocalProcess}}
		resp, m := call(t, resolve, event("POST", "POST /v1/runs", "/v1/runs", "", body, as(tenant), nil))
		if resp.StatusCode != 200 {
			t.Fatalf("start as %s: %d %v", tenant, resp.StatusCode, m)
		}
		return m["cursor"].(string)
	}
	cur := start("acme")
	start("beta")
	poll := func(tenant, waitMs string) (events.APIGatewayV2HTTPResponse, map[string]any) {
		return call(t, wait, event("GET", "GET /v1/runs/{runId}/events", "/v1/runs/run-w/events", "waitMs="+waitMs, nil, as(tenant), nil))
	}
	held := make(chan map[string]any, 1)
	go func() {
		for {
			if resp, m := poll("acme", "20000"); resp.StatusCode != 429 {
				held <- m
				return
			}
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	resp, m := poll("acme", "1")
	for resp.StatusCode != 429 {
		if resp.StatusCode != 200 || time.Now().After(deadline) {
			t.Fatalf("acme never reached its bound of 1: %d %v", resp.StatusCode, m)
		}
		resp, m = poll("acme", "1")
	}
	if m["code"] != "too-many-waiting" || resp.Headers["Retry-After"] == "" {
		t.Fatalf("past the bound: %d %v %v", resp.StatusCode, resp.Headers, m)
	}
	if resp, m := poll("beta", "1"); resp.StatusCode != 200 {
		t.Fatalf("another tenant's wait: %d %v", resp.StatusCode, m)
	}
	if resp, m := call(t, logFn, event("POST", "POST /v1/runs/{runId}/events", "/v1/runs/run-w/events", "",
		map[string]any{"cursor": cur, "events": []any{map[string]any{"data": "wake"}}}, as("acme"), nil)); resp.StatusCode != 200 {
		t.Fatalf("append: %d %v", resp.StatusCode, m)
	}
	if got := <-held; len(got["events"].([]any)) != 1 {
		t.Fatalf("the held poll answered %v", got)
	}
	if resp, m := poll("acme", "1"); resp.StatusCode != 200 {
		t.Fatalf("acme's place after its poll answered: %d %v", resp.StatusCode, m)
	}
}
