package httpapi

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
)

// SweepSource is where GET /v1/reaper/sweeps reads the last sweeps (the dev server's
// in-memory reaper.History).
type SweepSource interface {
	// Recent returns up to limit sweeps with seq below before (0: the newest), newest
	// first, and whether older ones remain.
	Recent(before int64, limit int) ([]reaper.SweepRecord, bool)
	// Capacity is how many sweeps the source keeps.
	Capacity() int
}

// Sweeps configures GET /v1/reaper/sweeps; without it the route answers 501 unsupported.
type Sweeps struct {
	Source      SweepSource
	Every       time.Duration // the sweep period
	DetachedTTL time.Duration
}

// checkQuery refuses a query parameter outside allowed, or one given twice.
func checkQuery(q url.Values, allowed ...string) error {
	for name, vs := range q {
		ok := false
		for _, a := range allowed {
			ok = ok || a == name
		}
		if !ok {
			return contract.Invalid(name, "unknown query parameter (want %s)", strings.Join(allowed, ", "))
		}
		if len(vs) != 1 {
			return contract.Invalid(name, "given more than once")
		}
	}
	return nil
}

// listCursor is the opaque page cursor of GET /v1/runs: the last position returned.
func listCursor(p contract.RunPos) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(p.StartedAt, 10) + "." + p.RunID))
}

func parseListCursor(s string) (*contract.RunPos, error) {
	bad := contract.Invalid("cursor", "not a cursor of this listing")
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	n, id, ok := strings.Cut(string(raw), ".")
	at, err := strconv.ParseInt(n, 10, 64)
	if !ok || err != nil || at < 0 || contract.CheckID("cursor", id) != nil {
		return nil, bad
	}
	return &contract.RunPos{StartedAt: at, RunID: id}, nil
}

func (h *handler) listRuns(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	if err := checkQuery(q, "threadId", "status", "limit", "cursor"); err != nil {
		return 0, nil, err
	}
	var f contract.RunFilter
	if v, ok := q["threadId"]; ok {
		if err := contract.CheckID("threadId", v[0]); err != nil {
			return 0, nil, err
		}
		f.ThreadID, c.info.threadID = v[0], v[0]
	}
	if v, ok := q["status"]; ok {
		st, err := contract.ParseRunStatus(v[0])
		if err != nil {
			return 0, nil, err
		}
		f.Status = st
	}
	limit, err := queryInt(q, "limit", wire.DefaultListLimit, 1, wire.MaxListLimit)
	if err != nil {
		return 0, nil, err
	}
	var after *contract.RunPos
	if v, ok := q["cursor"]; ok {
		if after, err = parseListCursor(v[0]); err != nil {
			return 0, nil, err
		}
	}
	page, err := h.k.ListRuns(ctx, f, after, int(limit))
	if err != nil {
		return 0, nil, err
	}
	out := wire.RunListResponse{Runs: make([]wire.RunView, 0, len(page.Runs)), Now: h.now().UnixMilli()}
	for _, v := range page.Runs {
		out.Runs = append(out.Runs, wireRunView(v))
	}
	if page.Next != nil {
		next := listCursor(*page.Next)
		out.Next = &next
	}
	return http.StatusOK, out, nil
}

func (h *handler) viewRun(ctx context.Context, c *call) (int, any, error) {
	if err := checkQuery(c.r.URL.Query()); err != nil {
		return 0, nil, err
	}
	v, err := h.k.View(ctx, c.runID)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.RunViewResponse{Run: wireRunView(v), Now: h.now().UnixMilli()}, nil
}

func (h *handler) reaperSweeps(_ context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	if err := checkQuery(q, "limit", "cursor"); err != nil {
		return 0, nil, err
	}
	if h.sweeps == nil || h.sweeps.Source == nil {
		return 0, nil, fmt.Errorf("%w: this server keeps no sweep reports (the dev server does; a deployed reaper logs each report as a JSON line)", keeper.ErrUnsupported)
	}
	src := h.sweeps.Source
	limit, err := queryInt(q, "limit", wire.DefaultSweepsLimit, 1, int64(max(src.Capacity(), 1)))
	if err != nil {
		return 0, nil, err
	}
	before, err := queryInt(q, "cursor", 0, 1, 1<<53)
	if err != nil {
		return 0, nil, err
	}
	recs, more := src.Recent(before, int(limit))
	out := wire.SweepsResponse{
		Sweeps:        make([]wire.TenantSweep, 0, len(recs)),
		Kept:          src.Capacity(),
		EveryMs:       h.sweeps.Every.Milliseconds(),
		DetachedTTLMs: h.sweeps.DetachedTTL.Milliseconds(),
		Now:           h.now().UnixMilli(),
	}
	for _, r := range recs {
		out.Sweeps = append(out.Sweeps, wireSweep(r.ForTenant(c.tenant)))
	}
	if more {
		next := strconv.FormatInt(recs[len(recs)-1].Seq, 10)
		out.Next = &next
	}
	return http.StatusOK, out, nil
}
