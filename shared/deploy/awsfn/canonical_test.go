package awsfn

import (
	"net/http"
	"testing"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
)

// TestAdapterNonCanonicalPathIsProblem: a non-canonical path (empty, . or .. segments)
// reaching any API function is a 404 problem+json with code invalid, never the route
// filter's bare 307 redirect.
func TestAdapterNonCanonicalPathIsProblem(t *testing.T) {
	s := newStack(t, AuthIAM)
	tenant := map[string]string{httpapi.TenantHeader: "acme"}
	for f, a := range s.fns {
		for _, p := range []struct{ method, path string }{
			{http.MethodGet, "/v1//runs/x"}, {http.MethodGet, "/x/../"}, {http.MethodGet, "/v1/runs/x/../y"},
			{http.MethodPost, "/v1/runs/./x/cancel"}, {http.MethodPost, "/v1/runs//cancel"}, {http.MethodGet, "/v1/runs/x/"},
		} {
			resp, m := call(t, a, event(p.method, "$default", p.path, "", nil, tenant, nil))
			if resp.StatusCode != http.StatusNotFound || resp.Headers["Content-Type"] != httpapi.ProblemContentType ||
				m["code"] != httpapi.CodeInvalid || m["requestId"] != "JKJaXmPLvHcESHA" {
				t.Errorf("%s %s %s: %d %v %v", f, p.method, p.path, resp.StatusCode, resp.Headers, m)
			}
		}
	}
}
