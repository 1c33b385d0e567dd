package lambdaevent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
)

// TestGatewayRoundTrip: a request through Gateway reaches the handler as the payload 2.0
// event of its route (lower-case headers, repeated ones joined, the raw path and query,
// the body base64, the Host as domain), and the handler's answer (base64 or text, headers,
// cookies, status) comes back as the HTTP answer; a request no route matches is 404
// without an invoke, a handler's error 502.
func TestGatewayRoundTrip(t *testing.T) {
	t.Parallel()
	var got []events.APIGatewayV2HTTPRequest
	g := &Gateway{Route: Routes("POST /v1/runs/{runId}/ship", "GET /v1/ship"),
		Handler: func(_ context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
			got = append(got, ev)
			if ev.RawQueryString == "fail=1" {
				return events.APIGatewayV2HTTPResponse{}, errors.New("invoke failed")
			}
			if ev.RequestContext.HTTP.Method == "GET" {
				return events.APIGatewayV2HTTPResponse{StatusCode: 200, Body: "plain"}, nil
			}
			return events.APIGatewayV2HTTPResponse{StatusCode: 201, Headers: map[string]string{"X-Answer": "yes"},
				Cookies: []string{"a=1"}, Body: base64.StdEncoding.EncodeToString([]byte{0xff, 0x00}), IsBase64Encoded: true}, nil
		}}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)

	req, _ := http.NewRequest("POST", srv.URL+"/v1/runs/run-1/ship?src=0", strings.NewReader("line\n"))
	req.Header.Add("X-Multi", "a")
	req.Header.Add("X-Multi", "b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || resp.Header.Get("X-Answer") != "yes" || resp.Header.Get("Set-Cookie") != "a=1" || string(body) != "\xff\x00" {
		t.Fatalf("answer %d %v %q", resp.StatusCode, resp.Header, body)
	}
	ev := got[0]
	host := strings.TrimPrefix(srv.URL, "http://")
	if ev.Version != "2.0" || ev.RouteKey != "POST /v1/runs/{runId}/ship" || ev.RequestContext.RouteKey != ev.RouteKey ||
		ev.RawPath != "/v1/runs/run-1/ship" || ev.RawQueryString != "src=0" || ev.RequestContext.Stage != DefaultRoute ||
		ev.RequestContext.HTTP.Method != "POST" || ev.RequestContext.HTTP.SourceIP != "127.0.0.1" ||
		ev.RequestContext.DomainName != host || ev.Headers["host"] != host || ev.Headers["x-multi"] != "a,b" ||
		ev.RequestContext.Authorizer != nil || ev.RequestContext.RequestID == "" || !ev.IsBase64Encoded || ev.Body != base64.StdEncoding.EncodeToString([]byte("line\n")) {
		t.Fatalf("event %+v", ev)
	}

	resp, err = http.Get(srv.URL + "/v1/ship")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "plain" || got[1].Body != "" || got[1].IsBase64Encoded || got[1].RequestContext.RequestID == got[0].RequestContext.RequestID {
		t.Fatalf("GET: %d %q, event %+v", resp.StatusCode, body, got[1])
	}

	for target, want := range map[string]int{"/v1/runs/run-1/events": 404, "/v1/runs/run-1/ship?fail=1": 502} {
		resp, err := http.Post(srv.URL+target, "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("POST %s: %d, want %d", target, resp.StatusCode, want)
		}
	}
	if len(got) != 3 {
		t.Fatalf("%d invokes, want 3 (none for the unmatched route)", len(got))
	}
}

// TestFunctionURLEvent: a Gateway without routes is a function URL: every path reaches
// the function, the route key and stage are $default, there is no authorizer.
func TestFunctionURLEvent(t *testing.T) {
	t.Parallel()
	var ev events.APIGatewayV2HTTPRequest
	srv := httptest.NewServer(&Gateway{Handler: func(_ context.Context, e events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		ev = e
		return events.APIGatewayV2HTTPResponse{StatusCode: 204}, nil
	}})
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/any/path", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || ev.RouteKey != DefaultRoute || ev.RequestContext.RouteKey != DefaultRoute ||
		ev.RequestContext.Stage != DefaultRoute || ev.RequestContext.Authorizer != nil || ev.RawPath != "/any/path" {
		t.Fatalf("%d, event %+v", resp.StatusCode, ev)
	}
	built := Request{Method: "GET", Path: "/v1/ship", RouteKey: "GET /v1/ship", Stage: "prod"}.FunctionURL()
	if built.RouteKey != DefaultRoute || built.RequestContext.Stage != DefaultRoute {
		t.Fatalf("FunctionURL kept the route or stage: %+v", built)
	}
}

// TestEventBuilders: the builders' events carry what the fronts send.
func TestEventBuilders(t *testing.T) {
	t.Parallel()
	ev := Request{Method: "POST", Path: "/v1/runs", RouteKey: "POST /v1/runs", Header: map[string]string{"X-Sandkeep-Tenant": "acme"},
		Authorizer: IAM("123456789012", "arn:aws:sts::123456789012:assumed-role/app/s")}.JSON(map[string]any{"runId": "r"}).Event()
	b, _ := base64.StdEncoding.DecodeString(ev.Body)
	if ev.Headers["x-sandkeep-tenant"] != "acme" || ev.Headers["content-type"] != "application/json" || string(b) != `{"runId":"r"}` ||
		ev.RequestContext.Authorizer.IAM.UserARN != "arn:aws:sts::123456789012:assumed-role/app/s" || ev.RequestContext.Stage != DefaultRoute {
		t.Fatalf("IAM event %+v", ev)
	}
	if ev := (Request{Method: "GET", Path: "/"}).JSON(nil).Event(); ev.Body != "" || ev.IsBase64Encoded || len(ev.Headers) != 0 {
		t.Fatalf("a nil JSON body is a body: %+v", ev)
	}
	if ev := (Request{Authorizer: JWT(map[string]string{"tenant": "acme"})}).Event(); ev.RequestContext.Authorizer.JWT.Claims["tenant"] != "acme" {
		t.Fatalf("JWT event %+v", ev)
	}
	for route, kind := range map[string]string{"$connect": "CONNECT", "$disconnect": "DISCONNECT", "subscribe": "MESSAGE"} {
		ws := WebSocket{Route: route, ConnID: "c1", Body: "{}", Header: map[string]string{"Host": "push.example", "X-Sandkeep-Tenant": "acme"},
			Query: map[string]string{"ticket": "t", "tenant": "acme"}, RequestID: "r1", Stage: "dev", DomainName: "push.example", UserARN: "arn:x"}.Event()
		rc := ws.RequestContext
		if rc.EventType != kind || rc.RouteKey != route || rc.ConnectionID != "c1" || rc.MessageDirection != "IN" ||
			rc.RequestID != "r1" || rc.Stage != "dev" || rc.DomainName != "push.example" || ws.Body != "{}" {
			t.Errorf("%s: %+v", route, ws)
		}
		// The upgrade's headers, query and identity are $connect's alone.
		upgrade := ws.Headers["X-Sandkeep-Tenant"] == "acme" && ws.Headers["Host"] == "push.example" &&
			ws.QueryStringParameters["ticket"] == "t" && rc.Identity.UserArn == "arn:x"
		bare := ws.Headers == nil && ws.QueryStringParameters == nil && rc.Identity == (events.APIGatewayRequestIdentity{})
		if (kind == "CONNECT" && !upgrade) || (kind != "CONNECT" && !bare) {
			t.Errorf("%s: headers %v, query %v, identity %+v", route, ws.Headers, ws.QueryStringParameters, rc.Identity)
		}
		if id, _ := rc.MessageID.(string); (kind == "MESSAGE") != (id != "") {
			t.Errorf("%s: message id %v", route, rc.MessageID)
		}
		if b, _ := json.Marshal(ws); kind == "MESSAGE" && (strings.Contains(string(b), `"headers"`) || strings.Contains(string(b), "acme")) {
			t.Errorf("a message event as sent: %s", b)
		}
	}
	if ws := (WebSocket{Route: "$connect"}).Event(); ws.QueryStringParameters != nil {
		t.Errorf("a $connect without a query has one: %+v", ws)
	}
}
