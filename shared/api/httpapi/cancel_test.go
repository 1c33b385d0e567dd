package httpapi

import (
	"net/http"
	"testing"
)

// TestCancelIsStickyForTheDriver: once an epoch has seen a cancel, every later append and
// heartbeat of the run says cancelRequested — after an attach that reported it (the cancel
// marker lies behind the new driver's cursor), after the append that stepped over the
// marker, and on the retry of that append whose first answer was lost.
func TestCancelIsStickyForTheDriver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		appendAt := func(runID, cursor, data string) appendResponse {
			t.Helper()
			return decode[appendResponse](t, e.appendEvents("", runID, cursor, data).wantStatusRaw(t, http.StatusOK))
		}
		heartbeat := func(runID, cursor string) heartbeatResponse {
			t.Helper()
			return decode[heartbeatResponse](t, e.do(req{method: post, path: "/v1/runs/" + runID + "/heartbeat",
				body: map[string]any{"cursor": cursor}}).wantStatusRaw(t, http.StatusOK))
		}
		cancel := func(runID string) {
			t.Helper()
			e.do(req{method: post, path: "/v1/runs/" + runID + "/cancel"}).wantStatus(t, http.StatusAccepted)
		}

		t.Run("after attach", func(t *testing.T) {
			s := e.start("", "run-a", "thread-a")
			c := appendAt("run-a", s.Cursor, "before").Cursor
			e.do(req{method: post, path: "/v1/runs/run-a/detach", body: map[string]any{"cursor": c}}).wantStatus(t, http.StatusOK)
			cancel("run-a")
			at := decode[attachResponse](t, e.do(req{method: post, path: "/v1/runs/run-a/attach"}).wantStatusRaw(t, http.StatusOK))
			if !at.CancelRequested {
				t.Fatal("attach after cancel says cancelRequested false")
			}
			cur := at.Cursor
			for i, d := range []string{"one", "two", "three"} {
				ap := appendAt("run-a", cur, d)
				if !ap.CancelRequested {
					t.Errorf("append %d after the attach that saw the cancel says cancelRequested false", i+1)
				}
				if hb := heartbeat("run-a", ap.Cursor); !hb.CancelRequested {
					t.Errorf("heartbeat after append %d says cancelRequested false", i+1)
				}
				cur = ap.Cursor
			}
		})

		t.Run("after the append over the marker, and its retry", func(t *testing.T) {
			s := e.start("", "run-b", "thread-b")
			c1 := appendAt("run-b", s.Cursor, "before").Cursor
			cancel("run-b")
			first := appendAt("run-b", c1, "batch")
			if !first.CancelRequested {
				t.Fatal("the append that met the cancel marker says cancelRequested false")
			}
			// The first answer was lost: the driver retries the same batch at the same cursor.
			retry := appendAt("run-b", c1, "batch")
			if retry.LastOffset != first.LastOffset {
				t.Fatalf("the retry stored the batch again: last offset %d, first %d", retry.LastOffset, first.LastOffset)
			}
			if !retry.CancelRequested {
				t.Error("the retry of the append that met the cancel says cancelRequested false")
			}
			if retry.Cursor != first.Cursor {
				t.Errorf("the retry answered another cursor than the first answer")
			}
			cur := first.Cursor
			for i := range 2 {
				ap := appendAt("run-b", cur, "after")
				if !ap.CancelRequested {
					t.Errorf("append %d after the one that met the marker says cancelRequested false", i+1)
				}
				cur = ap.Cursor
			}
			if !heartbeat("run-b", cur).CancelRequested {
				t.Error("heartbeat after the cancel says cancelRequested false")
			}
		})
	})
}
