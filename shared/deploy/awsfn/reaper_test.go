package awsfn

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/deploy/emf"
)

type fakeReport struct {
	Outcomes map[string]int `json:"outcomes"`
}

func (r fakeReport) OutcomeCounts() map[string]int { return r.Outcomes }

func TestReaperHandler(t *testing.T) {
	logs, metrics := &syncBuffer{}, &syncBuffer{}
	var sawDeadline time.Duration
	h := &ReaperHandler{log: NewLogger(logs, ""), metrics: emf.New(metrics), sweep: func(ctx context.Context) (Report, error) {
		dl, _ := ctx.Deadline()
		sawDeadline = time.Until(dl)
		return fakeReport{Outcomes: map[string]int{"expired": 2, "reclaim-failed": 1, "in-use": 0}}, nil
	}}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()
	out, err := h.Handle(ctx, json.RawMessage(`{}`))
	if err != nil || !strings.Contains(string(out), `"reclaim-failed":1`) {
		t.Fatalf("report %s, %v", out, err)
	}
	if sawDeadline > 50*time.Second-ReaperDeadlineMargin || sawDeadline <= 0 {
		t.Fatalf("sweep deadline %v: the margin was not kept", sawDeadline)
	}
	m := metrics.String()
	if strings.Count(strings.TrimSpace(m), "\n")+1 != 2 || !strings.Contains(m, `"Outcome":"reclaim-failed"`) || strings.Contains(m, `"in-use"`) {
		t.Fatalf("metrics (zero counts must not be sent):\n%s", m)
	}
	if !strings.Contains(logs.String(), `"report":{"outcomes"`) {
		t.Fatalf("the report is not logged as JSON: %s", logs.String())
	}

	// A failing sweep fails the invocation (→ DLQ) and still logs its report.
	boom := errors.New("throttled")
	h.sweep = func(context.Context) (Report, error) { return fakeReport{Outcomes: map[string]int{"failed": 1}}, boom }
	if _, err := h.Handle(t.Context(), nil); !errors.Is(err, boom) {
		t.Fatalf("error %v", err)
	}
	// A panicking sweep is an error, not a crash.
	h.sweep = func(context.Context) (Report, error) { panic("bug") }
	if _, err := h.Handle(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("panic: %v", err)
	}
	if n := strings.Count(logs.String(), "reap: sweep failed"); n != 2 {
		t.Fatalf("%d failure lines, want 2", n)
	}
}
