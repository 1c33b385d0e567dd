package httpapi

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// lookalikeTenants are byte strings that differ from "alice" only by Unicode whitespace,
// which strings.TrimSpace would remove; blankTenants are only such whitespace, which
// trimming would make the dev default "local" (or no tenant).
var (
	lookalikeTenants = []string{"alice\u00a0", "\u2003alice", "alice\u3000", "alice\u0085", "\u0085alice\u00a0"}
	blankTenants     = []string{"\u0085", "\u00a0", "\u3000 \u2003"}
)

// TestTenantIsNeverTrimmedIntoAnother sends, over HTTP to the real handler, tenant names
// that differ from "alice" only by Unicode whitespace, through the header (dev and IAM)
// and the JWT claim: none reaches alice's run, and each maps to its own tenant. Names made
// only of such whitespace are unauthenticated, never the dev default "local".
func TestTenantIsNeverTrimmedIntoAnother(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		b := nb(t)
		for _, mode := range []struct {
			name string
			auth Authenticator
		}{{"dev", DevAuth{}}, {"iam", IAMAuth{}}, {"jwt", JWTAuth{}}} {
			t.Run(mode.name, func(t *testing.T) {
				e := newEnv(t, mode.auth, b)
				// The JWT claim travels in the request context, which HTTP cannot carry:
				// the claim is injected at the server, the header travels on the wire.
				var claim string
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if mode.name == "jwt" {
						r = r.WithContext(WithJWTClaims(r.Context(), map[string]string{DefaultTenantClaim: claim}))
					}
					e.h.ServeHTTP(w, r)
				}))
				defer srv.Close()
				send := func(method, path, tenant, body string) *http.Response {
					t.Helper()
					hr, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					claim = tenant
					if mode.name != "jwt" {
						hr.Header.Set(TenantHeader, tenant)
					}
					res, err := http.DefaultClient.Do(hr)
					if err != nil {
						t.Fatal(err)
					}
					res.Body.Close()
					return res
				}
				runID := "run-" + mode.name
				for _, owner := range []string{"alice", "local"} {
					if res := send(post, "/v1/runs", owner, `{"runId":"`+runID+`","threadId":"t","sandbox":{"id":"default","provider":"local-process"}}`); res.StatusCode != http.StatusOK {
						t.Fatalf("start as %q: status %d", owner, res.StatusCode)
					}
				}
				for _, raw := range blankTenants {
					if res := send(get, "/v1/runs/"+runID, raw, ""); res.StatusCode != http.StatusUnauthorized {
						t.Errorf("blank tenant %q: status %d, want 401", raw, res.StatusCode)
					}
				}
				seen := map[string]string{}
				for _, raw := range lookalikeTenants {
					res := send(get, "/v1/runs/"+runID, raw, "")
					if res.StatusCode != http.StatusNotFound {
						t.Errorf("tenant %q read the run of alice or local: status %d", raw, res.StatusCode)
					}
					m := MapTenant(raw)
					if prev, dup := seen[m]; dup {
						t.Errorf("tenants %q and %q both map to %q", prev, raw, m)
					}
					seen[m] = raw
				}
			})
		}
	})
}

// TestAuthenticatorsKeepTheBytes: each authenticator hands MapTenant the bytes it was
// given (HTTP's optional whitespace around a header value aside), and a request naming
// two tenants names none.
func TestAuthenticatorsKeepTheBytes(t *testing.T) {
	for _, raw := range append(lookalikeTenants, blankTenants...) {
		want := raw
		if slices.Contains(blankTenants, raw) {
			want = ""
		}
		r := httptest.NewRequest(http.MethodGet, "/v1/runs/x", nil)
		r.Header.Set(TenantHeader, raw)
		for _, a := range []Authenticator{DevAuth{}, IAMAuth{}} {
			if got := a.Tenant(r); got != want {
				t.Errorf("%T: header %q read as %q, want %q", a, raw, got, want)
			}
		}
		jr := r.WithContext(WithJWTClaims(r.Context(), map[string]string{"tenant": raw}))
		if got := (JWTAuth{}).Tenant(jr); got != want {
			t.Errorf("JWTAuth: claim %q read as %q, want %q", raw, got, want)
		}
	}
	if got := (JWTAuth{}).Tenant(httptest.NewRequest(http.MethodGet, "/", nil).WithContext(
		WithJWTClaims(t.Context(), map[string]string{"tenant": " alice "}))); got != " alice " {
		t.Errorf("JWTAuth trimmed the claim %q to %q", " alice ", got)
	}
	two := httptest.NewRequest(http.MethodGet, "/v1/runs/x", nil)
	two.Header.Add(TenantHeader, "alice")
	two.Header.Add(TenantHeader, "bob")
	for _, a := range []Authenticator{DevAuth{}, IAMAuth{}} {
		if got := a.Tenant(two); got != "" {
			t.Errorf("%T: two tenant headers read as %q, want unauthenticated", a, got)
		}
	}
}
