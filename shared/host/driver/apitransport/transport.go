// Package apitransport is driver.Transport over the HTTP API (shared/api/apiclient): what a
// host that knows only the API's address drives a run with. It lives on the driver's side
// so the client imports nothing of keeper or the driver (docs/design.md §13).
package apitransport

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/driver"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Transport is driver.Transport over the API: one driver's hold on one run, carrying the
// driver's cursor token between calls (each pump answer's cursor replaces it).
type Transport struct {
	c     *apiclient.Client
	runID string

	mu     sync.Mutex
	cursor string
}

var _ driver.Transport = (*Transport)(nil)

// New returns the API transport of runID for the driver holding cursor (the token a start
// or attach answered).
func New(c *apiclient.Client, runID, cursor string) *Transport {
	return &Transport{c: c, runID: runID, cursor: cursor}
}

// Cursor is the driver's current cursor token (a detach sends it).
func (t *Transport) Cursor() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cursor
}

// Pump calls POST /v1/runs/{runId}/pump with the cursor and advances it.
func (t *Transport) Pump(ctx context.Context, wait time.Duration) (driver.PumpResult, error) {
	ms := max(0, min(wait.Milliseconds(), wire.MaxPumpWaitMs))
	res, err := t.c.Pump(ctx, t.runID, wire.PumpRequest{Cursor: t.Cursor(), WaitMs: &ms})
	if err != nil {
		return driver.PumpResult{}, keeperErr(err)
	}
	t.mu.Lock()
	t.cursor = res.Cursor
	t.mu.Unlock()
	out := driver.PumpResult{Appended: res.Appended, LastOffset: res.LastOffset, Src: res.Src, Exited: res.Exited, CancelRequested: res.CancelRequested}
	if res.ExitCode != nil {
		out.ExitCode = *res.ExitCode
	}
	return out, nil
}

// Heartbeat calls POST /v1/runs/{runId}/heartbeat with the cursor.
func (t *Transport) Heartbeat(ctx context.Context) (keeper.HeartbeatResult, error) {
	res, err := t.c.Heartbeat(ctx, t.runID, t.Cursor())
	if err != nil {
		return keeper.HeartbeatResult{}, keeperErr(err)
	}
	return keeper.HeartbeatResult{CancelRequested: res.CancelRequested, LeaseUntil: res.LeaseUntil}, nil
}

// Finish calls POST /v1/runs/{runId}/finish with the cursor (the server kills an aborted
// run's agent and closes the log).
func (t *Transport) Finish(ctx context.Context, in keeper.FinishInput) (contract.RunRecord, error) {
	rec, err := t.c.Finish(ctx, t.runID, wire.FinishRequest{Cursor: t.Cursor(), Status: string(in.Status), Error: in.Error, Usage: in.Usage})
	return rec, keeperErr(err)
}

// keeperErr lets the driver loop and its callers read the client's answers as keeper's
// (the client imports no keeper): apiclient.ErrUnsupported also matches
// keeper.ErrUnsupported, apiclient.ErrUnavailable keeper.ErrUnavailable. The sandbox
// sentinels already match; the message and the *apiclient.Error stay as they were.
func keeperErr(err error) error {
	switch {
	case errors.Is(err, apiclient.ErrUnsupported):
		return &mapped{err: err, sentinel: keeper.ErrUnsupported}
	case errors.Is(err, apiclient.ErrUnavailable):
		return &mapped{err: err, sentinel: keeper.ErrUnavailable}
	}
	return err
}

// mapped is err that also matches sentinel.
type mapped struct {
	err      error
	sentinel error
}

func (m *mapped) Error() string   { return m.err.Error() }
func (m *mapped) Unwrap() []error { return []error{m.err, m.sentinel} }
