package viewer_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/clitest"
)

// agent is a run in progress that prints {"n":1}, {"n":2}, the hostile payload, {"n":3}, …
// until it is cancelled.
type agent struct {
	done chan string // the run's final status
}

func (a *agent) wait(t *testing.T) string {
	t.Helper()
	select {
	case s := <-a.done:
		return s
	case <-time.After(clitest.Deadline):
		t.Fatal("the agent did not end")
		return ""
	}
}

// post sends a JSON body to the dev server and decodes the answer into out.
func post(dev *clitest.Dev, path string, body, out any) error {
	b, _ := json.Marshal(body)
	res, err := http.Post(dev.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		return fmt.Errorf("POST %s: %d", path, res.StatusCode)
	}
	return json.NewDecoder(res.Body).Decode(out)
}

// detachRun starts a run, appends one event and detaches it, as a host whose viewer left.
func detachRun(t *testing.T, dev *clitest.Dev, runID, thread string) {
	t.Helper()
	var st, ap struct{ Cursor string }
	var det struct{ Run struct{ DetachedSince int64 } }
	if err := post(dev, "/v1/runs", map[string]any{"runId": runID, "threadId": thread,
		"sandbox": map[string]any{"id": "default", "provider": "local-process"}}, &st); err != nil {
		t.Fatal(err)
	}
	if err := post(dev, "/v1/runs/"+runID+"/events", map[string]any{"cursor": st.Cursor, "events": []any{map[string]any{"data": "left behind"}}}, &ap); err != nil {
		t.Fatal(err)
	}
	if err := post(dev, "/v1/runs/"+runID+"/detach", map[string]any{"cursor": ap.Cursor}, &det); err != nil || det.Run.DetachedSince == 0 {
		t.Fatalf("detach: %+v %v", det, err)
	}
}

// startAgent drives the run through the HTTP API as a host does: start, append an event
// every 150 ms, and finish aborted once an append reports the cancel.
func startAgent(t *testing.T, dev *clitest.Dev, runID, thread string) *agent {
	t.Helper()
	post := func(path string, body, out any) error { return post(dev, path, body, out) }
	var st struct{ Cursor string }
	if err := post("/v1/runs", map[string]any{"runId": runID, "threadId": thread,
		"sandbox": map[string]any{"id": "default", "provider": "local-process"}}, &st); err != nil {
		t.Fatal(err)
	}
	a := &agent{done: make(chan string, 1)}
	go func() {
		cursor := st.Cursor
		for i := 1; ; i++ {
			var data any = map[string]int{"n": i}
			if i == 3 {
				data = xssPayload
			}
			var ap struct {
				Cursor          string
				CancelRequested bool
			}
			if err := post("/v1/runs/"+runID+"/events", map[string]any{"cursor": cursor, "events": []any{map[string]any{"data": data}}}, &ap); err != nil {
				a.done <- "append: " + err.Error()
				return
			}
			cursor = ap.Cursor
			if ap.CancelRequested {
				var fin struct{ Run struct{ Status string } }
				if err := post("/v1/runs/"+runID+"/finish", map[string]any{"cursor": cursor, "status": "aborted"}, &fin); err != nil {
					a.done <- "finish: " + err.Error()
					return
				}
				a.done <- fin.Run.Status
				return
			}
			time.Sleep(150 * time.Millisecond) // the agent's pace, not synchronisation
		}
	}()
	return a
}
