package httpapi

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestHTTPCallBudgets counts the DynamoDB calls behind each route on the local DynamoDB:
// the HTTP layer (tenant resolution, cursor checks, validation) adds no call to the docs/design.md §11
// budgets of the operations' hot paths.
func TestHTTPCallBudgets(t *testing.T) {
	counter := dynamotest.NewCounter()
	client := dynamotest.Client(t, counter.Attach)
	e := newEnv(t, DevAuth{}, dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)}))

	measure := func(name string, budget int, r req, status int) resp {
		t.Helper()
		counter.Reset()
		out := e.do(r)
		calls := counter.Total()
		if out.Status != status {
			t.Fatalf("%s: status %d, want %d: %s", name, out.Status, status, out.Body)
		}
		t.Logf("%-32s %d DynamoDB calls (budget %d) %v", name, calls, budget, counter.Snapshot())
		if calls > budget {
			t.Errorf("%s: %d DynamoDB calls, budget %d: %v", name, calls, budget, counter.Snapshot())
		}
		return out
	}

	s1 := e.start("", "run-1", "thread-1")
	e.finish("", "run-1", s1.Cursor, "completed").wantStatus(t, 200)

	s2 := decode[startResponse](t, measure("start (new run, resumed)", 3,
		req{method: post, path: "/v1/runs", body: startBody("run-2", "thread-1")}, 200))
	if s2.Outcome != "resumed" {
		t.Fatalf("outcome %s, want resumed", s2.Outcome)
	}
	ap := decode[appendResponse](t, measure("append", 1, req{method: post, path: "/v1/runs/run-2/events",
		body: map[string]any{"cursor": s2.Cursor, "events": []any{map[string]any{"data": "x"}}}}, 200))
	measure("heartbeat", 1, req{method: post, path: "/v1/runs/run-2/heartbeat", body: map[string]any{"cursor": ap.Cursor}}, 200)
	measure("detach", 1, req{method: post, path: "/v1/runs/run-2/detach", body: map[string]any{"cursor": ap.Cursor}}, 200)
	measure("get run", 1, req{method: get, path: "/v1/runs/run-2"}, 200)
	rd := decode[readResponse](t, measure("read from 0 (events)", 1, req{method: get, path: "/v1/runs/run-2/events"}, 200))
	// Attach claims first, on condition that nobody holds the run (docs/design.md §8.3): a
	// detached run costs the plain takeover; a held one the refused claim (with its read),
	// the instance row for the shipper probe, then the takeover.
	at := decode[attachResponse](t, measure("attach", 4, req{method: post, path: "/v1/runs/run-2/attach"}, 200))
	e.start("", "run-3", "thread-3")
	measure("attach, held by its host", 7, req{method: post, path: "/v1/runs/run-3/attach"}, 200)
	measure("cancel", 3, req{method: post, path: "/v1/runs/run-2/cancel"}, 202)
	// The cancel marker took the slot the driver's cursor points at: the log steps over it
	// (the backend's cost, not the HTTP layer's).
	ap2 := decode[appendResponse](t, measure("append over the cancel marker", 3, req{method: post, path: "/v1/runs/run-2/events",
		body: map[string]any{"cursor": at.Cursor, "events": []any{map[string]any{"data": "y"}}}}, 200))
	measure("read from a next (events)", 1, req{method: get, path: fmt.Sprintf("/v1/runs/run-2/events?after=%d", rd.Next)}, 200)
	// finish: the fence write and the state write, then the instance row read that settles
	// the sandbox (reuse none, destroyOnCancel, a setup's grace: docs/design.md §5).
	measure("finish", 3, req{method: post, path: "/v1/runs/run-2/finish",
		body: map[string]any{"cursor": ap2.Cursor, "status": "completed"}}, 200)
	// Refusals: a stale cursor costs the log's refused write and its re-read; a foreign
	// cursor one read (the run is resolved in the caller's tenant first); an empty page of
	// an unknown run the log's read (with its terminal check) plus the run's resolution.
	measure("append, superseded cursor", 2, req{method: post, path: "/v1/runs/run-2/events",
		body: map[string]any{"cursor": ap.Cursor, "events": []any{map[string]any{"data": "z"}}}}, http.StatusConflict)
	measure("heartbeat, foreign cursor", 1, req{method: post, path: "/v1/runs/run-2/heartbeat",
		body: map[string]any{"cursor": "forged.cursor"}}, http.StatusConflict)
	measure("read, unknown run", 3, req{method: get, path: "/v1/runs/nope/events"}, http.StatusNotFound)
}

// TestIdleLongPollReads counts the DynamoDB reads of a long poll that finds nothing: at
// most 2 per second of waiting (docs/design.md, Append / Read), the page read and the
// run's resolution that any empty read costs included — at the tail after a one-event
// item and after a multi-event one (whose end no item begins at). (At the former 500 ms
// re-read a 20 s idle poll cost 81 calls, 4.1 per second.)
func TestIdleLongPollReads(t *testing.T) {
	counter := dynamotest.NewCounter()
	client := dynamotest.Client(t, counter.Attach)
	e := newEnv(t, DevAuth{}, dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)}))
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("after a %d-event item", batch), func(t *testing.T) {
			runID := fmt.Sprintf("run-%d", batch)
			s := e.start("", runID, "thread-"+runID)
			var events []any
			for range batch {
				events = append(events, map[string]any{"data": "x"})
			}
			ap := decode[appendResponse](t, e.do(req{method: post, path: "/v1/runs/" + runID + "/events",
				body: map[string]any{"cursor": s.Cursor, "events": events}}))
			const waitMs = 5000
			counter.Reset()
			out := e.do(req{method: get, path: fmt.Sprintf("/v1/runs/%s/events?after=%d&waitMs=%d", runID, ap.LastOffset, waitMs)})
			out.wantStatus(t, 200)
			if page := decode[readResponse](t, out); len(page.Events) != 0 || page.Closed {
				t.Fatalf("idle long poll answered %+v", page)
			}
			calls := counter.Total()
			t.Logf("idle long poll of %d ms: %d DynamoDB calls %v", waitMs, calls, counter.Snapshot())
			// A slow machine only lowers the count: the poll ends at its deadline whatever it did.
			if budget := 2 * waitMs / 1000; calls > budget {
				t.Errorf("idle long poll of %d ms: %d DynamoDB calls, budget %d: %v", waitMs, calls, budget, counter.Snapshot())
			}
		})
	}
}
