package samtest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/pushtest"
)

// TestJWTPushTicket: in a JWT deployment (docs/design.md §8.1) the JWT-authorized resolve
// function issues a push ticket for the caller's tenant, and the push function's $connect
// takes it: the connection is the ticket's tenant's and its subscription delivers. A
// missing, forged, another key's, ship-token, expired, or tenant-naming upgrade is refused
// with the API's problem code before the push function makes any DynamoDB call (counted),
// so no connection item is stored; another tenant's genuine ticket opens a connection of
// that tenant only, whose subscribe to this tenant's run is unknown-run and stores no
// subscription item. Against dynalite, through the adapters in process (the emulator's
// run is TestFunctionsUnderRuntimeInterfaceEmulator's "JWT push ticket").
func TestJWTPushTicket(t *testing.T) {
	t.Parallel()
	table := dynamotest.FreshTable(t, dynamotest.Client(t))
	standin := pushtest.Start(t)
	poster, err := push.NewManagement(standin.Endpoint(), pushtest.Region, pushtest.Credentials(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const pushURL = "wss://push.example/dev"
	logger := slog.New(slog.DiscardHandler)
	cfg := awsfn.Config{Table: table, AuthMode: awsfn.AuthJWT, TenantClaim: "tenant", Provider: awsfn.ProviderLocalProcess,
		SandboxDir: t.TempDir(), LockLease: 15 * time.Second, DriverLease: time.Minute, LogRetention: 24 * time.Hour,
		PushEndpoint: standin.Endpoint(), CursorKey: []byte(testCursorKey), PushURL: pushURL}
	deps := awsfn.Deps{DynamoDB: dynamotest.Client(t), Logger: logger, Provider: localprocess.New(cfg.SandboxDir), PushPoster: poster}
	rcfg := cfg
	rcfg.Function = awsfn.Resolve
	resolve, err := awsfn.NewAPI(rcfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	pcfg := cfg
	pcfg.Function, pcfg.PushMaxConnections, pcfg.PushMaxSubscriptions = awsfn.Push, 8, 8
	// The push function's every DynamoDB call is counted: a refused $connect makes none.
	calls := dynamotest.NewCounter()
	pdeps := deps
	pdeps.DynamoDB = dynamotest.Client(t, calls.Attach)
	pushFn, err := awsfn.NewPush(pcfg, pdeps)
	if err != nil {
		t.Fatal(err)
	}
	backend := awsfn.NewBackend(pcfg, dynamotest.Client(t), time.Now)

	seq := 0
	call := func(tenant, method, path string, body any) (int, map[string]any) {
		t.Helper()
		seq++
		resp, err := resolve.Handle(t.Context(), jwtEvent(method, path, tenant, body, seq))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]any{}
		b := []byte(resp.Body)
		if resp.IsBase64Encoded {
			b, _ = base64.StdEncoding.DecodeString(resp.Body)
		}
		_ = json.Unmarshal(b, &out)
		return resp.StatusCode, out
	}
	if st, s := call("acme", "POST", "/v1/runs", startBody("run-t", "thread-t", nil)); st != 200 {
		t.Fatalf("start: %d %v", st, s)
	}
	ticketOf := func(tenant string) string {
		t.Helper()
		st, tk := call(tenant, "POST", wire.PushTicketPath, map[string]any{})
		ticket, _ := tk["ticket"].(string)
		if st != 200 || tk["pushUrl"] != pushURL || ticket == "" {
			t.Fatalf("ticket for %s: %d %v", tenant, st, tk)
		}
		if exp, _ := tk["expiresAt"].(float64); time.Until(time.UnixMilli(int64(exp))) > shiptoken.PushTicketTTL {
			t.Fatalf("ticket expires at %v, more than %v ahead", exp, shiptoken.PushTicketTTL)
		}
		return ticket
	}
	acme, other := ticketOf("acme"), ticketOf("other")

	ws := func(route, conn, ticket, body string, headers map[string]string) events.APIGatewayProxyResponse {
		t.Helper()
		resp, err := pushFn.Handle(t.Context(), ticketEvent(route, conn, ticket, body, headers))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	acmeCtx := contract.WithTenant(t.Context(), "acme")
	payload, sig, _ := strings.Cut(strings.TrimPrefix(acme, shiptoken.PushPrefix), ".")
	raw, _ := base64.RawURLEncoding.DecodeString(payload)
	forged := shiptoken.PushPrefix + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(raw), `"acme"`, `"other"`, 1))) + "." + sig
	key := []byte(testCursorKey)
	for _, c := range []struct {
		name, ticket string
		headers      map[string]string
		status       int
		code         string
	}{
		{"no ticket", "", nil, 401, wire.CodeInvalidToken},
		{"no ticket, a tenant header", "", map[string]string{"X-Sandkeep-Tenant": "acme"}, 401, wire.CodeInvalidToken},
		{"forged tenant", forged, nil, 401, wire.CodeInvalidToken},
		{"another key", shiptoken.MintPushTicket([]byte("another key of at least 32 bytes!"), "acme", time.Now().Add(time.Minute)), nil, 401, wire.CodeInvalidToken},
		{"a ship token", shiptoken.Mint(key, shiptoken.Claims{Tenant: "acme", RunID: "run-t", Epoch: 1, Expires: time.Now().Add(time.Minute)}), nil, 401, wire.CodeInvalidToken},
		{"expired", shiptoken.MintPushTicket(key, "acme", time.Now().Add(-time.Second)), nil, 401, wire.CodeTokenExpired},
		{"a tenant beside the ticket", other, map[string]string{"X-Sandkeep-Tenant": "acme"}, 403, wire.CodeTokenScope},
	} {
		conn := "bad-" + strings.ReplaceAll(c.name, " ", "-")
		resp := ws("$connect", conn, c.ticket, "", c.headers)
		var p wire.Problem
		_ = json.Unmarshal([]byte(resp.Body), &p)
		if resp.StatusCode != c.status || p.Code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, resp.StatusCode, resp.Body, c.status, c.code)
		}
		if tenant, ok, err := backend.ConnectionTenant(t.Context(), conn); err != nil || ok {
			t.Errorf("%s: a connection item was stored (tenant %q, %v)", c.name, tenant, err)
		}
	}
	if n := calls.Total(); n != 0 {
		t.Errorf("the refused upgrades made %d DynamoDB calls, want none (refused before anything is read or written)", n)
	}

	// Another tenant's genuine ticket: a connection of that tenant, to which this tenant's
	// run does not exist.
	if resp := ws("$connect", "conn-other", other, "", nil); resp.StatusCode != 200 {
		t.Fatalf("other's $connect: %d %s", resp.StatusCode, resp.Body)
	}
	if tenant, ok, err := backend.ConnectionTenant(t.Context(), "conn-other"); err != nil || !ok || tenant != "other" {
		t.Fatalf("other's connection: %q %v %v", tenant, ok, err)
	}
	ws("subscribe", "conn-other", "", `{"type":"subscribe","runId":"run-t","after":0}`, nil)
	got := standin.Await(t, "conn-other", 10*time.Second, func(m []wire.PushMessage) bool { return len(m) > 0 })
	if got[0].Type != wire.PushError || got[0].Problem == nil || got[0].Problem.Code != wire.CodeUnknownRun {
		t.Errorf("other's subscribe to acme's run: %+v", got)
	}
	if subs, err := backend.Subscriptions(acmeCtx, "run-t"); err != nil || len(subs) != 0 {
		t.Errorf("subscriptions of run-t after other's refused subscribe: %+v %v", subs, err)
	}

	// The happy path: acme's ticket, acme's connection, acme's run delivered.
	resp := ws("$connect", "conn-acme", acme, "", map[string]string{"Sec-WebSocket-Protocol": wire.PushSubprotocol})
	if resp.StatusCode != 200 || resp.Headers["Sec-WebSocket-Protocol"] != wire.PushSubprotocol {
		t.Fatalf("acme's $connect: %d %v %s", resp.StatusCode, resp.Headers, resp.Body)
	}
	if tenant, ok, err := backend.ConnectionTenant(t.Context(), "conn-acme"); err != nil || !ok || tenant != "acme" {
		t.Fatalf("acme's connection: %q %v %v", tenant, ok, err)
	}
	ws("subscribe", "conn-acme", "", `{"type":"subscribe","runId":"run-t","after":0}`, nil)
	got = standin.Await(t, "conn-acme", 10*time.Second, func(m []wire.PushMessage) bool { return len(m) > 0 })
	if got[0].Type != wire.PushSubscribed || got[0].RunID != "run-t" {
		t.Errorf("acme's subscribe: %+v", got)
	}
	if subs, err := backend.Subscriptions(acmeCtx, "run-t"); err != nil || len(subs) != 1 || subs[0].ConnID != "conn-acme" {
		t.Errorf("subscriptions of run-t: %+v %v", subs, err)
	}
}

// jwtEvent is an HTTP API event as API Gateway sends it behind a JWT authorizer: the
// verified claims (tenant claim "tenant"), no identity, no tenant header.
func jwtEvent(method, p, tenant string, body any, seq int) events.APIGatewayV2HTTPRequest {
	key, _ := routeOf(method, p)
	return lambdaevent.Request{Method: method, RouteKey: key, Path: p, Header: map[string]string{"host": "api.example"},
		RequestID: fmt.Sprintf("req%06d=", seq), Authorizer: lambdaevent.JWT(map[string]string{"tenant": tenant, "sub": "u-" + tenant})}.JSON(body).Event()
}

// ticketEvent is a WebSocket API event of a JWT deployment: $connect unauthorized at API
// Gateway (no identity), the push ticket in the query (none for ""), or a message.
func ticketEvent(route, conn, ticket, body string, headers map[string]string) events.APIGatewayWebsocketProxyRequest {
	h := map[string]string{"Host": "push.example"}
	maps.Copy(h, headers)
	ws := lambdaevent.WebSocket{Route: route, ConnID: conn, Body: body, Header: h, RequestID: "ws-" + conn, Stage: "dev"}
	if ticket != "" {
		ws.Query = map[string]string{wire.PushTicketQuery: ticket}
	}
	return ws.Event()
}

// jwtPushUnderEmulator is the JWT deployment's push path through the functions' own
// bootstraps under the Runtime Interface Emulator (env: the IAM run's, made a JWT
// deployment's as template.yaml makes it): the resolve function issues a ticket to a
// JWT-authorized caller, the push function's $connect takes it (and refuses another key's
// before storing anything), the subscription is the ticket's tenant's, and the log
// function's append reaches the watcher through the management endpoint's stand-in;
// another tenant's ticket connects, but its subscribe to the run is unknown-run.
func jwtPushUnderEmulator(t *testing.T, rie string, boots map[awsfn.Function]string, env []string, standin *pushtest.StandIn, table string) {
	const pushURL = "wss://push.example/dev"
	var jwtEnv []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, awsfn.EnvAuthMode+"=") {
			jwtEnv = append(jwtEnv, kv)
		}
	}
	jwtEnv = append(jwtEnv, awsfn.EnvAuthMode+"="+awsfn.AuthJWT, awsfn.EnvTenantClaim+"=tenant", awsfn.EnvPushURL+"="+pushURL)
	resolve := startRIE(t, rie, boots[awsfn.Resolve], awsfn.Resolve, jwtEnv)
	pushFn := startRIE(t, rie, boots[awsfn.Push], awsfn.Push, jwtEnv)
	logFn := startRIE(t, rie, boots[awsfn.Log], awsfn.Log, jwtEnv)
	ws := func(ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, wire.Problem) {
		t.Helper()
		var resp events.APIGatewayProxyResponse
		if out := pushFn.invoke(t, ev); json.Unmarshal(out, &resp) != nil {
			t.Fatalf("push %s: not a WebSocket API response: %s", ev.RequestContext.RouteKey, out)
		}
		var p wire.Problem
		_ = json.Unmarshal([]byte(resp.Body), &p)
		return resp, p
	}
	ticketOf := func(tenant string, seq int) string {
		t.Helper()
		st, tk := resolve.answer(t, "JWT ticket of "+tenant, jwtEvent("POST", wire.PushTicketPath, tenant, map[string]any{}, seq))
		ticket, _ := tk["ticket"].(string)
		if st != 200 || tk["pushUrl"] != pushURL || !strings.HasPrefix(ticket, shiptoken.PushPrefix) {
			t.Fatalf("the ticket of %s: %d %v", tenant, st, tk)
		}
		return ticket
	}

	st, s := resolve.answer(t, "JWT start", jwtEvent("POST", "/v1/runs", "acme", startBody("run-jt", "thread-jt", nil), 11))
	if st != 200 {
		t.Fatalf("JWT start: %d %v", st, s)
	}
	acme, other := ticketOf("acme", 12), ticketOf("other", 13)
	backend := awsfn.NewBackend(awsfn.Config{Table: table}, dynamotest.Client(t), time.Now)
	forged := shiptoken.MintPushTicket([]byte("another key of at least 32 bytes!"), "acme", time.Now().Add(time.Minute))
	if resp, p := ws(ticketEvent("$connect", "wsJ-forged=", forged, "", nil)); resp.StatusCode != 401 || p.Code != wire.CodeInvalidToken {
		t.Fatalf("another key's ticket: %d %s", resp.StatusCode, resp.Body)
	}
	if tenant, ok, err := backend.ConnectionTenant(t.Context(), "wsJ-forged="); err != nil || ok {
		t.Fatalf("the refused upgrade stored a connection (tenant %q, %v)", tenant, err)
	}
	for conn, ticket := range map[string]string{"wsJ=": acme, "wsJ-other=": other} {
		resp, _ := ws(ticketEvent("$connect", conn, ticket, "", map[string]string{"Sec-WebSocket-Protocol": wire.PushSubprotocol}))
		if resp.StatusCode != 200 || resp.Headers["Sec-WebSocket-Protocol"] != wire.PushSubprotocol {
			t.Fatalf("$connect %s: %d %v %s", conn, resp.StatusCode, resp.Headers, resp.Body)
		}
		if resp, _ := ws(ticketEvent("subscribe", conn, "", `{"type":"subscribe","runId":"run-jt"}`, nil)); resp.StatusCode != 200 {
			t.Fatalf("subscribe %s: %d %s", conn, resp.StatusCode, resp.Body)
		}
	}
	if tenant, ok, err := backend.ConnectionTenant(t.Context(), "wsJ="); err != nil || !ok || tenant != "acme" {
		t.Fatalf("the ticketed connection's tenant: %q %v %v", tenant, ok, err)
	}
	if got := standin.Await(t, "wsJ-other=", 10*time.Second, func(m []wire.PushMessage) bool { return len(m) > 0 }); got[0].Type != wire.PushError ||
		got[0].Problem == nil || got[0].Problem.Code != wire.CodeUnknownRun {
		t.Fatalf("another tenant's subscribe to run-jt: %+v", got)
	}
	st, a := logFn.answer(t, "JWT append", jwtEvent("POST", "/v1/runs/run-jt/events", "acme",
		map[string]any{"cursor": s["cursor"], "events": []any{map[string]any{"data": "jwt"}}}, 14))
	if st != 200 || a["lastOffset"] != float64(2) { // offset 1: the subscribe's watch marker (docs/design.md §8.1)
		t.Fatalf("JWT append: %d %v", st, a)
	}
	got := standin.Await(t, "wsJ=", 10*time.Second, func(m []wire.PushMessage) bool { return len(m) >= 2 })
	if len(got) != 2 || got[0].Type != wire.PushSubscribed || got[1].Type != wire.PushEvents || len(got[1].Events) != 1 ||
		got[1].Events[0].Offset != 2 || string(got[1].Events[0].Data) != `"jwt"` {
		t.Fatalf("the ticketed watcher received %+v", got)
	}
	if other := standin.Messages(t, "wsJ-other="); len(other) != 1 {
		t.Fatalf("another tenant's connection received %+v", other)
	}
}
