// Package latency holds the one percentile rule of the benchmark's report and of the
// figures tests log.
package latency

import (
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
