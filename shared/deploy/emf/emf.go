// Package emf writes CloudWatch metrics in Embedded Metric Format: one JSON log line per
// metric datum, which the Lambda log pipeline turns into metrics without an API call.
package emf

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Namespace is the CloudWatch namespace of every sandkeep metric.
const Namespace = "Sandkeep"

// Recorder emits EMF lines to a writer; safe for concurrent use. A nil *Recorder records
// nothing, so callers never need to check.
type Recorder struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

// New returns a Recorder writing to w (os.Stdout in a Lambda).
func New(w io.Writer) *Recorder { return &Recorder{w: w, now: time.Now} }

// Count records value of metric (unit Count) with the given dimensions, e.g.
// Count("ReapOutcome", 1, "Outcome", "reclaim-failed"). dims are name/value pairs.
func (r *Recorder) Count(metric string, value float64, dims ...string) {
	if r == nil {
		return
	}
	line := map[string]any{metric: value}
	names := []string{}
	for i := 0; i+1 < len(dims); i += 2 {
		line[dims[i]] = dims[i+1]
		names = append(names, dims[i])
	}
	line["_aws"] = map[string]any{
		"Timestamp": r.now().UnixMilli(),
		"CloudWatchMetrics": []any{map[string]any{
			"Namespace":  Namespace,
			"Dimensions": [][]string{names},
			"Metrics":    []any{map[string]string{"Name": metric, "Unit": "Count"}},
		}},
	}
	b, err := json.Marshal(line)
	if err != nil {
		return // every value above is marshalable
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.Write(append(b, '\n')) // metrics are best effort; a failed log write must not fail a request
}
