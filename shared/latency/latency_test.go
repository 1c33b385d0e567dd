package latency

import (
	"testing"
	"time"
)

// TestPercentileNearestRank pins the percentile definition the report uses.
func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(4, 1, 3, 2), 50, 2 * time.Millisecond}, // rank ceil(2) = 2nd smallest
		{ms(4, 1, 3, 2), 99, 4 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 50, 5 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
	}
	for _, c := range cases {
		if got := Percentile(c.in, c.p); got != c.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", c.in, c.p, got, c.want)
		}
	}
	in := ms(3, 1, 2)
	_ = Percentile(in, 50)
	if in[0] != 3*time.Millisecond {
		t.Error("percentile sorted its input in place")
	}
}

// TestSummary: the logged form names the count, p50, p99 and the maximum, rounded to the
// millisecond, and takes no samples without a panic.
func TestSummary(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond+300*time.Microsecond)
	}
	if got, want := Summary(ds), "n 100 p50 50ms p99 99ms max 100ms"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
	if got, want := Summary(nil), "n 0 p50 0s p99 0s max 0s"; got != want {
		t.Errorf("Summary(nil) = %q, want %q", got, want)
	}
}
