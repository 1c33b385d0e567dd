package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// TestStartSetupIdleGrace: a setup's own idle grace, sandbox.idleStopMs, over HTTP on both
// backends (docs/design.md §5). A value outside a minute to a week (0 = the deployment's)
// is a 400 problem with code invalid naming the field, and writes neither the run nor the
// sandbox's row; the document's own bounds reject the negative and the over-a-week values,
// the server also the ones under a minute. An in-range value is kept on the row of the
// sandbox the start creates.
func TestStartSetupIdleGrace(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		t.Parallel()
		e := newEnv(t, DevAuth{}, nb(t))
		ctx := tctx(t, "local")
		withGrace := func(runID string, g any) map[string]any {
			m := startBody(runID, "thread-grace")
			m["sandbox"].(map[string]any)["idleStopMs"] = g
			return m
		}
		bad := []struct {
			ms       any
			specSays string
		}{
			{-1, "invalid"},
			{1, "silent"},
			{keeper.MinIdleStop.Milliseconds() - 1, "silent"},
			{keeper.MaxIdleStop.Milliseconds() + 1, "invalid"},
			{1.5, "invalid"},
			{"600000", "invalid"},
		}
		for _, b := range bad {
			p := e.do(req{method: post, path: "/v1/runs", body: withGrace("grace-bad", b.ms), specSays: b.specSays}).
				wantProblem(t, http.StatusBadRequest, CodeInvalid)
			if !strings.Contains(p.Detail, "sandbox.idleStopMs:") {
				t.Errorf("idleStopMs %v: detail %q does not name the field", b.ms, p.Detail)
			}
		}
		if r, err := refstore.Runs(e.backend.Runs()).Get(ctx, "grace-bad"); err != nil || r != nil {
			t.Fatalf("a refused start wrote its run: %+v %v", r, err)
		}
		// The same thread and setup now start: "created" says the refusals left no row.
		const g = 2 * 60_000
		st := decode[startResponse](t, e.do(req{method: post, path: "/v1/runs", body: withGrace("grace-ok", g)}).wantStatusRaw(t, http.StatusOK))
		if st.Outcome != "created" {
			t.Fatalf("the in-range start answered %q, want created (a refused start left a row?)", st.Outcome)
		}
		row, err := e.backend.Instances().GetRow(ctx, st.Sandbox.Key)
		if err != nil || row == nil || row.IdleStopMs != g {
			t.Fatalf("the row of %s: %+v (%v), want idleStopMs %d", st.Sandbox.Key, row, err, g)
		}
	})
}
