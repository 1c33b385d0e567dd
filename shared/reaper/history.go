package reaper

import (
	"slices"
	"sync"
)

// SweepRecord is one finished sweep as a viewer sees it.
type SweepRecord struct {
	Seq        int64  `json:"seq"`        // 1, 2, ... in the order the sweeps ran
	StartedAt  int64  `json:"startedAt"`  // ms
	FinishedAt int64  `json:"finishedAt"` // ms
	Error      string `json:"error,omitempty"`
	Report     Report `json:"report"`
}

// ForTenant returns the record with only tenant's runs, their outcome counts and their
// number as considered; probed and the housekeeping counts stay the sweep's totals (counts
// over every tenant that name no run).
func (s SweepRecord) ForTenant(tenant string) SweepRecord {
	runs := []RunEntry{}
	var o Outcomes
	for _, e := range s.Report.Runs {
		if e.Tenant == tenant {
			runs = append(runs, e)
			o.add(e.Outcome)
		}
	}
	s.Report.Runs, s.Report.Outcomes = runs, o
	s.Report.Planned = nil
	s.Report.Considered = len(runs)
	return s
}

// History keeps the last sweeps in memory (the dev server's reaper page); safe for
// concurrent use.
type History struct {
	mu   sync.Mutex
	max  int
	seq  int64
	last []SweepRecord // oldest first
}

// NewHistory keeps the last n sweeps (n >= 1).
func NewHistory(n int) *History { return &History{max: max(n, 1)} }

// Add records a finished sweep, numbering it; the oldest beyond the capacity is dropped.
func (h *History) Add(rec SweepRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	rec.Seq = h.seq
	h.last = append(h.last, rec)
	if len(h.last) > h.max {
		h.last = slices.Delete(h.last, 0, len(h.last)-h.max)
	}
}

// Recent returns up to limit sweeps older than seq before (0: from the newest), newest
// first, and whether older ones remain.
func (h *History) Recent(before int64, limit int) (recs []SweepRecord, more bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.last) - 1; i >= 0; i-- {
		r := h.last[i]
		if before > 0 && r.Seq >= before {
			continue
		}
		if len(recs) == limit {
			return recs, true
		}
		recs = append(recs, r)
	}
	return recs, false
}

// Capacity is how many sweeps the history keeps.
func (h *History) Capacity() int { return h.max }
