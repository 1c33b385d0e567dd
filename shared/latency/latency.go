// Package latency holds the one percentile rule of the figures tests log and of the
// benchmark's report (docs/design.md §11).
package latency

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Percentile is the nearest-rank percentile of ds (ds is not modified).
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// Summary is the count, p50, p99 and maximum of ds (Percentile's), to the millisecond: the
// form tests log a measured figure in.
func Summary(ds []time.Duration) string {
	r := func(p float64) time.Duration { return Percentile(ds, p).Round(time.Millisecond) }
	return fmt.Sprintf("n %d p50 %s p99 %s max %s", len(ds), r(50), r(99), r(100))
}
