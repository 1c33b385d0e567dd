package emf

import (
	"bytes"
	"encoding/json"
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
