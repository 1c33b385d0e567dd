package emf

import (
	"bytes"
	"errors"
	"fmt"
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
	got, err := Parse(buf.Bytes())
	if err != nil || got.Metric != "ReapOutcome" || got.Value() != 2 || got.Dim("Outcome") != "reclaim-failed" ||
		got.Timestamp != 1234 || !slices.Equal(got.Dimensions, []string{"Outcome"}) {
		t.Fatalf("bad EMF line (%v): %s", err, buf.String())
	}
	var nilRec *Recorder
	nilRec.Count("X", 1) // must not panic
}

// docs decodes out's lines, failing on any that is not a valid EMF document (Parse).
func docs(t *testing.T, out string) []Document {
	t.Helper()
	var ds []Document
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		d, err := Parse([]byte(l))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	return ds
}

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
	if len(ds) != 2 || ds[0].Fields["Route"] != "GET /v1/ship" || ds[0].Fields["Requests"] != float64(5) ||
		ds[1].Fields["Route"] != "POST /v1/runs/{runId}/ship" || ds[1].Fields["Status"] != "200" || ds[1].Fields["Requests"] != float64(50) {
		t.Fatalf("the minute's sums: %v, want GET /v1/ship 5 and POST ship 50", ds)
	}
	for _, d := range ds {
		if d.Timestamp != minute.UnixMilli() || !slices.Equal(d.Dimensions, []string{"Route", "Status"}) {
			t.Fatalf("document %v: timestamp %d, dimensions %v; want the minute's start %d and Route, Status", d, d.Timestamp, d.Dimensions, minute.UnixMilli())
		}
	}
	// A Count an hour on writes the held sum first (at its own minute), then itself.
	buf.Reset()
	now = minute.Add(time.Hour + 30*time.Second)
	r.Count("Requests", 1, "Route", "POST /v1/runs/{runId}/ship", "Status", "503")
	ds = docs(t, buf.String())
	if len(ds) != 2 || ds[0].Fields["Status"] != "200" || ds[0].Fields["Requests"] != float64(1) || ds[0].Timestamp != minute.Add(SumPeriod).UnixMilli() ||
		ds[1].Fields["Status"] != "503" || ds[1].Timestamp != now.UnixMilli() {
		t.Fatalf("after an hour, a Count wrote %v; want the held sum at its minute, then the count at once", ds)
	}
	// Flush writes what is held, once.
	buf.Reset()
	r.Sum("Superseded", 2)
	r.Flush()
	r.Flush()
	if ds = docs(t, buf.String()); len(ds) != 1 || ds[0].Fields["Superseded"] != float64(2) || len(ds[0].Dimensions) != 0 {
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

// TestParseRefusesWhatRecorderNeverWrites: a log line is ErrNotEMF, and each broken
// declaration is an error, so the tests reading EMF back fail on a malformed line.
func TestParseRefusesWhatRecorderNeverWrites(t *testing.T) {
	if _, err := Parse([]byte(`{"msg":"a log line"}`)); !errors.Is(err, ErrNotEMF) {
		t.Fatalf("a log line: %v, want ErrNotEMF", err)
	}
	decl := func(ns, unit string, ts int64) string {
		return fmt.Sprintf(`"_aws":{"Timestamp":%d,"CloudWatchMetrics":[{"Namespace":%q,"Dimensions":[["Route"]],"Metrics":[{"Name":"Requests","Unit":%q}]}]}`, ts, ns, unit)
	}
	for name, line := range map[string]string{
		"not JSON":           `{"Requests":`,
		"other namespace":    `{"Requests":1,"Route":"r",` + decl("Other", "Count", 1) + `}`,
		"other unit":         `{"Requests":1,"Route":"r",` + decl(Namespace, "Seconds", 1) + `}`,
		"no timestamp":       `{"Requests":1,"Route":"r",` + decl(Namespace, "Count", 0) + `}`,
		"no metric value":    `{"Route":"r",` + decl(Namespace, "Count", 1) + `}`,
		"no dimension value": `{"Requests":1,` + decl(Namespace, "Count", 1) + `}`,
	} {
		if _, err := Parse([]byte(line)); err == nil || errors.Is(err, ErrNotEMF) {
			t.Errorf("%s: Parse(%s) = %v, want an error", name, line, err)
		}
	}
	d, err := Parse([]byte(`{"Requests":3,"Route":"r",` + decl(Namespace, "Count", 7) + `}`))
	if err != nil || d.Value() != 3 || d.Dim("Route") != "r" || d.Timestamp != 7 {
		t.Fatalf("a valid line: %+v, %v", d, err)
	}
}
