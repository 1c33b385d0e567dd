package httpapi

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// listAll walks GET /v1/runs with query q page by page and returns the run ids in order.
func (e *env) listAll(tenant string, q url.Values) []string {
	e.t.Helper()
	var ids []string
	for pages := 0; ; pages++ {
		if pages > 50 {
			e.t.Fatal("GET /v1/runs: more than 50 pages")
		}
		r := e.do(req{method: get, path: "/v1/runs?" + q.Encode(), tenant: tenant})
		r.wantStatus(e.t, http.StatusOK)
		page := decode[wire.RunListResponse](e.t, r)
		for _, v := range page.Runs {
			ids = append(ids, v.RunID)
		}
		if page.Next == nil {
			return ids
		}
		q.Set("cursor", *page.Next)
	}
}

func TestListRunsNewestFirstPagedAndFiltered(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		s1 := e.start("acme", "run-1", "thread-1")
		e.start("acme", "run-2", "thread-2")
		e.start("acme", "run-3", "thread-1")
		e.start("other", "run-x", "thread-1")

		want := []string{"run-3", "run-2", "run-1"}
		// startedAt is the server's clock: runs started within one millisecond tie and order
		// by runId, so newest-first is run-3, run-2, run-1 either way.
		for _, limit := range []string{"1", "2", "50"} {
			if got := e.listAll("acme", url.Values{"limit": {limit}}); !slices.Equal(got, want) {
				t.Fatalf("limit %s: %v, want %v", limit, got, want)
			}
		}
		if got := e.listAll("acme", url.Values{"threadId": {"thread-1"}, "limit": {"1"}}); !slices.Equal(got, []string{"run-3", "run-1"}) {
			t.Fatalf("thread-1: %v", got)
		}
		if got := e.listAll("other", url.Values{}); !slices.Equal(got, []string{"run-x"}) {
			t.Fatalf("tenant other sees %v", got)
		}
		if got := e.listAll("nobody", url.Values{}); len(got) != 0 {
			t.Fatalf("a tenant without runs sees %v", got)
		}

		e.finish("acme", "run-1", s1.Cursor, "completed").wantStatus(t, http.StatusOK)
		if got := e.listAll("acme", url.Values{"status": {"completed"}}); !slices.Equal(got, []string{"run-1"}) {
			t.Fatalf("completed: %v", got)
		}
		if got := e.listAll("acme", url.Values{"status": {"running"}, "threadId": {"thread-1"}}); !slices.Equal(got, []string{"run-3"}) {
			t.Fatalf("running on thread-1: %v", got)
		}

		// Every field the viewer shows: status, epoch, lease, sandbox (provider, id).
		r := e.do(req{method: get, path: "/v1/runs?threadId=thread-2", tenant: "acme"})
		page := decode[wire.RunListResponse](t, r.wantStatusRaw(t, http.StatusOK))
		if len(page.Runs) != 1 {
			t.Fatalf("thread-2: %s", r.Body)
		}
		v := page.Runs[0]
		if v.Status != "running" || v.Epoch() != 1 || v.LeaseUntil <= page.Now-1000 || page.Now <= 0 ||
			v.Sandbox == nil || v.Sandbox.Provider != "local-process" || v.Sandbox.ProviderSandboxID == "" ||
			v.Sandbox.State != keeper.SandboxLive || v.Sandbox.Key == "" {
			t.Fatalf("run-2 as listed: %s", r.Body)
		}
		view := decode[wire.RunViewResponse](t, e.do(req{method: get, path: "/v1/runs/run-2/view", tenant: "acme"}).wantStatusRaw(t, http.StatusOK))
		if view.Run.RunID != "run-2" || view.Run.Sandbox == nil || *view.Run.Sandbox != *v.Sandbox || view.Run.LeaseUntil != v.LeaseUntil {
			t.Fatalf("view %+v, listed %+v", view.Run, v)
		}
		e.do(req{method: get, path: "/v1/runs/run-2/view", tenant: "other"}).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
	})
}

func TestListRunsRefusesBadQueries(t *testing.T) {
	e := newEnv(t, DevAuth{}, memstore.New())
	for _, q := range []struct{ query, spec string }{
		{"status=Running", "invalid"},
		{"limit=0", "invalid"},
		{"limit=101", "invalid"},
		{"limit=x", "invalid"},
		{"threadId=a%20b", "invalid"},
		{"cursor=%21%21", "silent"},
		{"cursor=" + listCursor(sandboxPos(-1, "r")), "silent"},
		{"cursor=" + url.QueryEscape("bm90LWEtY3Vyc29y"), "silent"},
		{"limit=1&limit=2", "silent"},
		{"thread=t", "silent"},
	} {
		e.do(req{method: get, path: "/v1/runs?" + q.query, tenant: "acme", specSays: q.spec}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
	}
	e.do(req{method: get, path: "/v1/runs/run-1/view?x=1", tenant: "acme", specSays: "silent"}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
}

func TestReaperSweepsRoute(t *testing.T) {
	e := newEnv(t, DevAuth{}, memstore.New())
	e.do(req{method: get, path: "/v1/reaper/sweeps", tenant: "acme"}).wantProblem(t, http.StatusNotImplemented, CodeUnsupported)

	hist := reaper.NewHistory(3)
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []sandboxProvider{localprocess.New(t.TempDir())}})
	if err != nil {
		t.Fatal(err)
	}
	e.h = New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: []byte("test cursor key, 32 bytes long!!"),
		Logger: slog.New(slog.DiscardHandler), Sweeps: &Sweeps{Source: hist, Every: 30 * time.Second, DetachedTTL: time.Minute}})
	for i := range 4 {
		hist.Add(reaper.SweepRecord{StartedAt: int64(i), Report: reaper.Report{Runs: []reaper.RunEntry{
			{Tenant: "acme", RunID: fmt.Sprintf("mine-%d", i), Outcome: reaper.Expired},
			{Tenant: "other", RunID: "theirs", Outcome: reaper.Finalized},
		}}})
	}
	r := e.do(req{method: get, path: "/v1/reaper/sweeps?limit=2", tenant: "acme"})
	page := decode[wire.SweepsResponse](t, r.wantStatusRaw(t, http.StatusOK))
	if len(page.Sweeps) != 2 || page.Sweeps[0].Seq != 4 || page.Sweeps[1].Seq != 3 || page.Next == nil ||
		page.Kept != 3 || page.EveryMs != 30000 || page.DetachedTTLMs != 60000 {
		t.Fatalf("first page: %s", r.Body)
	}
	for _, s := range page.Sweeps {
		if len(s.Report.Runs) != 1 || s.Report.Runs[0].Tenant != "acme" || s.Report.Outcomes.Finalized != 0 || s.Report.Outcomes.Expired != 1 {
			t.Fatalf("tenant acme sees another tenant's run: %s", r.Body)
		}
	}
	r = e.do(req{method: get, path: "/v1/reaper/sweeps?limit=2&cursor=" + *page.Next, tenant: "acme"})
	page = decode[wire.SweepsResponse](t, r.wantStatusRaw(t, http.StatusOK))
	if len(page.Sweeps) != 1 || page.Sweeps[0].Seq != 2 || page.Next != nil {
		t.Fatalf("second page (capacity 3 dropped sweep 1): %s", r.Body)
	}
	e.do(req{method: get, path: "/v1/reaper/sweeps?limit=4", tenant: "acme", specSays: "silent"}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
	e.do(req{method: get, path: "/v1/reaper/sweeps?cursor=0", tenant: "acme", specSays: "invalid"}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
}

type sandboxProvider = contract.Provider

func sandboxPos(at int64, id string) contract.RunPos {
	return contract.RunPos{StartedAt: at, RunID: id}
}

// TestRunViewShowsArchived: a row the idle stop settled archived (the provider had archived
// its sandbox, docs/design.md §5) is served by the run view, and so printed by `sandkeep
// runs get`, as lifecycle archived with its since-time; the answer is checked against
// api/openapi.yaml like every other — on both backends.
func TestRunViewShowsArchived(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		b := nb(t)
		e := newEnv(t, DevAuth{}, b)
		s := e.start("acme", "run-1", "thread-1")
		e.finish("acme", "run-1", s.Cursor, "completed").wantStatus(t, http.StatusOK)
		ctx := contract.WithTenant(t.Context(), "acme")
		rows := b.Instances()
		row, err := rows.GetRow(ctx, s.Sandbox.Key)
		if err != nil || row == nil {
			t.Fatalf("row: %+v %v", row, err)
		}
		const since = 1_700_000_000_000
		if err := rows.MarkStopping(ctx, row.Key, row.ProviderSandboxID, row.UpdatedAt, "stop-1", since-1); err != nil {
			t.Fatal(err)
		}
		if err := rows.SettleStop(ctx, row.Key, "stop-1", contract.LifecycleArchived, since); err != nil {
			t.Fatal(err)
		}
		view := decode[wire.RunViewResponse](t, e.do(req{method: get, path: "/v1/runs/run-1/view", tenant: "acme"}).wantStatusRaw(t, http.StatusOK))
		if sb := view.Run.Sandbox; sb == nil || sb.Lifecycle != keeper.LifecycleArchived || sb.LifecycleSince != since || sb.State != keeper.SandboxLive {
			t.Fatalf("view of an archived sandbox: %+v", view.Run.Sandbox)
		}
	})
}
