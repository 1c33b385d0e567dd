package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract/refstore"
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
			if r, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, DefaultDevTenant), id); r != nil {
				t.Fatalf("a run with id %q was stored", id)
			}
		}
		if r, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, DefaultDevTenant), "run-ok"); r != nil {
			t.Fatal("a refused start stored its run")
		}
	})
}

// TestNullBodyAndDuplicateKeysAreRefused: a JSON null body, and a body naming one member
// twice at any level the API defines (which encoding/json would read as the last), are
// 400 invalid naming the member, on every route that takes a body; nothing is written.
func TestNullBodyAndDuplicateKeysAreRefused(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		s := e.start("", "run-1", "thread-1")
		cases := []struct {
			path, body, field string
		}{
			{"/v1/runs", `null`, "body"},
			{"/v1/runs/run-1/attach", `null`, "body"},
			{"/v1/runs/run-1/cancel", ` null `, "body"},
			{"/v1/threads/thread-1/cancel", `null`, "body"},
			{"/v1/runs/run-1/heartbeat", `null`, "body"},
			{"/v1/runs/run-1/events", `null`, "body"},
			{"/v1/runs/run-1/finish", `null`, "body"},
			{"/v1/runs", `{"runId":"run-2","runId":"run-3","threadId":"thread-2","sandbox":{"id":"default","provider":"local-process"}}`, "runId"},
			{"/v1/runs", `{"runId":"run-2","threadId":"thread-2","sandbox":{"id":"default","provider":"local-process","provider":"other"}}`, "sandbox.provider"},
			{"/v1/runs/run-1/events", `{"cursor":"` + s.Cursor + `","events":[{"data":1,"data":2}]}`, "events[0].data"},
			{"/v1/runs/run-1/events", `{"cursor":"x","cursor":"` + s.Cursor + `","events":[{"data":1}]}`, "cursor"},
			{"/v1/runs/run-1/finish", `{"cursor":"` + s.Cursor + `","status":"completed","status":"failed"}`, "status"},
			{"/v1/runs/run-1/heartbeat", `{"cursor":"` + s.Cursor + `","cursor":"` + s.Cursor + `"}`, "cursor"},
		}
		for _, c := range cases {
			p := e.do(req{method: post, path: c.path, body: c.body, specSays: "silent"}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
			if !strings.Contains(p.Detail, c.field+": ") {
				t.Errorf("%s %s: detail %q does not name %s", c.path, c.body[:min(len(c.body), 40)], p.Detail, c.field)
			}
		}
		run, err := refstore.Runs(e.backend.Runs()).Get(tctx(t, DefaultDevTenant), "run-1")
		if err != nil || run == nil || run.Cancelled() || run.Status != "running" {
			t.Fatalf("a refused body changed run-1: %+v, %v", run, err)
		}
		for _, id := range []string{"run-2", "run-3"} {
			if r, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, DefaultDevTenant), id); r != nil {
				t.Fatalf("a refused start stored %s", id)
			}
		}
		rd := decode[readResponse](t, e.do(req{method: get, path: "/v1/runs/run-1/events"}).wantStatusRaw(t, http.StatusOK))
		if len(rd.Events) != 0 {
			t.Fatalf("a refused append stored events: %+v", rd.Events)
		}
	})
}

// TestRefusalDetailsNameNoInternals: the documented refusals of the driver routes
// (superseded, terminal, unknown run) answer details in the API's terms on every backend,
// never the packages and backends that produced them.
func TestRefusalDetailsNameNoInternals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		s := e.start("", "run-1", "thread-1")
		e.do(req{method: post, path: "/v1/runs/run-1/detach", body: map[string]any{"cursor": s.Cursor}}).wantStatus(t, http.StatusOK)
		at := decode[attachResponse](t, e.do(req{method: post, path: "/v1/runs/run-1/attach"}).wantStatusRaw(t, http.StatusOK))
		for _, r := range []req{
			{method: post, path: "/v1/runs/run-1/heartbeat", body: map[string]any{"cursor": s.Cursor}},
			{method: post, path: "/v1/runs/run-1/events", body: map[string]any{"cursor": s.Cursor, "events": []any{map[string]any{"data": 1}}}},
			{method: post, path: "/v1/runs/run-1/detach", body: map[string]any{"cursor": s.Cursor}},
			{method: post, path: "/v1/runs/run-1/finish", body: map[string]any{"cursor": s.Cursor, "status": "completed"}},
		} {
			p := e.do(r).wantProblem(t, http.StatusConflict, CodeSuperseded)
			if leak := internalIn(p.Detail); leak != "" || !strings.Contains(p.Detail, "superseded") {
				t.Errorf("%s: detail %q", r.path, p.Detail)
			}
		}
		e.finish("", "run-1", at.Cursor, "completed").wantStatus(t, http.StatusOK)
		p := e.do(req{method: post, path: "/v1/runs/run-1/heartbeat", body: map[string]any{"cursor": at.Cursor}}).wantProblem(t, http.StatusGone, CodeTerminalRun)
		if leak := internalIn(p.Detail); leak != "" {
			t.Errorf("terminal: detail %q", p.Detail)
		}
		for _, path := range []string{"/v1/runs/nope", "/v1/runs/nope/cancel", "/v1/threads/nope/active-run"} {
			method := get
			if strings.HasSuffix(path, "cancel") {
				method = post
			}
			r := e.do(req{method: method, path: path})
			if r.Status >= 400 {
				if leak := internalIn(r.problem(t).Detail); leak != "" {
					t.Errorf("%s: detail %q", path, r.problem(t).Detail)
				}
			}
		}
	})
}
