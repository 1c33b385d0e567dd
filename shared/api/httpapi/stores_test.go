package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// The store routes (stores.go, docs/design.md §8): TanStack AI's instance map, run store
// and lock store over HTTP, on both backends, each contract check also shown to fail
// against a deliberately broken store built here at the contract's seam.

const (
	put   = http.MethodPut
	patch = http.MethodPatch
	del   = http.MethodDelete
)

// defectBackend is a backend with one view replaced by a broken one (nil: the backend's).
type defectBackend struct {
	contract.Backend
	rows contract.InstanceRows
	runs contract.FencedRuns
}

func (d defectBackend) Instances() contract.InstanceRows {
	if d.rows != nil {
		return d.rows
	}
	return d.Backend.Instances()
}

func (d defectBackend) Runs() contract.FencedRuns {
	if d.runs != nil {
		return d.runs
	}
	return d.Backend.Runs()
}

// failf is a contract check's verdict: the first rule the server broke.
func failf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// body decodes a JSON answer of status want, or reports the status and body.
func answer(r resp, want int, into any) error {
	if r.Status != want {
		return failf("status %d, want %d: %s", r.Status, want, r.Body)
	}
	if into == nil {
		if want == http.StatusNoContent && len(r.Body) != 0 {
			return failf("204 with a body: %s", r.Body)
		}
		return nil
	}
	return json.Unmarshal(r.Body, into)
}

// instanceContract is TanStack's SandboxInstanceStore conformance over HTTP: a missing key
// is null, a record round-trips exactly, absent optionals stay absent, a re-upsert fully
// replaces, keys and tenants are isolated, delete and a repeated delete succeed.
func instanceContract(e *env, tenant string) error {
	do := func(method, path string, body any) resp {
		return e.do(req{method: method, path: path, tenant: tenant, body: body})
	}
	var got wire.InstanceResponse
	if err := answer(do(get, "/v1/store/instances/absent", nil), 200, &got); err != nil || got.Instance != nil {
		return failf("missing key: %+v %v", got.Instance, err)
	}
	full := map[string]any{"key": "thread-1", "provider": "fake", "providerSandboxId": "sb-1", "threadId": "thread-1",
		"updatedAt": 1, "latestSnapshotId": "snap-1", "latestRunId": "run-1"}
	if err := answer(do(put, "/v1/store/instances/thread-1", full), 204, nil); err != nil {
		return failf("upsert: %v", err)
	}
	r := do(get, "/v1/store/instances/thread-1", nil)
	var raw map[string]map[string]any
	if err := answer(r, 200, &raw); err != nil {
		return err
	}
	if fmt.Sprint(raw["instance"]) != fmt.Sprint(full) {
		return failf("round trip: %v, want %v", raw["instance"], full)
	}
	// Re-upsert without the optionals (and without key): a full replace clears them.
	if err := answer(do(put, "/v1/store/instances/thread-1", map[string]any{"provider": "fake", "providerSandboxId": "sb-2",
		"threadId": "thread-1", "updatedAt": 2}), 204, nil); err != nil {
		return failf("re-upsert: %v", err)
	}
	if err := answer(do(get, "/v1/store/instances/thread-1", nil), 200, &raw); err != nil {
		return err
	}
	inst := raw["instance"]
	if _, kept := inst["latestSnapshotId"]; kept || inst["providerSandboxId"] != "sb-2" || inst["updatedAt"] != 2.0 {
		return failf("re-upsert merged instead of replacing: %v", inst)
	}
	if _, kept := inst["latestRunId"]; kept {
		return failf("re-upsert kept latestRunId: %v", inst)
	}
	// Another key and another tenant are untouched.
	if err := answer(do(put, "/v1/store/instances/b", map[string]any{"provider": "fake", "providerSandboxId": "sb-b", "threadId": "b", "updatedAt": 1}), 204, nil); err != nil {
		return err
	}
	if err := answer(e.do(req{method: get, path: "/v1/store/instances/thread-1", tenant: tenant + "-other"}), 200, &got); err != nil || got.Instance != nil {
		return failf("another tenant sees the record: %+v %v", got.Instance, err)
	}
	if err := answer(do(del, "/v1/store/instances/thread-1", nil), 204, nil); err != nil {
		return failf("delete: %v", err)
	}
	if err := answer(do(get, "/v1/store/instances/thread-1", nil), 200, &got); err != nil || got.Instance != nil {
		return failf("after delete: %+v %v", got.Instance, err)
	}
	if err := answer(do(del, "/v1/store/instances/thread-1", nil), 204, nil); err != nil {
		return failf("delete of a missing key: %v", err)
	}
	if err := answer(do(get, "/v1/store/instances/b", nil), 200, &got); err != nil || got.Instance == nil || got.Instance.ProviderSandboxID != "sb-b" {
		return failf("key b after deleting thread-1: %+v %v", got.Instance, err)
	}
	return nil
}

func TestStoreInstances(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		if err := instanceContract(e, "acme"); err != nil {
			t.Fatal(err)
		}
		// Negative control: a store whose upsert merges is caught.
		b := nb(t)
		bad := newEnv(t, DevAuth{}, defectBackend{Backend: b, rows: testkit.MergeUpsertRows(b.Instances())})
		if err := instanceContract(bad, "acme"); err == nil || !strings.Contains(err.Error(), "merged") {
			t.Fatalf("the contract check passes a merge-upsert store: %v", err)
		}
	})
}

// runContract is TanStack's durable-run-fields conformance (and createOrResume's
// idempotency) over HTTP: absent member = leave, null = clear, explicit false kept.
func runContract(e *env, tenant string) error {
	do := func(method, path string, body any) resp {
		return e.do(req{method: method, path: path, tenant: tenant, body: body})
	}
	runOf := func() (map[string]any, error) {
		var got map[string]map[string]any
		err := answer(do(get, "/v1/store/runs/fc-1", nil), 200, &got)
		return got["run"], err
	}
	var created map[string]map[string]any
	if err := answer(do(post, "/v1/store/runs", map[string]any{"runId": "fc-1", "threadId": "fc-t", "startedAt": 1}), 200, &created); err != nil {
		return failf("create: %v", err)
	}
	if fmt.Sprint(created["run"]) != "map[runId:fc-1 startedAt:1 status:running threadId:fc-t]" {
		return failf("created %v", created["run"])
	}
	// Resume: the existing record unchanged, the inputs ignored.
	if err := answer(do(post, "/v1/store/runs", map[string]any{"runId": "fc-1", "threadId": "other", "startedAt": 9, "status": "failed"}), 200, &created); err != nil ||
		fmt.Sprint(created["run"]) != "map[runId:fc-1 startedAt:1 status:running threadId:fc-t]" {
		return failf("resume changed the run: %v %v", created["run"], err)
	}
	step := func(name string, body any, want map[string]any) error {
		if err := answer(do(patch, "/v1/store/runs/fc-1", body), 204, nil); err != nil {
			return failf("%s: %v", name, err)
		}
		got, err := runOf()
		if err != nil {
			return err
		}
		for k, v := range want {
			g, present := got[k]
			if v == nil && present || v != nil && fmt.Sprint(g) != fmt.Sprint(v) {
				return failf("%s: %s = %v (present %v), want %v: %v", name, k, g, present, v, got)
			}
		}
		return nil
	}
	for _, s := range []struct {
		name       string
		body, want map[string]any
	}{
		{"set all four", map[string]any{"sandboxKey": "sandbox-abc", "detachedSince": 500, "cancelRequested": true, "driverEpoch": 1},
			map[string]any{"sandboxKey": "sandbox-abc", "detachedSince": 500, "cancelRequested": true, "driverEpoch": 1}},
		{"epoch bump", map[string]any{"driverEpoch": 2}, map[string]any{"driverEpoch": 2, "sandboxKey": "sandbox-abc", "cancelRequested": true}},
		{"clear detachedSince", map[string]any{"detachedSince": nil}, map[string]any{"detachedSince": nil, "sandboxKey": "sandbox-abc", "cancelRequested": true, "driverEpoch": 2}},
		{"explicit false", map[string]any{"cancelRequested": false}, map[string]any{"cancelRequested": false}},
		{"repopulate", map[string]any{"sandboxKey": "sandbox-xyz", "detachedSince": 900, "cancelRequested": true, "driverEpoch": 3},
			map[string]any{"sandboxKey": "sandbox-xyz", "detachedSince": 900, "cancelRequested": true, "driverEpoch": 3}},
		{"clear all four", map[string]any{"sandboxKey": nil, "detachedSince": nil, "cancelRequested": nil, "driverEpoch": nil},
			map[string]any{"sandboxKey": nil, "detachedSince": nil, "cancelRequested": nil, "driverEpoch": nil, "status": "running", "startedAt": 1}},
		{"finish", map[string]any{"status": "failed", "finishedAt": 7, "error": map[string]any{"message": "boom", "code": "E"}, "usage": map[string]any{"tokens": 3}},
			map[string]any{"status": "failed", "finishedAt": 7, "error": map[string]any{"code": "E", "message": "boom"}, "usage": map[string]any{"tokens": 3}}},
		{"clear error and usage", map[string]any{"error": nil, "usage": nil, "finishedAt": nil}, map[string]any{"error": nil, "usage": nil, "finishedAt": nil, "status": "failed"}},
		{"empty patch", map[string]any{}, map[string]any{"status": "failed", "startedAt": 1}},
	} {
		if err := step(s.name, s.body, s.want); err != nil {
			return err
		}
	}
	// An unknown run: a no-op, nothing created.
	if err := answer(do(patch, "/v1/store/runs/nope", map[string]any{"detachedSince": 5}), 204, nil); err != nil {
		return failf("update of an unknown run: %v", err)
	}
	var none wire.StoreRunResponse
	if err := answer(do(get, "/v1/store/runs/nope", nil), 200, &none); err != nil || none.Run != nil {
		return failf("update created a run: %+v %v", none.Run, err)
	}
	return nil
}

func TestStoreRuns(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		if err := runContract(e, "acme"); err != nil {
			t.Fatal(err)
		}
		// Negative control: a store whose update drops an explicit clear is caught.
		b := nb(t)
		bad := newEnv(t, DevAuth{}, defectBackend{Backend: b, runs: testkit.KeepDurableRuns(b.Runs())})
		if err := runContract(bad, "acme"); err == nil || !strings.Contains(err.Error(), "clear detachedSince") {
			t.Fatalf("the contract check passes a store that drops a clear: %v", err)
		}
	})
}

// TestStoreRunListings: findActiveRun, listByThread and listReclaimable answer the
// reference's order and bounds, per tenant.
func TestStoreRunListings(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		mk := func(id string, started int64, patchBody map[string]any) {
			t.Helper()
			e.do(req{method: post, path: "/v1/store/runs", tenant: "acme", body: map[string]any{"runId": id, "threadId": "lt", "startedAt": started}}).wantStatus(t, 200)
			if patchBody != nil {
				if r := e.do(req{method: patch, path: "/v1/store/runs/" + id, tenant: "acme", body: patchBody}); r.Status != 204 {
					t.Fatalf("patch %s: %d %s", id, r.Status, r.Body)
				}
			}
		}
		mk("lt-b", 20, map[string]any{"detachedSince": 100})
		mk("lt-a", 20, map[string]any{"detachedSince": 100})
		mk("lt-c", 30, map[string]any{"status": "completed", "finishedAt": 40, "detachedSince": 50})
		mk("lt-0", 10, map[string]any{"detachedSince": 101})
		mk("lt-d", 25, nil)
		ids := func(r resp) string {
			t.Helper()
			var out wire.RunsResponse
			if err := answer(r, 200, &out); err != nil {
				t.Fatal(err)
			}
			var s []string
			for _, run := range out.Runs {
				s = append(s, run.RunID)
			}
			return strings.Join(s, ",")
		}
		// Listings read an index that may lag a write: poll, bounded.
		eventually := func(path, want string) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for {
				got := ids(e.do(req{method: get, path: path, tenant: "acme"}))
				if got == want {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %s, want %s", path, got, want)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		eventually("/v1/store/threads/lt/runs", "lt-0,lt-a,lt-b,lt-d,lt-c")
		eventually("/v1/store/reclaimable?now=1000&ttlMs=900", "lt-a,lt-b") // cutoff 100, inclusive; lt-c is terminal
		eventually("/v1/store/reclaimable?now=1000&ttlMs=0", "lt-a,lt-b,lt-0")
		eventually("/v1/store/reclaimable?now=1000&ttlMs=901", "")
		var act wire.StoreRunResponse
		if err := answer(e.do(req{method: get, path: "/v1/store/threads/lt/active-run", tenant: "acme"}), 200, &act); err != nil || act.Run == nil || act.Run.RunID != "lt-d" {
			t.Fatalf("active run: %+v %v", act.Run, err)
		}
		// Another tenant sees none of it.
		if got := ids(e.do(req{method: get, path: "/v1/store/threads/lt/runs", tenant: "other"})); got != "" {
			t.Fatalf("another tenant lists %s", got)
		}
		if got := ids(e.do(req{method: get, path: "/v1/store/reclaimable?now=1000&ttlMs=0", tenant: "other"})); got != "" {
			t.Fatalf("another tenant's reclaimable: %s", got)
		}
		e.do(req{method: get, path: "/v1/store/reclaimable?now=1000", tenant: "acme", specSays: "invalid"}).wantProblem(t, 400, CodeInvalid)
		e.do(req{method: get, path: "/v1/store/reclaimable?now=-1&ttlMs=0", tenant: "acme", specSays: "invalid"}).wantProblem(t, 400, CodeInvalid)
	})
}

// TestStoreInputRefused: every client mistake is problem+json 400 invalid, nothing written.
func TestStoreInputRefused(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	e.do(req{method: post, path: "/v1/store/runs", body: map[string]any{"runId": "r", "threadId": "t", "startedAt": 1}}).wantStatus(t, 200)
	inst := func(m map[string]any) map[string]any {
		out := map[string]any{"provider": "p", "providerSandboxId": "s", "threadId": "t", "updatedAt": 1}
		for k, v := range m {
			if v == "<delete>" {
				delete(out, k)
				continue
			}
			out[k] = v
		}
		return out
	}
	for name, c := range map[string]req{
		"key mismatch":           {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"key": "other"}), specSays: "silent"},
		"no provider":            {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"provider": "<delete>"}), specSays: "invalid"},
		"empty sandbox id":       {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"providerSandboxId": ""}), specSays: "invalid"},
		"empty snapshot":         {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"latestSnapshotId": ""}), specSays: "invalid"},
		"no updatedAt":           {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"updatedAt": "<delete>"}), specSays: "invalid"},
		"negative updatedAt":     {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"updatedAt": -1}), specSays: "invalid"},
		"string updatedAt":       {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"updatedAt": "1"}), specSays: "invalid"},
		"unknown member":         {method: put, path: "/v1/store/instances/k", body: inst(map[string]any{"tenant": "x"}), specSays: "invalid"},
		"bad key":                {method: get, path: "/v1/store/instances/a%20b", specSays: "invalid"},
		"null body":              {method: put, path: "/v1/store/instances/k", body: "null", specSays: "invalid"},
		"create without start":   {method: post, path: "/v1/store/runs", body: map[string]any{"runId": "r2", "threadId": "t"}, specSays: "invalid"},
		"create bad status":      {method: post, path: "/v1/store/runs", body: map[string]any{"runId": "r2", "threadId": "t", "startedAt": 1, "status": "done"}, specSays: "invalid"},
		"create bad run id":      {method: post, path: "/v1/store/runs", body: map[string]any{"runId": "a b", "threadId": "t", "startedAt": 1}, specSays: "invalid"},
		"clear status":           {method: patch, path: "/v1/store/runs/r", body: map[string]any{"status": nil}, specSays: "invalid"},
		"unknown status":         {method: patch, path: "/v1/store/runs/r", body: map[string]any{"status": "done"}, specSays: "invalid"},
		"string epoch":           {method: patch, path: "/v1/store/runs/r", body: map[string]any{"driverEpoch": "2"}, specSays: "invalid"},
		"negative detached":      {method: patch, path: "/v1/store/runs/r", body: map[string]any{"detachedSince": -5}, specSays: "invalid"},
		"fractional detached":    {method: patch, path: "/v1/store/runs/r", body: map[string]any{"detachedSince": 1.5}, specSays: "invalid"},
		"number cancel":          {method: patch, path: "/v1/store/runs/r", body: map[string]any{"cancelRequested": 1}, specSays: "invalid"},
		"empty sandbox key":      {method: patch, path: "/v1/store/runs/r", body: map[string]any{"sandboxKey": ""}, specSays: "invalid"},
		"error without message":  {method: patch, path: "/v1/store/runs/r", body: map[string]any{"error": map[string]any{"code": "x"}}, specSays: "invalid"},
		"error unknown member":   {method: patch, path: "/v1/store/runs/r", body: map[string]any{"error": map[string]any{"message": "m", "stack": "x"}}, specSays: "invalid"},
		"unknown patch member":   {method: patch, path: "/v1/store/runs/r", body: map[string]any{"threadId": "t2"}, specSays: "invalid"},
		"repeated patch member":  {method: patch, path: "/v1/store/runs/r", body: `{"detachedSince":1,"detachedSince":null}`, specSays: "silent"},
		"acquire wait too long":  {method: post, path: "/v1/store/locks/k/acquire", body: map[string]any{"waitMs": 20001}, specSays: "invalid"},
		"acquire negative wait":  {method: post, path: "/v1/store/locks/k/acquire", body: map[string]any{"waitMs": -1}, specSays: "invalid"},
		"renew without token":    {method: post, path: "/v1/store/locks/k/renew", body: map[string]any{}, specSays: "invalid"},
		"renew bad token":        {method: post, path: "/v1/store/locks/k/renew", body: map[string]any{"token": "a/b"}, specSays: "invalid"},
		"release long token":     {method: post, path: "/v1/store/locks/k/release", body: map[string]any{"token": strings.Repeat("a", 65)}, specSays: "invalid"},
		"lock key with a space":  {method: post, path: "/v1/store/locks/a%20b/acquire", body: map[string]any{}, specSays: "invalid"},
		"delete with a body":     {method: del, path: "/v1/store/instances/k", body: map[string]any{"x": 1}, specSays: "silent"},
		"wrong method on a path": {method: post, path: "/v1/store/instances/k", body: map[string]any{}, specSays: "invalid"},
	} {
		t.Run(name, func(t *testing.T) {
			want := http.StatusBadRequest
			if c.method == post && c.path == "/v1/store/instances/k" {
				want = http.StatusMethodNotAllowed
			}
			c.tenant = "local"
			e.do(c).wantProblem(t, want, CodeInvalid)
		})
	}
	// Nothing was written by any of them.
	st, err := e.backend.Runs().State(tctx(t, "local"), "r")
	if err != nil || st == nil || st.Status != contract.StatusRunning || st.DetachedSince != nil || st.DriverEpoch != nil || st.Error != nil {
		t.Fatalf("run r after refused patches: %+v %v", st, err)
	}
	if row, err := e.backend.Instances().GetRow(tctx(t, "local"), "k"); err != nil || row != nil {
		t.Fatalf("row k after refused upserts: %+v %v", row, err)
	}
}

// TestStoreEndUserForbidden: a JWT caller gets 403 trusted-caller-required on every store
// route, before anything is read or written; the same calls by a trusted caller succeed.
func TestStoreEndUserForbidden(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		b := nb(t)
		jwt := newEnv(t, JWTAuth{}, b)
		claims := map[string]string{DefaultTenantClaim: "acme"}
		n := 0
		for _, r := range Routes() {
			if !strings.HasPrefix(r.Path, "/v1/store/") {
				continue
			}
			n++
			path := strings.NewReplacer("{key}", "k", "{runId}", "r", "{threadId}", "t").Replace(r.Path)
			if r.Path == "/v1/store/reclaimable" {
				path += "?now=1&ttlMs=0"
			}
			var body any
			switch r.Pattern() {
			case "PUT /v1/store/instances/{key}":
				body = map[string]any{"provider": "p", "providerSandboxId": "s", "threadId": "t", "updatedAt": 1}
			case "POST /v1/store/runs":
				body = map[string]any{"runId": "r", "threadId": "t", "startedAt": 1}
			case "PATCH /v1/store/runs/{runId}":
				body = map[string]any{"detachedSince": 1}
			case "POST /v1/store/locks/{key}/renew", "POST /v1/store/locks/{key}/release":
				body = map[string]any{"token": "tok"}
			case "POST /v1/store/locks/{key}/acquire":
				body = map[string]any{}
			}
			jwt.do(req{method: r.Method, path: path, claims: claims, body: body}).wantProblem(t, http.StatusForbidden, CodeTrustedCallerRequired)
		}
		if n != 12 {
			t.Fatalf("%d store routes, want 12", n)
		}
		ctx := tctx(t, "acme")
		if st, err := b.Runs().State(ctx, "r"); err != nil || st != nil {
			t.Fatalf("a refused end user created run r: %+v %v", st, err)
		}
		if row, err := b.Instances().GetRow(ctx, "k"); err != nil || row != nil {
			t.Fatalf("a refused end user wrote row k: %+v %v", row, err)
		}
		// The lock is free: the refused acquire took nothing.
		dev := newEnv(t, DevAuth{}, b)
		dev.do(req{method: post, path: "/v1/store/locks/k/acquire", tenant: "acme", body: map[string]any{}}).wantStatus(t, 200)
		// An unauthenticated end user is 401 first, as on every route.
		jwt.do(req{method: get, path: "/v1/store/runs/r"}).wantProblem(t, http.StatusUnauthorized, CodeUnauthenticated)
	})
}

// TestStoreDrivenByWhom: a run created through the store is its app's — sandkeep's start
// and attach refuse it (409 app-driven-run) and leave it as it was; a run sandkeep's start
// drives is refused to the store's writes (409 sandkeep-driven-run) and left as it was.
func TestStoreDrivenByWhom(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		ctx := tctx(t, "local")
		e.do(req{method: post, path: "/v1/store/runs", body: map[string]any{"runId": "app", "threadId": "t", "startedAt": 1}}).wantStatus(t, 200)
		if r := e.do(req{method: patch, path: "/v1/store/runs/app", body: map[string]any{"detachedSince": 5, "driverEpoch": 4}}); r.Status != 204 {
			t.Fatalf("patch: %d %s", r.Status, r.Body)
		}
		before, err := e.backend.Runs().State(ctx, "app")
		if err != nil || before == nil || !before.AppDriven {
			t.Fatalf("the store's run is not marked app-driven: %+v %v", before, err)
		}
		e.do(req{method: post, path: "/v1/runs/app/attach", body: map[string]any{}}).wantProblem(t, http.StatusConflict, CodeAppDriven)
		e.do(req{method: post, path: "/v1/runs", body: startBody("app", "t")}).wantProblem(t, http.StatusConflict, CodeAppDriven)
		after, err := e.backend.Runs().State(ctx, "app")
		if err != nil || !reflect.DeepEqual(before, after) {
			t.Fatalf("refused start/attach changed the run:\nbefore %+v\nafter  %+v (%v)", before, after, err)
		}
		// The same refusal at the contract: a claim, whatever its condition.
		for _, c := range []contract.Claim{{Token: "x", LeaseUntil: 9}, {Token: "y", ClearDetached: true}, {If: contract.ClaimCond{Cutoff: new(int64)}}} {
			if _, err := e.backend.Runs().Claim(ctx, "app", c); !errors.Is(err, contract.ErrAppDriven) {
				t.Fatalf("Claim(%+v) of an app-driven run: %v, want ErrAppDriven", c, err)
			}
		}

		// A sandkeep-driven run: the store's writes refuse it.
		s := decode[startResponse](t, e.do(req{method: post, path: "/v1/runs", body: startBody("sk", "t2")}).wantStatusRaw(t, 200))
		if s.DriverEpoch != 1 {
			t.Fatalf("start: %+v", s)
		}
		skBefore, _ := e.backend.Runs().State(ctx, "sk")
		e.do(req{method: patch, path: "/v1/store/runs/sk", body: map[string]any{"driverEpoch": 9}}).wantProblem(t, http.StatusConflict, CodeSandkeepDriven)
		e.do(req{method: post, path: "/v1/store/runs", body: map[string]any{"runId": "sk", "threadId": "t2", "startedAt": 1}}).wantProblem(t, http.StatusConflict, CodeSandkeepDriven)
		skAfter, _ := e.backend.Runs().State(ctx, "sk")
		if skBefore == nil || !reflect.DeepEqual(skBefore, skAfter) || skAfter.AppDriven {
			t.Fatalf("the store's refused writes changed sandkeep's run:\nbefore %+v\nafter  %+v", skBefore, skAfter)
		}
		// Reads serve either kind.
		var got wire.StoreRunResponse
		if err := answer(e.do(req{method: get, path: "/v1/store/runs/sk"}), 200, &got); err != nil || got.Run == nil || got.Run.Epoch() != 1 {
			t.Fatalf("store get of sandkeep's run: %+v %v", got.Run, err)
		}
	})
}

// leaseClock is the lock leases' clock in the lock tests: it stands still unless the test
// moves it, so a lease lapses when the test says so and never because a step ran slowly.
type leaseClock struct{ at atomic.Int64 } // unix nanoseconds

func newLeaseClock() *leaseClock {
	c := &leaseClock{}
	c.at.Store(time.Now().UnixNano())
	return c
}

func (c *leaseClock) now() time.Time { return time.Unix(0, c.at.Load()) }

// lapse moves the clock past every lease held (the longest lease and skew are seconds).
func (c *leaseClock) lapse() { c.at.Add(int64(time.Hour)) }

// clockedLeases stamps a memstore lease table's expiries on c instead of the monotonic
// clock memstore passes (the same lease and skew, read from tm).
type clockedLeases struct {
	memstore.Leases
	c  *leaseClock
	tm contract.LockTiming
}

func (l clockedLeases) Acquire(ctx context.Context, key memstore.LeaseKey, owner string, _, _ time.Time) (int64, bool, error) {
	now := l.c.now()
	return l.Leases.Acquire(ctx, key, owner, now.Add(l.tm.Lease), now.Add(-l.tm.Skew))
}

func (l clockedLeases) Renew(ctx context.Context, key memstore.LeaseKey, owner string, _ time.Time) (bool, error) {
	return l.Leases.Renew(ctx, key, owner, l.c.now().Add(l.tm.Lease))
}

// lockMemstore is a memstore whose lock leases, kept in table, run on c.
func lockMemstore(c *leaseClock, table memstore.Leases) contract.Backend {
	tm := contract.LockTiming{}.WithDefaults()
	return memstore.New(memstore.WithLockTiming(tm), memstore.WithLeases(clockedLeases{table, c, tm}))
}

// lockBackends are the backends with their lock leases on a clock the test moves (a dead
// holder's lease lapses at c.lapse()).
func lockBackends() map[string]func(t *testing.T, c *leaseClock) contract.Backend {
	return map[string]func(t *testing.T, c *leaseClock) contract.Backend{
		"memstore": func(t *testing.T, c *leaseClock) contract.Backend { return lockMemstore(c, memstore.NewLeases()) },
		"dynamostore": func(t *testing.T, c *leaseClock) contract.Backend {
			client := dynamotest.Client(t)
			return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client), Now: c.now})
		},
	}
}

// lockContract is the lock routes' contract: one holder at a time per key and tenant, a
// fence that grows, renew only by the holder, release idempotent and only by the holder, a
// waiter let in by a release, a dead holder's lease lapsing once c moves past it.
func lockContract(e *env, c *leaseClock) error {
	acquire := func(tenant, key string, wait int64) (wire.LockAcquireResponse, resp) {
		var out wire.LockAcquireResponse
		r := e.do(req{method: post, path: "/v1/store/locks/" + key + "/acquire", tenant: tenant, body: map[string]any{"waitMs": wait}})
		if r.Status == 200 {
			_ = json.Unmarshal(r.Body, &out)
		}
		return out, r
	}
	token := func(tenant, key, op, tok string) resp {
		return e.do(req{method: post, path: "/v1/store/locks/" + key + "/" + op, tenant: tenant, body: map[string]any{"token": tok}})
	}
	a, r := acquire("acme", "sandbox:k", 0)
	if r.Status != 200 || a.Token == "" || a.Fence < 1 || a.LeaseMs <= a.SkewMs || a.RenewMs <= 0 || a.RenewMs >= a.LeaseMs {
		return failf("first acquire: %d %s", r.Status, r.Body)
	}
	if _, r := acquire("acme", "sandbox:k", 0); r.Status != 409 {
		return failf("second acquire while held: %d %s, want 409 lock-held", r.Status, r.Body)
	}
	// Another key and another tenant's same key are independent.
	if _, r := acquire("acme", "sandbox:other", 0); r.Status != 200 {
		return failf("another key: %d %s", r.Status, r.Body)
	}
	b, r := acquire("globex", "sandbox:k", 0)
	if r.Status != 200 {
		return failf("another tenant's same key: %d %s", r.Status, r.Body)
	}
	if r := token("acme", "sandbox:k", "renew", a.Token); r.Status != 200 {
		return failf("holder's renew: %d %s", r.Status, r.Body)
	}
	for name, tok := range map[string]string{"a stranger's token": "not-the-token", "another tenant's holder": b.Token} {
		if r := token("acme", "sandbox:k", "renew", tok); r.Status != 409 || !bytes.Contains(r.Body, []byte(CodeLockLost)) {
			return failf("renew with %s: %d %s, want 409 lock-lost", name, r.Status, r.Body)
		}
		if r := token("acme", "sandbox:k", "release", tok); r.Status != 204 {
			return failf("release with %s: %d %s", name, r.Status, r.Body)
		}
	}
	if _, r := acquire("acme", "sandbox:k", 0); r.Status != 409 {
		return failf("a stranger's release freed the lock: acquire %d %s", r.Status, r.Body)
	}
	// A waiter is let in by the release, whenever its first attempt ran.
	type got struct {
		a wire.LockAcquireResponse
		r resp
	}
	waited := make(chan got, 1)
	go func() {
		w, r := acquire("acme", "sandbox:k", 15000)
		waited <- got{w, r}
	}()
	if r := token("acme", "sandbox:k", "release", a.Token); r.Status != 204 {
		return failf("holder's release: %d %s", r.Status, r.Body)
	}
	w := <-waited
	if w.r.Status != 200 || w.a.Fence <= a.Fence || w.a.Token == a.Token {
		return failf("waiter after the release: %d %s (first fence %d)", w.r.Status, w.r.Body, a.Fence)
	}
	if r := token("acme", "sandbox:k", "renew", a.Token); r.Status != 409 {
		return failf("renew after release: %d %s, want 409", r.Status, r.Body)
	}
	if r := token("acme", "sandbox:k", "release", a.Token); r.Status != 204 {
		return failf("repeated release: %d %s", r.Status, r.Body)
	}
	// The waiter dies without renewing or releasing: its lease lapses and the next waiter
	// gets in with a greater fence; the dead holder's renew is then refused.
	if _, r := acquire("acme", "sandbox:k", 0); r.Status != 409 {
		return failf("acquire before the holder's lease lapsed: %d %s, want 409 lock-held", r.Status, r.Body)
	}
	c.lapse()
	n, r := acquire("acme", "sandbox:k", 0)
	if r.Status != 200 || n.Fence <= w.a.Fence {
		return failf("acquire after the holder died: %d %s (dead fence %d)", r.Status, r.Body, w.a.Fence)
	}
	if r := token("acme", "sandbox:k", "renew", w.a.Token); r.Status != 409 {
		return failf("the dead holder's renew: %d %s, want 409 lock-lost", r.Status, r.Body)
	}
	return nil
}

// stuckLeases wraps a lease table whose Renew says yes to any owner: a lock that never
// tells a holder it lost the lease.
type stuckLeases struct{ memstore.Leases }

func (s stuckLeases) Renew(ctx context.Context, key memstore.LeaseKey, owner string, expires time.Time) (bool, error) {
	_, _ = s.Leases.Renew(ctx, key, owner, expires)
	return true, nil
}

func TestStoreLocks(t *testing.T) {
	for name, nb := range lockBackends() {
		t.Run(name, func(t *testing.T) {
			c := newLeaseClock()
			e := newEnv(t, DevAuth{}, nb(t, c))
			if err := lockContract(e, c); err != nil {
				t.Fatal(err)
			}
		})
	}
	// Negative control: a lease table whose renew never refuses is caught.
	c := newLeaseClock()
	bad := newEnv(t, DevAuth{}, lockMemstore(c, stuckLeases{memstore.NewLeases()}))
	if err := lockContract(bad, c); err == nil || !strings.Contains(err.Error(), "lock-lost") {
		t.Fatalf("the lock contract passes a lease that never refuses a renew: %v", err)
	}
	// Negative control: a lease table whose acquire grants a held lease is caught.
	c = newLeaseClock()
	shared := newEnv(t, DevAuth{}, lockMemstore(c, grantingLeases{memstore.NewLeases()}))
	if err := lockContract(shared, c); err == nil || !strings.Contains(err.Error(), "second acquire while held") {
		t.Fatalf("the lock contract passes a lease that grants a held lock: %v", err)
	}
}

// grantingLeases wraps a lease table whose Acquire takes the lease whoever holds it.
type grantingLeases struct{ memstore.Leases }

func (g grantingLeases) Acquire(ctx context.Context, key memstore.LeaseKey, owner string, expires, _ time.Time) (int64, bool, error) {
	return g.Leases.Acquire(ctx, key, owner, expires, expires.Add(time.Hour)) // "expired an hour past its expiry": always
}

// TestStoreLockMutualExclusion: many clients contend for one key through acquire (long
// wait), renew and release; at most one is ever inside, every one gets in, and fences
// grow in the order they got in.
func TestStoreLockMutualExclusion(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		const clients, rounds = 4, 3
		var (
			mu     sync.Mutex
			inside int
			fences []int64
			wg     sync.WaitGroup
			errs   = make(chan error, clients*rounds)
		)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					var a wire.LockAcquireResponse
					for {
						r := e.do(req{method: post, path: "/v1/store/locks/mx/acquire", body: map[string]any{"waitMs": 2000}})
						if r.Status == 409 {
							continue // lock-held: ask again, as the client does
						}
						if err := answer(r, 200, &a); err != nil {
							errs <- fmt.Errorf("client %d acquire: %w", c, err)
							return
						}
						break
					}
					mu.Lock()
					inside++
					if inside != 1 {
						errs <- fmt.Errorf("%d holders inside at once", inside)
					}
					fences = append(fences, a.Fence)
					mu.Unlock()
					if r := e.do(req{method: post, path: "/v1/store/locks/mx/renew", body: map[string]any{"token": a.Token}}); r.Status != 200 {
						errs <- fmt.Errorf("client %d renew while holding: %d %s", c, r.Status, r.Body)
					}
					mu.Lock()
					inside--
					mu.Unlock()
					if r := e.do(req{method: post, path: "/v1/store/locks/mx/release", body: map[string]any{"token": a.Token}}); r.Status != 204 {
						errs <- fmt.Errorf("client %d release: %d %s", c, r.Status, r.Body)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if len(fences) != clients*rounds {
			t.Fatalf("%d entries, want %d", len(fences), clients*rounds)
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fences not growing in entry order: %v", fences)
			}
		}
	})
}

// TestStoreReaperLeavesAppDriven: sandkeep's reaper, sweeping until it has expired a
// detached sandkeep-driven run (the positive control), leaves an app-driven run detached
// far longer untouched — still running, same epoch, same detachedSince — and the store's
// listReclaimable still offers it to the app's own reaper.
func TestStoreReaperLeavesAppDriven(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		ctx := tctx(t, DefaultDevTenant)
		e.do(req{method: post, path: "/v1/store/runs", body: map[string]any{"runId": "app", "threadId": "t", "startedAt": 1}}).wantStatus(t, 200)
		if r := e.do(req{method: patch, path: "/v1/store/runs/app", body: map[string]any{"detachedSince": 1, "sandboxKey": "k", "driverEpoch": 2}}); r.Status != 204 {
			t.Fatalf("patch: %d %s", r.Status, r.Body)
		}
		s := decode[startResponse](t, e.do(req{method: post, path: "/v1/runs", body: startBody("sk", "t2")}).wantStatusRaw(t, 200))
		e.do(req{method: post, path: "/v1/runs/sk/detach", body: map[string]any{"cursor": s.Cursor}}).wantStatus(t, 200)
		before, err := e.backend.Runs().State(ctx, "app")
		if err != nil || before == nil {
			t.Fatal(err)
		}
		k, err := keeper.New(keeper.Config{Backend: e.backend, Providers: []contract.Provider{localprocess.New(t.TempDir())}})
		if err != nil {
			t.Fatal(err)
		}
		rp, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		// The TTL is passed once the wall clock moves a millisecond past the detach: sweep
		// until the sandkeep-driven run is expired (bounded).
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := rp.Sweep(t.Context()); err != nil {
				t.Fatal(err)
			}
			st, err := e.backend.Runs().State(ctx, "sk")
			if err != nil {
				t.Fatal(err)
			}
			if st.Status.Terminal() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the reaper never expired the detached sandkeep run: %+v", st)
			}
		}
		after, err := e.backend.Runs().State(ctx, "app")
		if err != nil || !reflect.DeepEqual(before, after) {
			t.Fatalf("the reaper touched the app-driven run:\nbefore %+v\nafter  %+v (%v)", before, after, err)
		}
		var rec wire.RunsResponse
		if err := answer(e.do(req{method: get, path: "/v1/store/reclaimable?now=10&ttlMs=0"}), 200, &rec); err != nil ||
			len(rec.Runs) != 1 || rec.Runs[0].RunID != "app" {
			t.Fatalf("listReclaimable after the sweeps: %+v %v", rec.Runs, err)
		}
	})
}
