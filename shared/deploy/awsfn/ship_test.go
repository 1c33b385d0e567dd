package awsfn

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
)

// TestShipThroughTheAdapter: the Log function serves the ship routes to an event with no
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
				resp, m := call(t, s.fns[Log], ev)
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
			if n != len(Routes(Resolve))+len(Routes(Detach))+len(Routes(Cancel))+len(Routes(Log))+len(Routes(Wait))-3 {
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
