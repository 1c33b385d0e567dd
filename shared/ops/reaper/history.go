package reaper

import (
	"slices"
	"sync"
)

// SweepRecord is one finished sweep, whole (every tenant's runs): what the dev server
// keeps. A tenant sees it through ForTenant.
type SweepRecord struct {
	Seq        int64  `json:"seq"`        // 1, 2, ... in the order the sweeps ran
	StartedAt  int64  `json:"startedAt"`  // ms
	FinishedAt int64  `json:"finishedAt"` // ms
	Error      string `json:"error,omitempty"`
	Report     Report `json:"report"`
}

// TenantSweep is one sweep as a tenant may see it: when it started and what it did with
// that tenant's runs. A sweep works across tenants, so everything else it knows is
// derived from other tenants' runs, rows and sandboxes and is left out: the probed and
// housekeeping counts, its duration and its error (a listing failure's text may name any
// tenant's keys).
type TenantSweep struct {
	Seq       int64        `json:"seq"`
	StartedAt int64        `json:"startedAt"` // ms; sweeps start on a fixed period
	Report    TenantReport `json:"report"`
}

// TenantReport is the part of a sweep's report about one tenant's runs.
type TenantReport struct {
	Considered int        `json:"considered"` // this tenant's runs the sweep reported on
	Outcomes   Outcomes   `json:"outcomes"`
	Sandboxes  Sandboxes  `json:"sandboxes"` // the sandboxes of this tenant's runs the sweep ended
	Runs       []RunEntry `json:"runs"`
}

// ForTenant returns the sweep as tenant sees it: its runs alone, and counts made from them
// only.
func (s SweepRecord) ForTenant(tenant string) TenantSweep {
	rep := Report{Runs: []RunEntry{}}
	for _, e := range s.Report.Runs {
		if e.Tenant == tenant {
			rep.add(e)
		}
	}
	return TenantSweep{Seq: s.Seq, StartedAt: s.StartedAt,
		Report: TenantReport{Considered: rep.Considered, Outcomes: rep.Outcomes, Sandboxes: rep.Sandboxes, Runs: rep.Runs}}
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
