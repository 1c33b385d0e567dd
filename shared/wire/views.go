package wire

import (
	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/reaper"
)

// Bounds of the viewer's listings.
const (
	DefaultListLimit   = 50  // GET /v1/runs
	MaxListLimit       = 100 // GET /v1/runs (sandbox.MaxListLimit)
	DefaultSweepsLimit = 10  // GET /v1/reaper/sweeps
)

// RunListResponse answers GET /v1/runs: a page of the tenant's runs, newest first.
type RunListResponse struct {
	Runs []keeper.RunView `json:"runs"`
	Next *string          `json:"next"` // the cursor of the next page; null when done
	Now  int64            `json:"now"`  // server time (ms): lease and detach ages use its clock
}

// RunViewResponse answers GET /v1/runs/{runId}/view.
type RunViewResponse struct {
	Run keeper.RunView `json:"run"`
	Now int64          `json:"now"`
}

// SweepsResponse answers GET /v1/reaper/sweeps: the server's last sweeps, newest first,
// each as the caller's tenant sees it (reaper.SweepRecord.ForTenant).
type SweepsResponse struct {
	Sweeps        []reaper.TenantSweep `json:"sweeps"`
	Next          *string              `json:"next"` // the cursor of older sweeps; null when done
	Kept          int                  `json:"kept"` // how many sweeps the server keeps
	EveryMs       int64                `json:"everyMs"`
	DetachedTTLMs int64                `json:"detachedTtlMs"`
	Now           int64                `json:"now"`
}
