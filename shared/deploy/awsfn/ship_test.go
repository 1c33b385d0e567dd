package awsfn

import (
	"encoding/base64"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/host/journal"
)

// TestShipThroughTheAdapter: the Ship function serves the ship routes to an event with no
// authorizer (as API Gateway passes a route whose authorizer is NONE) and a binary body;
// the run's ship token on an IAM-authorized route of any function is refused 403
// token-scope and changes nothing, in IAM and JWT mode.
func TestShipThroughTheAdapter(t *testing.T) {
	for _, mode := range []string{AuthIAM, AuthJWT} {
		t.Run(mode, func(t *testing.T) {
			s := newStack(t, mode)
			claims := map[string]string(nil)
			if mode == AuthJWT {
				claims = map[string]string{"tenant": "acme"}
			}
			resp, m := call(t, s.fns[Resolve], event("POST", "POST /v1/runs", "/v1/runs", "",
				map[string]any{"runId": "run-s", "threadId": "thread-s", "sandbox": map[string]any{"id": "default", "provider": "local-process"}},
				map[string]string{"x-sandkeep-tenant": "acme"}, claims))
			if resp.StatusCode != 200 {
				t.Fatalf("start: %d %v", resp.StatusCode, m)
			}
			tok := shiptoken.Mint([]byte(stackKey), shiptoken.Claims{Tenant: "acme", RunID: "run-s",
				Epoch: int64(m["driverEpoch"].(float64)), Expires: time.Now().Add(time.Hour)})
			ship := func(routeKey, path, query, body string) (int, map[string]string, map[string]any) {
				ev := event("POST", routeKey, path, query, nil, map[string]string{"authorization": "Bearer " + tok}, nil)
				ev.RequestContext.Authorizer = nil // the route has no authorizer
				ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString([]byte(body)), true
				ev.Headers["content-type"] = wire.ShipContentType
				resp, m := call(t, s.fns[Ship], ev)
				return resp.StatusCode, resp.Headers, m
			}
			code, hd, m := ship("POST /v1/runs/{runId}/ship", "/v1/runs/run-s/ship", "src=0", "{\"n\":1}\n"+journal.SentinelLine("run-s", 0)+"\n")
			if code != 200 || m["state"] != wire.ShipExited || hd[wire.ShipStateHeader] != wire.ShipExited {
				t.Fatalf("ship: %d %v %v", code, hd, m)
			}
			// The token on every other route, each through its own function, as the IAM or JWT
			// caller it would have to pass as: refused before anything runs.
			n := 0
			for _, f := range Functions() {
				for _, rt := range Routes(f) {
					if rt.Ship() {
						continue
					}
					ev := event(rt.Method, rt.Pattern(), pathOf(rt.Path), "", nil,
						map[string]string{"authorization": "Bearer " + tok, "x-sandkeep-tenant": "acme"}, claims)
					resp, body := call(t, s.fns[f], ev)
					if resp.StatusCode != 403 || body["code"] != "token-scope" {
						t.Fatalf("%s on %s: %d %v, want 403 token-scope", rt.Pattern(), f, resp.StatusCode, body)
					}
					n++
				}
			}
			if n != len(Routes(Resolve))+len(Routes(Detach))+len(Routes(Cancel))+len(Routes(Log))+len(Routes(Wait)) {
				t.Fatalf("%d routes probed", n)
			}
			st, err := s.backend.Runs().State(contract.WithTenant(t.Context(), "acme"), "run-s")
			if err != nil || st == nil || st.Status != contract.StatusRunning || st.Cancelled() {
				t.Fatalf("the run after the probes: %+v %v", st, err)
			}
			if code, _, m := ship("POST /v1/runs/{runId}/ship/end", "/v1/runs/run-s/ship/end", "code=0", ""); code != 200 || m["status"] != "completed" {
				t.Fatalf("end: %d %v", code, m)
			}
		})
	}
}

// pathOf fills a route's path parameters.
func pathOf(p string) string {
	return strings.NewReplacer("{runId}", "run-s", "{threadId}", "thread-s", "{key}", "key-s").Replace(p)
}

// TestShipFunctionURL: the Ship function behind its function URL (docs/design.md §9). A
// function URL's event is payload 2.0 with routeKey $default and no authorizer: the ship
// routes are reached by method and path, the ship token their one credential, and the
// Requests metric names the route matched. Every other route of the API sent there is
// refused 404 before anything runs — with or without an IAM identity and a tenant header
// — and changes nothing.
func TestShipFunctionURL(t *testing.T) {
	s := newStack(t, AuthIAM)
	resp, m := call(t, s.fns[Resolve], event("POST", "POST /v1/runs", "/v1/runs", "",
		map[string]any{"runId": "run-u", "threadId": "thread-u", "sandbox": map[string]any{"id": "default", "provider": "local-process"}},
		map[string]string{"x-sandkeep-tenant": "acme"}, nil))
	if resp.StatusCode != 200 {
		t.Fatalf("start: %d %v", resp.StatusCode, m)
	}
	tok := shiptoken.Mint([]byte(stackKey), shiptoken.Claims{Tenant: "acme", RunID: "run-u",
		Epoch: int64(m["driverEpoch"].(float64)), Expires: time.Now().Add(time.Hour)})
	furl := func(method, path, query string, headers map[string]string, body string) events.APIGatewayV2HTTPRequest {
		h := map[string]string{"host": "shipid.lambda-url.us-east-1.on.aws", "content-type": wire.ShipContentType}
		maps.Copy(h, headers)
		return lambdaevent.Request{Method: method, Path: path, Query: query, Header: h, Body: []byte(body),
			RequestID: "JKJaXmPLvHcESHA=", SourceIP: "203.0.113.9", DomainName: h["host"]}.FunctionURL()
	}
	bearer := map[string]string{"authorization": "Bearer " + tok}
	if resp, _ := call(t, s.fns[Ship], furl("GET", wire.ShipProbePath, "", nil, "")); resp.StatusCode != 204 {
		t.Fatalf("probe: %d", resp.StatusCode)
	}
	resp, m = call(t, s.fns[Ship], furl("POST", "/v1/runs/run-u/ship", "src=0", bearer, "{\"n\":1}\n"))
	if resp.StatusCode != 200 || m["state"] != wire.ShipRunning {
		t.Fatalf("ship: %d %v", resp.StatusCode, m)
	}
	if resp, m := call(t, s.fns[Ship], furl("POST", "/v1/runs/run-u/ship", "src=0", nil, "{\"n\":2}\n")); resp.StatusCode != 401 || m["code"] != "invalid-token" {
		t.Fatalf("ship without the token: %d %v", resp.StatusCode, m)
	}
	s.rec.Flush() // the routine answer's datum is summed (a later minute's first request writes it)
	if !strings.Contains(s.metrics.String(), `"Requests":1,"Route":"POST /v1/runs/{runId}/ship","Status":"200"`) ||
		!strings.Contains(s.metrics.String(), `"Requests":1,"Route":"GET /v1/ship","Status":"204"`) {
		t.Errorf("the function URL's ship request is not counted by its route:\n%s", s.metrics.String())
	}
	n := 0
	for _, f := range Functions() {
		for _, rt := range Routes(f) {
			if rt.Ship() {
				continue
			}
			var body string
			if rt.Method != "GET" {
				body = `{"runId":"run-x","threadId":"thread-x","cursor":"c","sandbox":{"id":"default","provider":"local-process"}}`
			}
			for _, ev := range []events.APIGatewayV2HTTPRequest{
				furl(rt.Method, pathOf(rt.Path), "", map[string]string{"x-sandkeep-tenant": "acme"}, body),
				// As the HTTP API would pass a trusted caller's request, were it misrouted here.
				event(rt.Method, rt.Pattern(), pathOf(rt.Path), "", nil, map[string]string{"x-sandkeep-tenant": "acme"}, nil),
			} {
				resp, m := call(t, s.fns[Ship], ev)
				if resp.StatusCode != 404 || m["code"] != "invalid" || !strings.Contains(fmt.Sprint(m["detail"]), "ship function") {
					t.Fatalf("%s sent to the Ship function: %d %v, want 404 invalid", rt.Pattern(), resp.StatusCode, m)
				}
				n++
			}
		}
	}
	if n != 2*(len(httpapi.Routes())-3-1) { // all but the three ship routes and the dev server's own
		t.Fatalf("%d refusals checked", n)
	}
	ctx := contract.WithTenant(t.Context(), "acme")
	if st, err := s.backend.Runs().State(ctx, "run-x"); err != nil || st != nil {
		t.Fatalf("a start sent to the Ship function stored run-x: %+v %v", st, err)
	}
	if st, err := s.backend.Runs().State(ctx, "run-u"); err != nil || st == nil || st.Status != contract.StatusRunning || st.Cancelled() || st.DetachedSince != nil {
		t.Fatalf("run-u after the refusals: %+v %v", st, err)
	}
	resp, m = call(t, s.fns[Ship], furl("POST", "/v1/runs/run-u/ship/end", "code=0", map[string]string{"authorization": "Bearer " + m["token"].(string)}, ""))
	if resp.StatusCode != 200 || m["status"] != "completed" {
		t.Fatalf("end: %d %v", resp.StatusCode, m)
	}
}
