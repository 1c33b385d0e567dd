package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

const (
	get  = http.MethodGet
	post = http.MethodPost
)

func startBody(runID, thread string) map[string]any {
	return map[string]any{
		"runId":    runID,
		"threadId": thread,
		"sandbox":  map[string]any{"id": "default", "provider": "local-process"},
	}
}

func decode[T any](t *testing.T, r resp) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, r.Body)
	}
	return v
}

func (e *env) start(tenant, runID, thread string) startResponse {
	e.t.Helper()
	r := e.do(req{method: post, path: "/v1/runs", tenant: tenant, body: startBody(runID, thread)})
	r.wantStatus(e.t, http.StatusOK)
	return decode[startResponse](e.t, r)
}

func (e *env) appendEvents(tenant, runID, cursor string, data ...any) resp {
	e.t.Helper()
	evs := make([]map[string]any, len(data))
	for i, d := range data {
		evs[i] = map[string]any{"data": d}
	}
	return e.do(req{method: post, path: "/v1/runs/" + runID + "/events", tenant: tenant,
		body: map[string]any{"cursor": cursor, "events": evs}})
}

func (e *env) finish(tenant, runID, cursor, status string) resp {
	e.t.Helper()
	return e.do(req{method: post, path: "/v1/runs/" + runID + "/finish", tenant: tenant,
		body: map[string]any{"cursor": cursor, "status": status}})
}

// runRoutes is every route addressing one run, with cursor where the body needs one.
func runRoutes(runID, cursor string) []req {
	p := "/v1/runs/" + runID
	return []req{
		{method: post, path: p + "/attach", body: map[string]any{}},
		{method: get, path: p},
		{method: get, path: p + "/view"},
		{method: post, path: p + "/snapshot", body: map[string]any{"cursor": cursor}},
		{method: post, path: p + "/heartbeat", body: map[string]any{"cursor": cursor}},
		{method: post, path: p + "/detach", body: map[string]any{"cursor": cursor}},
		{method: post, path: p + "/cancel", body: map[string]any{}},
		{method: post, path: p + "/events", body: map[string]any{"cursor": cursor, "events": []any{map[string]any{"data": 1}}}},
		{method: get, path: p + "/events?after=0&limit=10"},
		{method: post, path: p + "/finish", body: map[string]any{"cursor": cursor, "status": "completed"}},
	}
}

// TestQuickstartFlow is the quickstart session of README.md's Quickstart, end to end.
func TestQuickstartFlow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		const tenant = "acme"

		// 1. Start a run: a fresh sandbox, epoch 1.
		s1 := e.start(tenant, "run-1", "thread-1")
		if s1.Outcome != "created" || s1.DriverEpoch != 1 || s1.Cursor == "" || s1.LeaseMs <= 0 || s1.LeaseUntil <= 0 {
			t.Fatalf("first start: %+v", s1)
		}
		if s1.Run.RunID != "run-1" || s1.Run.Status != contract.StatusRunning || s1.Sandbox.ProviderSandboxID == "" {
			t.Fatalf("first start run/sandbox: %+v", s1)
		}
		a := e.appendEvents(tenant, "run-1", s1.Cursor, map[string]any{"text": "hello"}).wantStatus(t, 200)
		c1 := a["cursor"].(string)
		e.finish(tenant, "run-1", c1, "completed").wantStatus(t, 200)

		// 2. A second run on the same thread resumes the same sandbox.
		s2 := e.start(tenant, "run-2", "thread-1")
		if s2.Outcome != "resumed" || s2.Sandbox.ProviderSandboxID != s1.Sandbox.ProviderSandboxID || s2.Sandbox.Key != s1.Sandbox.Key {
			t.Fatalf("second start on the thread: outcome %s sandbox %+v, want resumed %+v", s2.Outcome, s2.Sandbox, s1.Sandbox)
		}
		active := e.do(req{method: get, path: "/v1/threads/thread-1/active-run", tenant: tenant}).wantStatus(t, 200)
		if run, _ := active["run"].(map[string]any); run["runId"] != "run-2" {
			t.Fatalf("active run = %v, want run-2", active)
		}

		// 3. Append, then detach (the viewer leaves, the agent continues).
		ap := decode[appendResponse](t, e.appendEvents(tenant, "run-2", s2.Cursor, "a", "b"))
		if ap.LastOffset < 2 || ap.CancelRequested {
			t.Fatalf("append: %+v", ap)
		}
		old := ap.Cursor
		det := decode[runResponse](t, e.do(req{method: post, path: "/v1/runs/run-2/detach", tenant: tenant,
			body: map[string]any{"cursor": old}}))
		if det.Run.DetachedSince == nil {
			t.Fatalf("detach: run without detachedSince: %+v", det.Run)
		}

		// 4. Attach elsewhere: a new epoch; the old cursor is refused everywhere.
		at := e.do(req{method: post, path: "/v1/runs/run-2/attach", tenant: tenant})
		att := decode[attachResponse](t, at.wantStatusRaw(t, 200))
		// The fence may occupy an offset of its own (a control marker readers skip).
		if att.DriverEpoch != 2 || att.LastOffset < ap.LastOffset || att.Cursor == old || att.Run.DetachedSince != nil {
			t.Fatalf("attach: %+v (append was %+v)", att, ap)
		}
		for _, r := range []req{
			{method: post, path: "/v1/runs/run-2/events", body: map[string]any{"cursor": old, "events": []any{map[string]any{"data": "late"}}}},
			{method: post, path: "/v1/runs/run-2/detach", body: map[string]any{"cursor": old}},
			{method: post, path: "/v1/runs/run-2/heartbeat", body: map[string]any{"cursor": old}},
			{method: post, path: "/v1/runs/run-2/finish", body: map[string]any{"cursor": old, "status": "completed"}},
		} {
			r.tenant = tenant
			e.do(r).wantProblem(t, http.StatusConflict, CodeSuperseded)
		}

		// 5. Cancel from anywhere; the driver sees it in its next append and heartbeat.
		cr := decode[runResponse](t, e.do(req{method: post, path: "/v1/runs/run-2/cancel", tenant: tenant}).wantStatusRaw(t, 202))
		if !cr.Run.Cancelled() || cr.Run.Status != contract.StatusRunning {
			t.Fatalf("cancel: %+v", cr.Run)
		}
		ap2 := decode[appendResponse](t, e.appendEvents(tenant, "run-2", att.Cursor, "c").wantStatusRaw(t, 200))
		if !ap2.CancelRequested || ap2.LastOffset <= ap.LastOffset {
			t.Fatalf("append after cancel: %+v", ap2)
		}
		hb := decode[heartbeatResponse](t, e.do(req{method: post, path: "/v1/runs/run-2/heartbeat", tenant: tenant,
			body: map[string]any{"cursor": ap2.Cursor}}).wantStatusRaw(t, 200))
		if !hb.CancelRequested || hb.LeaseUntil <= 0 {
			t.Fatalf("heartbeat after cancel: %+v", hb)
		}

		// 6. Finish, then read every event: closed.
		fin := decode[runResponse](t, e.finish(tenant, "run-2", ap2.Cursor, "aborted").wantStatusRaw(t, 200))
		if fin.Run.Status != contract.StatusAborted || fin.Run.FinishedAt == nil {
			t.Fatalf("finish: %+v", fin.Run)
		}
		var got []string
		after, closed := int64(0), false
		for range 10 {
			rd := decode[readResponse](t, e.do(req{method: get, tenant: tenant,
				path: fmt.Sprintf("/v1/runs/run-2/events?after=%d&limit=1", after)}).wantStatusRaw(t, 200))
			for _, ev := range rd.Events {
				got = append(got, string(ev.Data))
			}
			after, closed = rd.Next, rd.Closed
			if closed {
				break
			}
		}
		if !closed || strings.Join(got, ",") != `"a","b","c"` {
			t.Fatalf("events = %v closed=%v, want \"a\",\"b\",\"c\" and closed", got, closed)
		}
		// A finished run refuses a takeover; its log stays readable.
		e.do(req{method: post, path: "/v1/runs/run-2/attach", tenant: tenant}).wantProblem(t, http.StatusGone, CodeTerminalRun)
		e.do(req{method: get, path: "/v1/runs/run-2/events", tenant: tenant}).wantStatus(t, 200)
		idle := e.do(req{method: get, path: "/v1/threads/thread-1/active-run", tenant: tenant}).wantStatus(t, 200)
		if idle["run"] != nil {
			t.Fatalf("active run after finish = %v, want null", idle["run"])
		}
		e.do(req{method: post, path: "/v1/threads/thread-1/cancel", tenant: tenant}).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
	})
}

// wantStatusRaw asserts the status and returns r for typed decoding.
func (r resp) wantStatusRaw(t *testing.T, status int) resp {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	return r
}

func TestRetriedStartTakesOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		s1 := e.start("", "run-r", "thread-r")
		ap := decode[appendResponse](t, e.appendEvents("", "run-r", s1.Cursor, 1, 2).wantStatusRaw(t, 200))
		s2 := e.start("", "run-r", "thread-r")
		if s2.Outcome != "taken-over" || s2.DriverEpoch != 2 || s2.LastOffset == nil || *s2.LastOffset < 2 ||
			s2.Src == nil || s2.CancelRequested == nil || *s2.CancelRequested {
			t.Fatalf("retried start: %+v", s2)
		}
		e.appendEvents("", "run-r", ap.Cursor, 3).wantProblem(t, http.StatusConflict, CodeSuperseded)
		// The same run id on another thread is a conflict, not a takeover.
		e.do(req{method: post, path: "/v1/runs", body: startBody("run-r", "thread-other")}).wantProblem(t, http.StatusConflict, CodeConflict)
		e.finish("", "run-r", s2.Cursor, "completed").wantStatus(t, 200)
		e.do(req{method: post, path: "/v1/runs", body: startBody("run-r", "thread-r")}).wantProblem(t, http.StatusGone, CodeTerminalRun)
	})
}

func TestCursorRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		a := e.start("", "run-a", "thread-a")
		b := e.start("", "run-b", "thread-b")
		payload, sig, _ := strings.Cut(a.Cursor, ".")
		cl, err := cursorCodec{key: []byte("test cursor key, 32 bytes long!!")}.open(a.Cursor)
		if err != nil {
			t.Fatal(err)
		}
		forged := cursorCodec{key: []byte("an attacker's guess at the key..")}.sign("local", "run-a", cl.cursor(), false)
		bumped := cursorCodec{key: []byte("an attacker's guess at the key..")}.sign("local", "run-a", contract.Cursor{Epoch: 99}, false)
		tampered := payload[:len(payload)-2] + "AA." + sig
		// A token this key cannot verify is stale-cursor; a verified one of another run conflict.
		for name, cur := range map[string]string{
			"forged": forged, "forged higher epoch": bumped, "tampered": tampered,
			"garbage": "not-a-cursor", "run B's cursor": b.Cursor,
		} {
			want := CodeStaleCursor
			if cur == b.Cursor {
				want = CodeConflict
			}
			t.Run(name, func(t *testing.T) {
				// b.Cursor is a valid cursor of run-b used on run-a: issued for another run.
				for _, r := range []req{
					{method: post, path: "/v1/runs/run-a/events", body: map[string]any{"cursor": cur, "events": []any{map[string]any{"data": 1}}}},
					{method: post, path: "/v1/runs/run-a/heartbeat", body: map[string]any{"cursor": cur}},
					{method: post, path: "/v1/runs/run-a/detach", body: map[string]any{"cursor": cur}},
					{method: post, path: "/v1/runs/run-a/snapshot", body: map[string]any{"cursor": cur}},
					{method: post, path: "/v1/runs/run-a/finish", body: map[string]any{"cursor": cur, "status": "completed"}},
				} {
					e.do(r).wantProblem(t, http.StatusConflict, want)
				}
			})
		}
		// Nothing of that reached run-a: still epoch 1, not detached, empty log, running.
		st, err := e.backend.Runs().State(tctx(t, "local"), "run-a")
		if err != nil || st == nil || st.Epoch() != 1 || st.DetachedSince != nil || st.Status != contract.StatusRunning {
			t.Fatalf("run-a after refused cursors: %+v, %v", st, err)
		}
		evs, _, _, err := e.backend.Log().Read(tctx(t, "local"), "run-a", 0, 100)
		if err != nil || len(evs) != 0 {
			t.Fatalf("run-a log after refused cursors: %v, %v", evs, err)
		}
		// A cursor issued for another tenant's run of the same id is refused too (and the
		// run being unknown in the caller's tenant comes first: 404).
		other := e.start("other", "run-a", "thread-a")
		e.appendEvents("", "run-a", other.Cursor, 1).wantProblem(t, http.StatusConflict, CodeConflict)
		e.appendEvents("", "run-a", a.Cursor, 1).wantStatus(t, 200)
	})
}

func TestTenantIsolation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		a := e.start("tenant-a", "run-x", "thread-x")
		for _, r := range runRoutes("run-x", a.Cursor) {
			r.tenant = "tenant-b"
			e.do(r).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
		}
		// Thread routes are scoped the same way: B sees an idle thread.
		idle := e.do(req{method: get, path: "/v1/threads/thread-x/active-run", tenant: "tenant-b"}).wantStatus(t, 200)
		if idle["run"] != nil {
			t.Fatalf("tenant B sees tenant A's active run: %v", idle)
		}
		e.do(req{method: post, path: "/v1/threads/thread-x/cancel", tenant: "tenant-b"}).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
		// Tenant A's run is untouched and its cursor still works.
		st, err := e.backend.Runs().State(tctx(t, "tenant-a"), "run-x")
		if err != nil || st == nil || st.Epoch() != 1 || st.Cancelled() || st.DetachedSince != nil || st.Status != contract.StatusRunning {
			t.Fatalf("tenant A's run after tenant B's attempts: %+v, %v", st, err)
		}
		e.appendEvents("tenant-a", "run-x", a.Cursor, "ok").wantStatus(t, 200)
		// The same in a tenant that has no such run at all.
		for _, r := range runRoutes("no-such-run", a.Cursor) {
			r.tenant = "tenant-a"
			e.do(r).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
		}
	})
}

func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	ctx := tctx(t, "local")
	live := e.start("", "live", "thread-live")
	cur := live.Cursor
	okStart := func(mut func(m map[string]any)) map[string]any {
		m := startBody("bad-1", "thread-bad")
		mut(m)
		return m
	}
	sb := func(m map[string]any) map[string]any { return m["sandbox"].(map[string]any) }
	big := strings.Repeat("x", MaxBodyBytes)
	cases := []struct {
		name     string
		r        req
		field    string
		specSays string
	}{
		{"malformed JSON", req{method: post, path: "/v1/runs", body: `{"runId":`}, "body", "invalid"},
		{"not JSON", req{method: post, path: "/v1/runs", body: `runId=x`}, "body", "invalid"},
		{"two JSON values", req{method: post, path: "/v1/runs", body: `{"runId":"bad-1"} {}`}, "body", "invalid"},
		{"empty body", req{method: post, path: "/v1/runs", body: ``}, "body", "invalid"},
		{"top-level array", req{method: post, path: "/v1/runs", body: `[]`}, "body", "invalid"},
		{"unknown field", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["extra"] = 1 })}, "extra", "invalid"},
		{"body names a tenant", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["tenant"] = "victim" })}, "tenant", "invalid"},
		{"sandbox names a tenant", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { sb(m)["tenant"] = "victim" })}, "sandbox.tenant", "invalid"},
		{"case-folded key", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["RunId"] = m["runId"] })}, "RunId", "invalid"},
		{"runId wrong type", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["runId"] = 5 })}, "runId", "invalid"},
		{"startedAt wrong type", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["startedAt"] = "now" })}, "startedAt", "invalid"},
		{"startedAt fraction", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["startedAt"] = 1.5 })}, "startedAt", "invalid"},
		{"startedAt negative", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["startedAt"] = -1 })}, "startedAt", "invalid"},
		{"runId with space", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["runId"] = "bad 1" })}, "runId", "invalid"},
		{"runId too long", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["runId"] = strings.Repeat("r", 257) })}, "runId", "invalid"},
		{"runId empty", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["runId"] = "" })}, "runId", "invalid"},
		{"threadId with slash", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { m["threadId"] = "a/b" })}, "threadId", "invalid"},
		{"sandbox missing", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { delete(m, "sandbox") })}, "sandbox", "invalid"},
		{"sandbox.id bad", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { sb(m)["id"] = "é" })}, "sandbox.id", "invalid"},
		{"sandbox.reuse bad", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { sb(m)["reuse"] = "sometimes" })}, "sandbox.reuse", "invalid"},
		{"workspace not an object", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { sb(m)["workspace"] = []int{1} })}, "sandbox.workspace", "invalid"},
		{"snapshotMaxAgeMs negative", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { sb(m)["snapshotMaxAgeMs"] = -5 })}, "sandbox.snapshotMaxAgeMs", "invalid"},
		{"provider not configured", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { sb(m)["provider"] = "nope" })}, "sandbox.provider", "silent"},
		{"secrets not strings", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) {
			sb(m)["workspace"] = map[string]any{"secrets": map[string]any{"TOKEN": 5}}
		})}, "sandbox.workspace.secrets", "invalid"},
		{"secret name not POSIX", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) {
			sb(m)["workspace"] = map[string]any{"secrets": map[string]any{"A.B": "v"}}
		})}, "sandbox.workspace.secrets", "silent"},
		{"oversize body", req{method: post, path: "/v1/runs", body: okStart(func(m map[string]any) { sb(m)["workspace"] = map[string]any{"blob": big} })}, "body", "silent"},

		{"events empty", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "events": []any{}}}, "events", "invalid"},
		{"events missing", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur}}, "events", "invalid"},
		{"event without data", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "events": []any{map[string]any{"src": 1}}}}, "events[0].data", "invalid"},
		{"event src negative", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "events": []any{map[string]any{"data": 1, "src": -1}}}}, "events[0].src", "invalid"},
		{"event offset given", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "events": []any{map[string]any{"data": 1, "offset": 7}}}}, "events[0].offset", "invalid"},
		{"events not an array", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "events": "x"}}, "events", "invalid"},
		{"cursor wrong type", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": 7, "events": []any{map[string]any{"data": 1}}}}, "cursor", "invalid"},
		{"events body tenant", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "tenant": "x", "events": []any{map[string]any{"data": 1}}}}, "tenant", "invalid"},
		{"event over 256 KiB", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "events": []any{map[string]any{"data": strings.Repeat("y", contract.MaxEventBytes)}}}}, "events", "silent"},
		{"events body over 1 MB", req{method: post, path: "/v1/runs/live/events", body: map[string]any{"cursor": cur, "events": []any{
			map[string]any{"data": strings.Repeat("y", 250<<10)}, map[string]any{"data": strings.Repeat("y", 250<<10)},
			map[string]any{"data": strings.Repeat("y", 250<<10)}, map[string]any{"data": strings.Repeat("y", 250<<10)},
			map[string]any{"data": strings.Repeat("y", 250<<10)}}}}, "body", "silent"},
		{"finish running", req{method: post, path: "/v1/runs/live/finish", body: map[string]any{"cursor": cur, "status": "running"}}, "status", "invalid"},
		{"finish unknown status", req{method: post, path: "/v1/runs/live/finish", body: map[string]any{"cursor": cur, "status": "Completed"}}, "status", "invalid"},
		{"finish error without message", req{method: post, path: "/v1/runs/live/finish", body: map[string]any{"cursor": cur, "status": "failed", "error": map[string]any{"code": "x"}}}, "error.message", "invalid"},
		{"finish error message wrong type", req{method: post, path: "/v1/runs/live/finish", body: map[string]any{"cursor": cur, "status": "failed", "error": map[string]any{"message": 3}}}, "error.message", "invalid"},
		{"heartbeat without cursor", req{method: post, path: "/v1/runs/live/heartbeat", body: map[string]any{}}, "cursor", "invalid"},
		{"detach empty cursor", req{method: post, path: "/v1/runs/live/detach", body: map[string]any{"cursor": ""}}, "cursor", "invalid"},
		{"snapshot label too long", req{method: post, path: "/v1/runs/live/snapshot", body: map[string]any{"cursor": cur, "label": strings.Repeat("l", 257)}}, "label", "invalid"},
		{"attach with a member", req{method: post, path: "/v1/runs/live/attach", body: map[string]any{"force": true}}, "force", "invalid"},
		{"cancel names a tenant", req{method: post, path: "/v1/runs/live/cancel", body: map[string]any{"tenant": "victim"}}, "tenant", "invalid"},
		{"thread cancel with a member", req{method: post, path: "/v1/threads/thread-live/cancel", body: map[string]any{"x": 1}}, "x", "invalid"},
		{"read after negative", req{method: get, path: "/v1/runs/live/events?after=-1"}, "after", "invalid"},
		{"read limit zero", req{method: get, path: "/v1/runs/live/events?limit=0"}, "limit", "invalid"},
		{"read limit too big", req{method: get, path: "/v1/runs/live/events?limit=1001"}, "limit", "invalid"},
		{"read waitMs too long", req{method: get, path: "/v1/runs/live/events?waitMs=20001"}, "waitMs", "invalid"},
		{"read waitMs not a number", req{method: get, path: "/v1/runs/live/events?waitMs=soon"}, "waitMs", "invalid"},
		{"read after twice", req{method: get, path: "/v1/runs/live/events?after=1&after=2"}, "after", "silent"},
		{"path runId with space", req{method: get, path: "/v1/runs/bad%20id"}, "runId", "invalid"},
		{"path runId too long", req{method: post, path: "/v1/runs/" + strings.Repeat("r", 257) + "/cancel"}, "runId", "invalid"},
		{"path threadId bad", req{method: get, path: "/v1/threads/th%2Fx/active-run"}, "threadId", "silent"},
	}
	before, err := e.backend.Runs().State(ctx, "live")
	if err != nil || before == nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.r.specSays = c.specSays
			p := e.do(c.r).wantProblem(t, http.StatusBadRequest, CodeInvalid)
			if !strings.Contains(p.Detail, c.field+":") {
				t.Errorf("detail %q does not name %q", p.Detail, c.field)
			}
		})
	}
	// Nothing was written: no run bad-1, and the live run, its log and its thread are as
	// they were.
	if r, err := refstore.Runs(e.backend.Runs()).Get(ctx, "bad-1"); err != nil || r != nil {
		t.Fatalf("a refused start wrote run bad-1: %+v, %v", r, err)
	}
	after, err := e.backend.Runs().State(ctx, "live")
	if err != nil || after == nil || after.Epoch() != before.Epoch() || after.Status != before.Status ||
		after.DetachedSince != nil || after.Cancelled() || after.LeaseUntil != before.LeaseUntil {
		t.Fatalf("live run changed by refused requests: before %+v after %+v (%v)", before, after, err)
	}
	if evs, _, closed, err := e.backend.Log().Read(ctx, "live", 0, 100); err != nil || len(evs) != 0 || closed {
		t.Fatalf("live log changed by refused requests: %v closed=%v %v", evs, closed, err)
	}
}

func TestIAMModeRequiresTenant(t *testing.T) {
	e := newEnv(t, IAMAuth{}, nil)
	routes := append(runRoutes("run-1", "c"),
		req{method: post, path: "/v1/runs", body: startBody("run-1", "thread-1")},
		req{method: get, path: "/v1/threads/thread-1/active-run"},
		req{method: post, path: "/v1/threads/thread-1/cancel", body: map[string]any{}},
	)
	for _, r := range routes {
		e.do(r).wantProblem(t, http.StatusUnauthorized, CodeUnauthenticated)
		r.headers = map[string]string{TenantHeader: ""}
		e.do(r).wantProblem(t, http.StatusUnauthorized, CodeUnauthenticated)
	}
	if r, err := refstore.Runs(e.backend.Runs()).Get(tctx(t, ""), "run-1"); err != nil || r != nil {
		t.Fatalf("an unauthenticated start wrote a run: %+v %v", r, err)
	}
	// With the trusted header the same start works, under that tenant.
	s := e.start("svc-tenant", "run-1", "thread-1")
	if got, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, "svc-tenant"), "run-1"); got == nil || s.Run.RunID != "run-1" {
		t.Fatalf("IAM start not stored under the header's tenant: %+v", got)
	}
}

func TestJWTModeMapsClaimsToTenant(t *testing.T) {
	e := newEnv(t, JWTAuth{}, nil)
	claims := map[string]string{"tenant": "user@example.com", "sub": "u-1"}
	// The tenant header is ignored in JWT mode: it can never choose the tenant.
	r := e.do(req{method: post, path: "/v1/runs", tenant: "victim", claims: claims, body: startBody("run-j", "thread-j")})
	r.wantStatus(t, 200)
	mapped := MapTenant("user@example.com")
	if !strings.HasPrefix(mapped, "t_") {
		t.Fatalf("mapped tenant %q", mapped)
	}
	if got, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, mapped), "run-j"); got == nil {
		t.Fatalf("run not stored under the mapped tenant %q", mapped)
	}
	if got, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, "victim"), "run-j"); got != nil {
		t.Fatal("run stored under the header's tenant in JWT mode")
	}
	e.do(req{method: get, path: "/v1/runs/run-j", claims: claims}).wantStatus(t, 200)
	e.do(req{method: get, path: "/v1/runs/run-j", claims: map[string]string{"tenant": "someone-else"}}).wantProblem(t, 404, CodeUnknownRun)
	e.do(req{method: get, path: "/v1/runs/run-j", claims: map[string]string{"sub": "u-1"}}).wantProblem(t, 401, CodeUnauthenticated)
	e.do(req{method: get, path: "/v1/runs/run-j", tenant: "user@example.com"}).wantProblem(t, 401, CodeUnauthenticated)
	// A custom claim.
	e2 := newEnv(t, JWTAuth{Claim: "org"}, nil)
	e2.do(req{method: post, path: "/v1/runs", claims: map[string]string{"org": "org-7"}, body: startBody("run-o", "thread-o")}).wantStatus(t, 200)
	if got, _ := refstore.Runs(e2.backend.Runs()).Get(tctx(t, "org-7"), "run-o"); got == nil {
		t.Fatal("run not stored under the custom claim's tenant")
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	e.do(req{method: get, path: "/v2/nothing", specSays: "silent"}).wantProblem(t, http.StatusNotFound, CodeInvalid)
	// Non-canonical paths get problem+json too, never ServeMux's bare redirect.
	for _, p := range []string{"/v1//runs", "/v1/runs/../runs", "/v1/runs/./run-1", "/v1/runs/run-1/"} {
		e.do(req{method: post, path: p, body: map[string]any{}, specSays: "silent"}).wantProblem(t, http.StatusNotFound, CodeInvalid)
	}
	r := e.do(req{method: http.MethodDelete, path: "/v1/runs/run-1", specSays: "silent"})
	r.wantProblem(t, http.StatusMethodNotAllowed, CodeInvalid)
	if r.Header.Get("Allow") != "GET" {
		t.Fatalf("Allow = %q, want GET", r.Header.Get("Allow"))
	}
	r = e.do(req{method: http.MethodPut, path: "/v1/runs/run-1/events", specSays: "silent"})
	r.wantProblem(t, http.StatusMethodNotAllowed, CodeInvalid)
	if r.Header.Get("Allow") != "GET, POST" {
		t.Fatalf("Allow = %q, want GET, POST", r.Header.Get("Allow"))
	}
}

func TestRequestIDAndLogLines(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	secret := "s3cr3t-token-value"
	body := startBody("run-log", "thread-log")
	body["sandbox"].(map[string]any)["workspace"] = map[string]any{"secrets": map[string]any{"TOKEN": secret}}
	r := e.do(req{method: post, path: "/v1/runs", tenant: "user@example.com", body: body,
		headers: map[string]string{RequestIDHeader: "client-req-1"}})
	s := decode[startResponse](t, r.wantStatusRaw(t, 200))
	if r.Header.Get(RequestIDHeader) != "client-req-1" {
		t.Fatalf("request id %q, want the sane incoming one", r.Header.Get(RequestIDHeader))
	}
	r = e.do(req{method: get, path: "/v1/runs/nope", headers: map[string]string{RequestIDHeader: "bad id\nwith newline"}})
	p := r.wantProblem(t, 404, CodeUnknownRun)
	if id := r.Header.Get(RequestIDHeader); id == "" || strings.ContainsAny(id, " \n") || p.RequestID != id {
		t.Fatalf("insane incoming request id kept: %q (problem %q)", id, p.RequestID)
	}
	lines := e.logs.lines(t)
	if len(lines) != 2 {
		t.Fatalf("%d log lines for 2 requests:\n%s", len(lines), e.logs.String())
	}
	first := lines[0]
	for k, want := range map[string]any{
		"requestId": "client-req-1", "route": "POST /v1/runs", "tenant": MapTenant("user@example.com"),
		"runId": "run-log", "threadId": "thread-log", "status": float64(200), "outcome": "created",
	} {
		if first[k] != want {
			t.Errorf("log %s = %v, want %v", k, first[k], want)
		}
	}
	if _, ok := first["latencyMs"].(float64); !ok {
		t.Errorf("log line without latencyMs: %v", first)
	}
	if lines[1]["code"] != CodeUnknownRun || lines[1]["route"] != "GET /v1/runs/{runId}" {
		t.Errorf("second log line: %v", lines[1])
	}
	all := e.logs.String()
	for _, leak := range []string{secret, s.Cursor, "user@example.com"} {
		if strings.Contains(all, leak) {
			t.Errorf("the log contains %q:\n%s", leak, all)
		}
	}
}

var errThrottled = errors.New("ProvisionedThroughputExceededException: rate exceeded (internal detail)")

type failingBackend struct{ contract.Backend }

func (b failingBackend) Runs() contract.FencedRuns { return failingRunsAdapter{b.Backend.Runs()} }

// failingRunsAdapter fails Get and State, the reads every run route starts with.
type failingRunsAdapter struct{ contract.FencedRuns }

func (failingRunsAdapter) Get(_ context.Context, _ string) (*contract.RunRecord, error) {
	return nil, errThrottled
}

func (failingRunsAdapter) State(_ context.Context, _ string) (*contract.RunState, error) {
	return nil, errThrottled
}

func TestInfrastructureErrorIs503(t *testing.T) {
	e := newEnv(t, DevAuth{}, failingBackend{Backend: memstore.New()})
	r := e.do(req{method: get, path: "/v1/runs/run-1"})
	p := r.wantProblem(t, http.StatusServiceUnavailable, CodeUnavailable)
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if strings.Contains(p.Detail, "internal detail") {
		t.Fatalf("problem leaks the infrastructure error: %q", p.Detail)
	}
	line := e.logs.lines(t)[0]
	if line["level"] != "ERROR" || !strings.Contains(fmt.Sprint(line["error"]), "rate exceeded") {
		t.Fatalf("infrastructure error not logged: %v", line)
	}
}

func TestPanicIs500(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	e.h.(*handler).mux.HandleFunc("GET /v1/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
	e.do(req{method: get, path: "/v1/panic", specSays: "silent"}).wantProblem(t, http.StatusInternalServerError, CodeInternal)
	line := e.logs.lines(t)[0]
	if line["level"] != "ERROR" || !strings.Contains(fmt.Sprint(line["error"]), "panic: boom") {
		t.Fatalf("panic not logged: %v", line)
	}
}

func TestLongPollSeesAppend(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	s := e.start("", "run-lp", "thread-lp")
	var wg sync.WaitGroup
	var rd readResponse
	wg.Add(1)
	go func() {
		defer wg.Done()
		rec := e.do(req{method: get, path: "/v1/runs/run-lp/events?waitMs=20000"})
		if rec.Status == 200 {
			_ = json.Unmarshal(rec.Body, &rd)
		}
	}()
	e.appendEvents("", "run-lp", s.Cursor, "wake").wantStatus(t, 200)
	wg.Wait()
	if len(rd.Events) != 1 || string(rd.Events[0].Data) != `"wake"` || rd.Closed {
		t.Fatalf("long poll returned %+v, want the appended event", rd)
	}
	// An empty open log with waitMs=0 answers at once with nothing.
	empty := decode[readResponse](t, e.do(req{method: get, path: fmt.Sprintf("/v1/runs/run-lp/events?after=%d", rd.Next)}).wantStatusRaw(t, 200))
	if len(empty.Events) != 0 || empty.Closed || empty.Next != rd.Next {
		t.Fatalf("read past the tail: %+v", empty)
	}
}

// TestClientGoneIsNotAnError: a long poll whose client disconnects is logged as 499 at
// INFO, not as an infrastructure failure.
func TestClientGoneIsNotAnError(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	e.start("", "run-gone", "thread-gone")
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest(http.MethodGet, "/v1/runs/run-gone/events?waitMs=20000", nil).WithContext(ctx)
	done := make(chan struct{})
	rec := httptest.NewRecorder()
	go func() {
		e.h.ServeHTTP(rec, r)
		close(done)
	}()
	cancel()
	<-done
	lines := e.logs.lines(t)
	last := lines[len(lines)-1]
	if last["status"] != float64(statusClientClosed) || last["level"] != "INFO" || last["code"] != "client-closed" {
		t.Fatalf("log line of an abandoned long poll: %v", last)
	}
}

// TestDevRefusesCrossOriginBrowsers: a browser request from an origin the dev server does
// not allow is 403 forbidden-origin, naming the origin and the flag that allows it, even
// with the tenant header (it was 401 "the request names no tenant"), on every route and a
// preflight alike; it never acts.
func TestDevRefusesCrossOriginBrowsers(t *testing.T) {
	e := newEnv(t, DevAuth{AllowOrigins: []string{"http://localhost:5173"}}, nil)
	for _, origin := range []string{"https://evil.example", "http://localhost:5174", "null"} {
		p := e.do(req{method: post, path: "/v1/runs", body: startBody("run-csrf", "thread-csrf"), tenant: "acme",
			headers: map[string]string{"Origin": origin}}).wantProblem(t, http.StatusForbidden, CodeForbiddenOrigin)
		if !strings.Contains(p.Detail, origin) || !strings.Contains(p.Detail, "--allow-origin") {
			t.Errorf("detail %q names neither the origin nor how to allow it", p.Detail)
		}
		for _, rt := range Routes() {
			e.do(req{method: rt.Method, path: routePath(rt, "r"), body: "{}", tenant: "acme", specSays: "silent",
				headers: map[string]string{"Origin": origin}}).wantProblem(t, http.StatusForbidden, CodeForbiddenOrigin)
		}
	}
	for _, tenant := range []string{"acme", "local"} {
		if r, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, tenant), "run-csrf"); r != nil {
			t.Fatal("a cross-origin browser request started a run on the dev server")
		}
	}
	rec := httptest.NewRecorder()
	pre := httptest.NewRequest(http.MethodOptions, "/v1/runs", nil)
	pre.Header.Set("Origin", "https://evil.example")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	e.h.ServeHTTP(rec, pre)
	if rec.Code != http.StatusForbidden || rec.Header().Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight of a refused origin: %d, allow-origin %q", rec.Code, rec.Header().Get("Access-Control-Allow-Origin"))
	}
}

// TestDevAllowedOrigin: an origin the dev server was started with (--allow-origin) gets
// its preflight answered and its requests served with CORS headers; the server's own
// origin needs none.
func TestDevAllowedOrigin(t *testing.T) {
	const origin = "http://localhost:5173"
	e := newEnv(t, DevAuth{AllowOrigins: []string{origin}}, nil)
	rec := httptest.NewRecorder()
	pre := httptest.NewRequest(http.MethodOptions, "/v1/runs", nil)
	pre.Header.Set("Origin", origin)
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Access-Control-Request-Headers", "content-type, x-sandkeep-tenant")
	e.h.ServeHTTP(rec, pre)
	h := rec.Header()
	if rec.Code != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != origin ||
		!strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") || !strings.Contains(h.Get("Access-Control-Allow-Headers"), TenantHeader) {
		t.Fatalf("preflight: %d %v", rec.Code, h)
	}
	out := e.do(req{method: post, path: "/v1/runs", body: startBody("run-o", "thread-o"), tenant: "acme",
		headers: map[string]string{"Origin": origin}})
	out.wantStatus(t, 200)
	if out.Header.Get("Access-Control-Allow-Origin") != origin || !strings.Contains(out.Header.Get("Access-Control-Expose-Headers"), RequestIDHeader) {
		t.Fatalf("allowed origin's answer without CORS headers: %v", out.Header)
	}
	if r, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, "acme"), "run-o"); r == nil {
		t.Fatal("the allowed origin's start did not start the run under its tenant")
	}
	own := e.do(req{method: get, path: "/v1/runs/run-o", tenant: "acme", headers: map[string]string{"Origin": "http://example.com"}})
	own.wantStatus(t, 200) // httptest's Host is example.com: the server's own origin
	if own.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("same-origin answer carries CORS headers: %v", own.Header)
	}
}

func TestParseOrigin(t *testing.T) {
	for in, want := range map[string]string{"http://localhost:5173": "http://localhost:5173", "HTTPS://App.Example/": "https://app.example"} {
		if got, err := ParseOrigin(in); err != nil || got != want {
			t.Errorf("ParseOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "localhost:5173", "ftp://x", "http://x/app", "http://u@x", "http://x?a", "http://x#f", "*"} {
		if got, err := ParseOrigin(bad); err == nil {
			t.Errorf("ParseOrigin(%q) = %q, want an error", bad, got)
		}
	}
}

// noSnapshots is a provider without the Snapshotter capability.
type noSnapshots struct{ contract.Provider }

// TestRefusalCodes drives every documented refusal that the flow tests do not: snapshot
// (200, superseded, 501), sandbox-gone on attach, log-closed and terminal-run after finish.
func TestRefusalCodes(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	s := e.start("", "run-s", "thread-s")
	snap := decode[sandboxResponse](t, e.do(req{method: post, path: "/v1/runs/run-s/snapshot",
		body: map[string]any{"cursor": s.Cursor, "label": "before-upgrade"}}).wantStatusRaw(t, 200))
	if snap.Sandbox.LatestSnapshotID == "" || snap.Sandbox.ProviderSandboxID != s.Sandbox.ProviderSandboxID {
		t.Fatalf("snapshot: %+v", snap.Sandbox)
	}
	at := decode[attachResponse](t, e.do(req{method: post, path: "/v1/runs/run-s/attach"}).wantStatusRaw(t, 200))
	if at.Sandbox.LatestSnapshotID != snap.Sandbox.LatestSnapshotID {
		t.Fatalf("attach sandbox %+v, want the snapshot recorded", at.Sandbox)
	}
	e.do(req{method: post, path: "/v1/runs/run-s/snapshot", body: map[string]any{"cursor": s.Cursor}}).
		wantProblem(t, http.StatusConflict, CodeSuperseded)

	// Finish; then the final cursor meets a closed log and a terminal run.
	fin := decode[runResponse](t, e.finish("", "run-s", at.Cursor, "completed").wantStatusRaw(t, 200))
	if fin.Run.Status != contract.StatusCompleted {
		t.Fatalf("finish: %+v", fin.Run)
	}
	e.finish("", "run-s", at.Cursor, "completed").wantStatus(t, 200) // a retried finish is idempotent
	e.appendEvents("", "run-s", at.Cursor, "late").wantProblem(t, http.StatusConflict, CodeLogClosed)
	e.do(req{method: post, path: "/v1/runs/run-s/heartbeat", body: map[string]any{"cursor": at.Cursor}}).
		wantProblem(t, http.StatusGone, CodeTerminalRun)
	e.do(req{method: post, path: "/v1/runs/run-s/detach", body: map[string]any{"cursor": at.Cursor}}).
		wantProblem(t, http.StatusGone, CodeTerminalRun)
	cr := decode[runResponse](t, e.do(req{method: post, path: "/v1/runs/run-s/cancel"}).wantStatusRaw(t, 202))
	if cr.Run.Cancelled() || cr.Run.Status != contract.StatusCompleted {
		t.Fatalf("cancel of a finished run changed it: %+v", cr.Run)
	}

	// The row no longer names the run's sandbox: attach is 409 sandbox-gone.
	g := e.start("", "run-g", "thread-g")
	ctx := tctx(t, "local")
	row, err := refstore.Instances(e.backend.Instances()).Get(ctx, g.Sandbox.Key)
	if err != nil || row == nil {
		t.Fatalf("instance row: %+v %v", row, err)
	}
	row.ProviderSandboxID = "replaced-by-someone-else"
	if err := refstore.Instances(e.backend.Instances()).Upsert(ctx, *row); err != nil {
		t.Fatal(err)
	}
	e.do(req{method: post, path: "/v1/runs/run-g/attach"}).wantProblem(t, http.StatusConflict, CodeSandboxGone)

	// A provider that cannot snapshot: 501 unsupported.
	k, err := keeper.New(keeper.Config{Backend: memstore.New(),
		Providers: []contract.Provider{noSnapshots{localprocess.New(t.TempDir())}}})
	if err != nil {
		t.Fatal(err)
	}
	e2 := &env{t: t, backend: nil, logs: &syncBuffer{}, auth: DevAuth{}}
	e2.h = New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: []byte("another test key, long enough.."),
		Logger: slog.New(slog.NewJSONHandler(e2.logs, nil))})
	s2 := e2.start("", "run-n", "thread-n")
	e2.do(req{method: post, path: "/v1/runs/run-n/snapshot", body: map[string]any{"cursor": s2.Cursor}}).
		wantProblem(t, http.StatusNotImplemented, CodeUnsupported)
}

// TestNullOptionalsReadAsAbsent: JSON null on an optional member means absent, in the
// handler and in the document alike.
func TestNullOptionalsReadAsAbsent(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	body := `{"runId":"run-n","threadId":"thread-n","startedAt":null,"sandbox":{"id":"default",` +
		`"provider":"local-process","workspace":null,"reuse":null,"snapshotMaxAgeMs":null}}`
	s := decode[startResponse](t, e.do(req{method: post, path: "/v1/runs", body: body}).wantStatusRaw(t, 200))
	ap := decode[appendResponse](t, e.do(req{method: post, path: "/v1/runs/run-n/events",
		body: `{"cursor":"` + s.Cursor + `","events":[{"data":null,"src":null},{"data":{"k":[1,2]},"src":7}]}`}).wantStatusRaw(t, 200))
	snap := decode[sandboxResponse](t, e.do(req{method: post, path: "/v1/runs/run-n/snapshot",
		body: `{"cursor":"` + ap.Cursor + `","label":null}`}).wantStatusRaw(t, 200))
	if snap.Sandbox.LatestSnapshotID == "" {
		t.Fatal("snapshot without id")
	}
	fin := decode[runResponse](t, e.do(req{method: post, path: "/v1/runs/run-n/finish",
		body: `{"cursor":"` + ap.Cursor + `","status":"completed","error":null,"usage":null}`}).wantStatusRaw(t, 200))
	if fin.Run.Error != nil || fin.Run.Usage != nil || fin.Run.Status != contract.StatusCompleted {
		t.Fatalf("finish with null error/usage: %+v", fin.Run)
	}
	rd := decode[readResponse](t, e.do(req{method: get, path: "/v1/runs/run-n/events"}).wantStatusRaw(t, 200))
	if len(rd.Events) != 2 || string(rd.Events[0].Data) != "null" || rd.Events[1].Src != 7 {
		t.Fatalf("events: %+v", rd.Events)
	}
}
