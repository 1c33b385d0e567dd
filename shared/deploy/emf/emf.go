// Package emf writes CloudWatch metrics in Embedded Metric Format: JSON log lines, which
// the Lambda log pipeline turns into metrics without an API call. Count writes one line
// per datum; Sum adds a datum to a sum written once per minute (docs/design.md §9).
package emf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"
)

// Namespace is the CloudWatch namespace of every sandkeep metric.
const Namespace = "Sandkeep"

// SumPeriod is the period of Sum: a sum holds the data of one wall-clock minute, the
// finest period CloudWatch keeps a standard metric at, and is written with that minute's
// start as its timestamp.
const SumPeriod = time.Minute

// maxSums bounds the sums one period holds; a full table is written at once. The callers'
// dimensions are drawn from small fixed sets (routes, statuses), so it is never reached
// in practice; it only keeps a mistake from growing memory.
const maxSums = 256

// Recorder emits EMF lines to a writer; safe for concurrent use. A nil *Recorder records
// nothing, so callers never need to check.
type Recorder struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
	// period is the start of the minute the sums hold (zero: no sums).
	period time.Time
	sums   map[string]*sum
}

// sum is one metric's total over a period for one set of dimension values.
type sum struct {
	metric string
	dims   []string
	value  float64
}

// New returns a Recorder writing to w (os.Stdout in a Lambda).
func New(w io.Writer) *Recorder { return NewWithClock(w, time.Now) }

// NewWithClock returns a Recorder writing to w whose timestamps and periods are read from
// now.
func NewWithClock(w io.Writer, now func() time.Time) *Recorder {
	return &Recorder{w: w, now: now, sums: map[string]*sum{}}
}

// Count records value of metric (unit Count) with the given dimensions as a line of its
// own, e.g. Count("ReapOutcome", 1, "Outcome", "reclaim-failed"). dims are name/value
// pairs.
func (r *Recorder) Count(metric string, value float64, dims ...string) {
	r.record(func(now time.Time) { r.write(metric, value, dims, now) })
}

// Sum adds value to metric's sum (unit Count) for the given dimensions in the current
// minute. A minute's sums are written, one line per metric and dimension values, by the
// first Sum, Count or Flush after the minute ended: Lambda freezes a container between
// invocations, so the sums of a container's last minute are lost if it is never invoked
// again (docs/design.md §9 says what that costs). Read a summed metric by its Sum
// statistic; its SampleCount counts lines, not data.
func (r *Recorder) Sum(metric string, value float64, dims ...string) {
	r.record(func(now time.Time) {
		if len(r.sums) == 0 {
			r.period = now.Truncate(SumPeriod)
		}
		key := metric + "\x00" + strings.Join(dims, "\x00")
		s := r.sums[key]
		if s == nil {
			s = &sum{metric: metric, dims: slices.Clone(dims)}
			r.sums[key] = s
		}
		s.value += value
		if len(r.sums) >= maxSums {
			r.flush()
		}
	})
}

// record runs f at now with r.mu held, once the sums of an ended minute are written; a nil
// Recorder records nothing.
func (r *Recorder) record(f func(now time.Time)) {
	if r == nil {
		return
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endPeriod(now)
	f(now)
}

// Flush writes the sums held now, whatever the time.
func (r *Recorder) Flush() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flush()
}

// endPeriod writes the sums if their minute is not now's; r.mu is held.
func (r *Recorder) endPeriod(now time.Time) {
	if len(r.sums) > 0 && !now.Truncate(SumPeriod).Equal(r.period) {
		r.flush()
	}
}

// flush writes the sums in a stable order and empties them; r.mu is held.
func (r *Recorder) flush() {
	keys := make([]string, 0, len(r.sums))
	for k := range r.sums {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s := r.sums[k]
		r.write(s.metric, s.value, s.dims, r.period)
	}
	clear(r.sums)
}

// write writes one EMF line; r.mu is held.
func (r *Recorder) write(metric string, value float64, dims []string, at time.Time) {
	line := map[string]any{metric: value}
	names := []string{}
	for i := 0; i+1 < len(dims); i += 2 {
		line[dims[i]] = dims[i+1]
		names = append(names, dims[i])
	}
	line["_aws"] = map[string]any{
		"Timestamp": at.UnixMilli(),
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
	_, _ = r.w.Write(append(b, '\n')) // metrics are best effort; a failed log write must not fail a request
}

// Document is one EMF line read back as CloudWatch reads it.
type Document struct {
	Fields     map[string]any // every field of the line: the metric's value, the dimensions' values
	Timestamp  int64          // Unix milliseconds
	Metric     string         // the one metric declared
	Dimensions []string       // the dimension names declared
}

// Value is the declared metric's value.
func (d Document) Value() float64 { v, _ := d.Fields[d.Metric].(float64); return v }

// Dim is dimension name's value ("" when absent).
func (d Document) Dim(name string) string { s, _ := d.Fields[name].(string); return s }

// ErrNotEMF is Parse's answer for a JSON line without an EMF declaration (a log line).
var ErrNotEMF = errors.New("emf: not an EMF line")

// Parse reads line back and holds it to the shape Recorder writes: one metric of unit
// Count in Namespace, a timestamp, a number for the metric and a value for every declared
// dimension. A JSON line without `_aws` is ErrNotEMF.
func Parse(line []byte) (Document, error) {
	var decl struct {
		AWS *struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
	}
	var d Document
	if err := json.Unmarshal(line, &decl); err != nil {
		return d, fmt.Errorf("emf: not JSON: %w", err)
	}
	if decl.AWS == nil {
		return d, ErrNotEMF
	}
	_ = json.Unmarshal(line, &d.Fields) // decoded once above
	m := decl.AWS.CloudWatchMetrics
	if len(m) != 1 || m[0].Namespace != Namespace || len(m[0].Metrics) != 1 || m[0].Metrics[0].Unit != "Count" ||
		len(m[0].Dimensions) != 1 || decl.AWS.Timestamp == 0 {
		return d, fmt.Errorf("emf: not a one-metric Count document in %s: %s", Namespace, line)
	}
	d.Timestamp, d.Metric, d.Dimensions = decl.AWS.Timestamp, m[0].Metrics[0].Name, m[0].Dimensions[0]
	if _, ok := d.Fields[d.Metric].(float64); !ok {
		return d, fmt.Errorf("emf: metric %s has no value: %s", d.Metric, line)
	}
	for _, name := range d.Dimensions {
		if d.Dim(name) == "" {
			return d, fmt.Errorf("emf: dimension %s has no value: %s", name, line)
		}
	}
	return d, nil
}
