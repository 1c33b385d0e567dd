package emf

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCountWritesEMF(t *testing.T) {
	var buf bytes.Buffer
	r := New(&buf)
	r.now = func() time.Time { return time.UnixMilli(1234) }
	r.Count("ReapOutcome", 2, "Outcome", "reclaim-failed")
	var got struct {
		ReapOutcome float64
		Outcome     string
		AWS         struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	m := got.AWS.CloudWatchMetrics
	if got.ReapOutcome != 2 || got.Outcome != "reclaim-failed" || got.AWS.Timestamp != 1234 ||
		len(m) != 1 || m[0].Namespace != "Sandkeep" || m[0].Dimensions[0][0] != "Outcome" ||
		m[0].Metrics[0].Name != "ReapOutcome" {
		t.Fatalf("bad EMF line: %s", buf.String())
	}
	var nilRec *Recorder
	nilRec.Count("X", 1) // must not panic
}

// emfDoc is one EMF line as CloudWatch reads it: its fields and its declaration.
type emfDoc struct {
	fields map[string]any
	AWS    struct {
		Timestamp         int64
		CloudWatchMetrics []struct {
			Namespace  string
			Dimensions [][]string
			Metrics    []struct{ Name, Unit string }
		}
	} `json:"_aws"`
}

// docs decodes out's lines, failing on any that is not a valid one-metric EMF document
// whose declared dimensions all have values.
func docs(t *testing.T, out string) []emfDoc {
	t.Helper()
	var ds []emfDoc
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		var d emfDoc
		if err := json.Unmarshal([]byte(l), &d); err != nil || json.Unmarshal([]byte(l), &d.fields) != nil {
			t.Fatalf("not JSON: %q (%v)", l, err)
		}
		m := d.AWS.CloudWatchMetrics
		if len(m) != 1 || m[0].Namespace != Namespace || len(m[0].Metrics) != 1 || m[0].Metrics[0].Unit != "Count" || len(m[0].Dimensions) != 1 {
			t.Fatalf("not a one-metric EMF document: %q", l)
		}
		if _, ok := d.fields[m[0].Metrics[0].Name].(float64); !ok {
			t.Fatalf("the metric has no value: %q", l)
		}
		for _, dim := range m[0].Dimensions[0] {
			if s, _ := d.fields[dim].(string); s == "" {
				t.Fatalf("dimension %s has no value: %q", dim, l)
			}
		}
		ds = append(ds, d)
	}
	return ds
}

func (d emfDoc) String() string { b, _ := json.Marshal(d.fields); return string(b) }

// TestSumWritesOncePerMinute: sums are held through their minute (nothing written),
// written by the first record after it, one document per metric and dimension values with
// the minute's start as timestamp, and the datum that ended the minute starts the next.
func TestSumWritesOncePerMinute(t *testing.T) {
	var buf bytes.Buffer
	minute := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	now := minute.Add(10 * time.Second)
	r := NewWithClock(&buf, func() time.Time { return now })
	for i := range 50 {
		r.Sum("Requests", 1, "Route", "POST /v1/runs/{runId}/ship", "Status", "200")
		if i%10 == 0 {
			r.Sum("Requests", 1, "Route", "GET /v1/ship", "Status", "204")
		}
		now = now.Add(time.Second) // 10 s .. 59 s
	}
	if buf.Len() != 0 {
		t.Fatalf("sums written inside their minute:\n%s", buf.String())
	}
	now = minute.Add(SumPeriod) // the next minute's first datum writes the last minute's sums
	r.Sum("Requests", 1, "Route", "POST /v1/runs/{runId}/ship", "Status", "200")
	ds := docs(t, buf.String())
	if len(ds) != 2 || ds[0].fields["Route"] != "GET /v1/ship" || ds[0].fields["Requests"] != float64(5) ||
		ds[1].fields["Route"] != "POST /v1/runs/{runId}/ship" || ds[1].fields["Status"] != "200" || ds[1].fields["Requests"] != float64(50) {
		t.Fatalf("the minute's sums: %v, want GET /v1/ship 5 and POST ship 50", ds)
	}
	for _, d := range ds {
		if d.AWS.Timestamp != minute.UnixMilli() || !slices.Equal(d.AWS.CloudWatchMetrics[0].Dimensions[0], []string{"Route", "Status"}) {
			t.Fatalf("document %v: timestamp %d, dimensions %v; want the minute's start %d and Route, Status", d, d.AWS.Timestamp, d.AWS.CloudWatchMetrics[0].Dimensions, minute.UnixMilli())
		}
	}
	// A Count an hour on writes the held sum first (at its own minute), then itself.
	buf.Reset()
	now = minute.Add(time.Hour + 30*time.Second)
	r.Count("Requests", 1, "Route", "POST /v1/runs/{runId}/ship", "Status", "503")
	ds = docs(t, buf.String())
	if len(ds) != 2 || ds[0].fields["Status"] != "200" || ds[0].fields["Requests"] != float64(1) || ds[0].AWS.Timestamp != minute.Add(SumPeriod).UnixMilli() ||
		ds[1].fields["Status"] != "503" || ds[1].AWS.Timestamp != now.UnixMilli() {
		t.Fatalf("after an hour, a Count wrote %v; want the held sum at its minute, then the count at once", ds)
	}
	// Flush writes what is held, once.
	buf.Reset()
	r.Sum("Superseded", 2)
	r.Flush()
	r.Flush()
	if ds = docs(t, buf.String()); len(ds) != 1 || ds[0].fields["Superseded"] != float64(2) || len(ds[0].AWS.CloudWatchMetrics[0].Dimensions[0]) != 0 {
		t.Fatalf("flush wrote %v, want one Superseded 2 without dimensions", ds)
	}
	var nilRec *Recorder
	nilRec.Sum("X", 1)
	nilRec.Flush() // must not panic
}

// TestSumTableBounded: a period holding maxSums distinct sums writes them at once.
func TestSumTableBounded(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	r := NewWithClock(&buf, func() time.Time { return now })
	for i := range maxSums - 1 {
		r.Sum("Requests", 1, "Status", strconv.Itoa(i))
	}
	if buf.Len() != 0 {
		t.Fatal("written below the bound")
	}
	r.Sum("Requests", 1, "Status", "last")
	if n := len(docs(t, buf.String())); n != maxSums {
		t.Fatalf("%d documents at the bound, want %d", n, maxSums)
	}
}
