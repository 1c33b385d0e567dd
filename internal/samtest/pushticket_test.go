package samtest

import (
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/pushtest"
)

// TestJWTPushTicket: in a JWT deployment (docs/design.md §8.1) the JWT-authorized resolve
// function issues a push ticket for the caller's tenant, and the push function's $connect
// takes it: the connection is the ticket's tenant's and its subscription delivers. A
// missing, forged, another key's, ship-token, expired, or tenant-naming upgrade is refused
// with the API's problem code and stores no connection item; another tenant's genuine
// ticket opens a connection of that tenant only, whose subscribe to this tenant's run is
// unknown-run and stores no subscription item. Against dynalite, through the adapters.
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
	pushFn, err := awsfn.NewPush(pcfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	backend := awsfn.NewBackend(pcfg, dynamotest.Client(t), time.Now)

	seq := 0
	call := func(tenant, method, path string, body any) (int, map[string]any) {
		t.Helper()
		seq++
		ev := apiGatewayEvent(method, method+" "+path, path, "", "", body, seq)
		delete(ev.Headers, "x-sandkeep-tenant")
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: map[string]string{"tenant": tenant, "sub": "u-" + tenant}}}
		resp, err := resolve.Handle(t.Context(), ev)
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
		seq++
		ev := events.APIGatewayWebsocketProxyRequest{Body: body, Headers: map[string]string{"Host": "push.example"},
			RequestContext: events.APIGatewayWebsocketProxyRequestContext{RouteKey: route, ConnectionID: conn, RequestID: "ws-" + conn, Stage: "dev"}}
		for k, v := range headers {
			ev.Headers[k] = v
		}
		if ticket != "" {
			ev.QueryStringParameters = map[string]string{wire.PushTicketQuery: ticket}
		}
		resp, err := pushFn.Handle(t.Context(), ev)
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
