package awsfn

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// routeBody is a well-formed body for each route of docs/design.md §8 (cursor where one is needed).
func routeBody(rt Route, cursor string) any {
	switch {
	case rt.Method == http.MethodGet:
		return nil
	case rt.Path == "/v1/runs":
		return map[string]any{"runId": "run-j", "threadId": "thread-j", "sandbox": map[string]any{"id": "default", "provider": "local-process"}}
	case strings.HasSuffix(rt.Path, "/events"):
		return map[string]any{"cursor": cursor, "events": []any{map[string]any{"data": "x"}}}
	case strings.HasSuffix(rt.Path, "/finish"):
		return map[string]any{"cursor": cursor, "status": "completed"}
	case strings.HasSuffix(rt.Path, "/agent"):
		return map[string]any{"cursor": cursor, "command": "true"}
	case strings.HasSuffix(rt.Path, "/heartbeat"), strings.HasSuffix(rt.Path, "/detach"), strings.HasSuffix(rt.Path, "/snapshot"),
		strings.HasSuffix(rt.Path, "/pump"):
		return map[string]any{"cursor": cursor}
	}
	return map[string]any{}
}

// TestSecurityJWTEndToEnd drives API Gateway payload-2.0 events carrying JWT authorizer
// claims through every API function's adapter: the configured claim names the tenant
// (`auth0|x` becomes t_ + the first 32 hex of its SHA-256, computed here independently);
// another caller's claim is a plain 404 on every route of every function (an idle thread
// on active-run; a push ticket of its own tenant, never the owner's); a missing, empty or blank claim is 401 on every route; a caller whose
// raw claim spells the mapped tenant does not become it; the tenant header never counts.
func TestSecurityJWTEndToEnd(t *testing.T) {
	s := newStack(t, AuthJWT)
	sum := sha256.Sum256([]byte("auth0|x"))
	mapped := "t_" + hex.EncodeToString(sum[:])[:32]
	owner := map[string]string{"tenant": "auth0|x", "sub": "auth0|x", "scope": "runs"}
	resp, m := call(t, s.fns[Resolve], event("POST", "POST /v1/runs", "/v1/runs", "",
		routeBody(Route{Method: "POST", Path: "/v1/runs"}, ""), map[string]string{httpapi.TenantHeader: "victim"}, owner))
	if resp.StatusCode != 200 {
		t.Fatalf("owner's start: %d %v", resp.StatusCode, m)
	}
	cursor, _ := m["cursor"].(string)
	if st, err := refstore.Runs(s.backend.Runs()).Get(contract.WithTenant(t.Context(), mapped), "run-j"); err != nil || st == nil {
		t.Fatalf("the run is not stored under %s: %v", mapped, err)
	}
	for _, other := range []string{"victim", "auth0|x", "auth0_x", ""} {
		if st, _ := refstore.Runs(s.backend.Runs()).Get(contract.WithTenant(t.Context(), other), "run-j"); st != nil {
			t.Fatalf("the run is also visible under tenant %q", other)
		}
	}

	probe := func(claims map[string]string, check func(rt Route, status int, body map[string]any)) int {
		n := 0
		for _, f := range Functions() {
			for _, rt := range Routes(f) {
				path := strings.NewReplacer("{runId}", "run-j", "{threadId}", "thread-j", "{key}", "key-j").Replace(rt.Path)
				reqBody := routeBody(rt, cursor)
				if rt.Pattern() == "POST /v1/runs" {
					// The caller's own start, of other ids: the probes after it must still
					// address the owner's run-j, not one of the caller's own.
					reqBody = map[string]any{"runId": "own-run", "threadId": "own-thread",
						"sandbox": map[string]any{"id": "default", "provider": "local-process"}}
				}
				ev := event(rt.Method, rt.Pattern(), path, "", reqBody,
					map[string]string{httpapi.TenantHeader: mapped}, claims)
				if claims == nil { // a JWT deployment reached without any authorizer context
					ev.RequestContext.Authorizer = nil
				}
				resp, body := call(t, s.fns[f], ev)
				check(rt, resp.StatusCode, body)
				n++
			}
		}
		return n
	}
	// Another caller (and a caller naming the owner's mapped tenant as its raw claim).
	for _, claims := range []map[string]string{{"tenant": "auth0|y"}, {"tenant": mapped}, {"tenant": "AUTH0|X"}} {
		n := probe(claims, func(rt Route, status int, body map[string]any) {
			switch {
			case rt.Ship():
				// A ship route takes only a ship token; a JWT caller's claims name nothing.
				if rt.Path == wire.ShipProbePath && status != 204 || rt.Path != wire.ShipProbePath && (status != 401 || body["code"] != "invalid-token") {
					t.Fatalf("claims %v: %s answered %d %v, want 204 (probe) or 401 invalid-token", claims, rt.Pattern(), status, body)
				}
			case rt.Pattern() == "GET /v1/runs":
				// The listing: its own runs only, never the owner's.
				runs, _ := body["runs"].([]any)
				for _, r := range runs {
					if r.(map[string]any)["runId"] == "run-j" {
						t.Fatalf("claims %v: the listing shows the owner's run: %v", claims, body)
					}
				}
				if status != 200 {
					t.Fatalf("claims %v: listing %d %v", claims, status, body)
				}
			case strings.HasPrefix(rt.Path, "/v1/store/"):
				// The store routes serve trusted callers only: an end user is refused
				// before anything is read or written (docs/design.md §8).
				if status != 403 || body["code"] != "trusted-caller-required" {
					t.Fatalf("claims %v: %s answered %d %v, want 403 trusted-caller-required", claims, rt.Pattern(), status, body)
				}
			case rt.Path == "/v1/runs":
				// Its own start: a run of its own (401 would mean the claim was not read).
				if status != 200 {
					t.Fatalf("claims %v: own start: %d %v", claims, status, body)
				}
			case rt.Path == wire.PushTicketPath:
				// A push ticket for the caller's own tenant (a JWT deployment issues them
				// to any authenticated caller), never the owner's.
				tk, _ := body["ticket"].(string)
				tenant, err := shiptoken.VerifyPushTicket([]byte(stackKey), tk, time.Now())
				if status != 200 || body["pushUrl"] != stackPushURL || err != nil || tenant != httpapi.MapTenant(claims["tenant"]) || tenant == mapped {
					t.Fatalf("claims %v: push ticket %d %v: tenant %q, %v", claims, status, body, tenant, err)
				}
			case strings.HasSuffix(rt.Path, "/active-run"):
				if status != 200 || body["run"] != nil {
					t.Fatalf("claims %v: active-run %d %v", claims, status, body)
				}
			case status != 404 || body["code"] != "unknown-run":
				t.Fatalf("claims %v: %s answered %d %v, want 404 unknown-run", claims, rt.Pattern(), status, body)
			}
		})
		if n != 32 {
			t.Fatalf("%d routes probed, want the 32 of the API", n)
		}
	}
	// No usable claim: 401 everywhere.
	for _, claims := range []map[string]string{nil, {}, {"sub": "auth0|x"}, {"tenant": ""}, {"tenant": " \t"}, {"Tenant": "auth0|x"}} {
		probe(claims, func(rt Route, status int, body map[string]any) {
			if rt.Ship() {
				if want := map[bool]int{true: 204, false: 401}[rt.Path == wire.ShipProbePath]; status != want {
					t.Fatalf("claims %v: %s answered %d %v, want %d", claims, rt.Pattern(), status, body, want)
				}
				return
			}
			if status != 401 || body["code"] != "unauthenticated" {
				t.Fatalf("claims %v: %s answered %d %v, want 401", claims, rt.Pattern(), status, body)
			}
		})
	}
	// The owner's run is untouched by all of it, and the owner still drives it.
	st, err := s.backend.Runs().State(contract.WithTenant(t.Context(), mapped), "run-j")
	if err != nil || st == nil || st.Epoch() != 1 || st.Cancelled() || st.DetachedSince != nil || st.Status != contract.StatusRunning {
		t.Fatalf("the owner's run after the probes: %+v %v", st, err)
	}
	resp, m = call(t, s.fns[Detach], event("POST", "POST /v1/runs/{runId}/heartbeat", "/v1/runs/run-j/heartbeat", "",
		map[string]any{"cursor": cursor}, nil, owner))
	if resp.StatusCode != 200 {
		t.Fatalf("the owner's heartbeat: %d %v", resp.StatusCode, m)
	}
	if strings.Contains(s.logs.String(), "auth0|x") {
		t.Fatalf("the raw claim reached the logs:\n%s", s.logs.String())
	}
}
