package bench

import (
	"maps"
	"slices"
	"time"

	"github.com/sandkeep/sandkeep/shared/latency"
)

// OpStats is one operation's samples: latency and DynamoDB calls of each call.
type OpStats struct {
	Name string
	// Budget is docs/design.md §11's call budget (0 = none stated); Exact: the budget is an exact count
	// ("3") rather than a bound ("≤ 4").
	Budget int
	Exact  bool
	Note   string

	Samples []time.Duration
	Calls   []int          // DynamoDB calls of each sample
	ByAPI   map[string]int // DynamoDB calls per API over all samples
	Scanned int64          // items read by Query/Scan over all samples
}

func newOp(name string, budget int, exact bool) *OpStats {
	return &OpStats{Name: name, Budget: budget, Exact: exact, ByAPI: map[string]int{}}
}

// N returns the number of samples.
func (o *OpStats) N() int { return len(o.Samples) }

// Percentile returns the p-th percentile latency (nearest rank; 0 with no samples).
func (o *OpStats) Percentile(p float64) time.Duration { return latency.Percentile(o.Samples, p) }

// CallsRange returns the fewest and most DynamoDB calls one sample made.
func (o *OpStats) CallsRange() (lo, hi int) {
	if len(o.Calls) == 0 {
		return 0, 0
	}
	return slices.Min(o.Calls), slices.Max(o.Calls)
}

// CallsMean returns the mean DynamoDB calls per sample.
func (o *OpStats) CallsMean() float64 {
	if len(o.Calls) == 0 {
		return 0
	}
	t := 0
	for _, c := range o.Calls {
		t += c
	}
	return float64(t) / float64(len(o.Calls))
}

// WithinBudget reports whether every sample kept docs/design.md §11's call budget (true when none).
func (o *OpStats) WithinBudget() bool {
	if o.Budget == 0 {
		return true
	}
	lo, hi := o.CallsRange()
	if o.Exact {
		return lo == o.Budget && hi == o.Budget
	}
	return hi <= o.Budget
}

// APIs returns the DynamoDB APIs the samples used, sorted.
func (o *OpStats) APIs() []string { return slices.Sorted(maps.Keys(o.ByAPI)) }

// record runs f as one sample of o: its wall time on the monotonic clock and the DynamoDB
// calls the counter saw meanwhile (sections measure one call at a time, so nothing else
// is counted).
func (e *env) record(o *OpStats, f func() error) error {
	before, scanned := e.counter.Snapshot(), e.counter.Scanned()
	t0 := time.Now()
	err := f()
	d := time.Since(t0)
	if err != nil {
		return err
	}
	after := e.counter.Snapshot()
	n := 0
	for api, c := range after {
		if delta := c - before[api]; delta > 0 {
			o.ByAPI[api] += delta
			n += delta
		}
	}
	o.Samples = append(o.Samples, d)
	o.Calls = append(o.Calls, n)
	o.Scanned += e.counter.Scanned() - scanned
	return nil
}
