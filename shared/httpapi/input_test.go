package httpapi

import (
	"net/http"
	"strings"
	"testing"
)

// TestDotIDsAreRefused: "." and ".." are in the id charset but no path can address them
// (a client's URL library resolves /v1/runs/.. away), so a run, thread or sandbox id of
// either is 400 invalid, naming the field, and nothing is written.
func TestDotIDsAreRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		for _, id := range []string{".", ".."} {
			for _, field := range []string{"runId", "threadId", "sandbox.id"} {
				body := startBody("run-ok", "thread-ok")
				switch field {
				case "runId":
					body["runId"] = id
				case "threadId":
					body["threadId"] = id
				case "sandbox.id":
					body["sandbox"].(map[string]any)["id"] = id
				}
				p := e.do(req{method: post, path: "/v1/runs", body: body, specSays: "invalid"}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
				if !strings.Contains(p.Detail, field+": ") {
					t.Errorf("%s %q: detail %q does not name the field", field, id, p.Detail)
				}
			}
			if r, _ := e.backend.Runs().Get(tctx(t, DefaultDevTenant), id); r != nil {
				t.Fatalf("a run with id %q was stored", id)
			}
		}
		if r, _ := e.backend.Runs().Get(tctx(t, DefaultDevTenant), "run-ok"); r != nil {
			t.Fatal("a refused start stored its run")
		}
	})
}
