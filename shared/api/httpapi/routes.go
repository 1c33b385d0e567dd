package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Read bounds of GET /v1/runs/{runId}/events (shared/api/wire holds them).
const (
	DefaultReadLimit = wire.DefaultReadLimit
	MaxReadLimit     = wire.MaxReadLimit
	MaxWaitMs        = wire.MaxWaitMs
	maxLabelLen      = wire.MaxLabelLen
)

// Route is one row of the route table (docs/design.md §8): a method and a net/http pattern
// path, the Lambda function that serves it, and whether its operation calls the provider.
type Route struct {
	Method string
	Path   string
	// Function is the Lambda serving the route in a deployment (its directory under
	// functions/, shared/deploy/awsfn); "" for a route only the dev server serves.
	Function string
	// Provider: the route's operation calls the sandbox provider (start resolves or creates
	// a sandbox, snapshot takes one, agent launches in one, pump reads its journal, finish
	// kills an aborted run's agent, cancel a shipped run's agent, docs/design.md §13; a
	// ship end settles a one-run sandbox). Only
	// a function serving such a route holds a provider and reads its API key.
	Provider bool
}

// Pattern is the net/http ServeMux pattern ("POST /v1/runs/{runId}/attach"); it is also
// API Gateway's route key.
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// Routes returns the route table: every route of docs/design.md §8, which api/openapi.yaml
// documents exactly and shared/deploy/awsfn splits between the Lambda functions.
func Routes() []Route {
	rows := routeTable()
	out := make([]Route, len(rows))
	for i, r := range rows {
		out[i] = r.Route
	}
	return out
}

// route is a row of the table with its operation.
type route struct {
	Route
	fn func(*handler, context.Context, *call) (int, any, error)
}

// Lambda functions of the "function" column (shared/deploy/awsfn names them).
const (
	fnResolve = "resolve"
	fnDetach  = "detach"
	fnCancel  = "cancel"
	fnLog     = "log"
	// fnWait serves the routes that may wait (read long polls, pumps), so waiting requests
	// never take the capacity appends and finishes (log) and cancels need.
	fnWait = "wait"
	// fnShip serves the ship routes alone, from its own function URL (docs/design.md §9):
	// their one credential is a run's ship token.
	fnShip  = "ship"
	devOnly = ""
)

// routeTable is the one route table; its order is the functions' and the document's.
func routeTable() []route {
	return append([]route{
		{Route{"POST", "/v1/runs", fnResolve, true}, (*handler).start},
		{Route{"POST", "/v1/runs/{runId}/attach", fnResolve, false}, (*handler).attach},
		{Route{"GET", "/v1/runs/{runId}", fnResolve, false}, (*handler).getRun},
		{Route{"POST", "/v1/runs/{runId}/snapshot", fnResolve, true}, (*handler).snapshot},
		{Route{"GET", "/v1/threads/{threadId}/active-run", fnResolve, false}, (*handler).activeRun},
		{Route{"POST", "/v1/runs/{runId}/heartbeat", fnDetach, false}, (*handler).heartbeat},
		{Route{"POST", "/v1/runs/{runId}/detach", fnDetach, false}, (*handler).detach},
		{Route{"POST", "/v1/runs/{runId}/cancel", fnCancel, true}, (*handler).cancel},
		{Route{"POST", "/v1/threads/{threadId}/cancel", fnCancel, true}, (*handler).cancelThread},
		{Route{"POST", "/v1/runs/{runId}/events", fnLog, false}, (*handler).appendEvents},
		{Route{"GET", "/v1/runs/{runId}/events", fnWait, false}, (*handler).readEvents},
		{Route{"POST", "/v1/runs/{runId}/finish", fnLog, true}, (*handler).finish},
		{Route{"POST", "/v1/runs/{runId}/agent", fnResolve, true}, (*handler).agent},
		{Route{"POST", "/v1/runs/{runId}/pump", fnWait, true}, (*handler).pump},
		// The viewer's reads (views.go).
		{Route{"GET", "/v1/runs", fnResolve, false}, (*handler).listRuns},
		{Route{"GET", "/v1/runs/{runId}/view", fnResolve, false}, (*handler).viewRun},
		{Route{"POST", wire.PushTicketPath, fnResolve, false}, (*handler).pushTicket}, // pushticket.go
		{Route{"GET", "/v1/reaper/sweeps", devOnly, false}, (*handler).reaperSweeps},
	}, append(shipRoutes(), storeRoutes()...)...) // the ship routes (ship.go), the reference store surface (stores.go)
}

func (h *handler) routes() {
	for _, r := range routeTable() {
		fn := func(ctx context.Context, c *call) (int, any, error) { return r.fn(h, ctx, c) }
		if r.Ship() {
			h.handleShip(r.Pattern(), fn, r.Path == wire.ShipProbePath)
			continue
		}
		h.handle(r.Pattern(), fn)
	}
	if h.push != nil {
		h.mux.HandleFunc("GET "+wire.SubscribePath, h.subscribe)
	}
	h.mux.HandleFunc("/", h.notFound)
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func (h *handler) start(ctx context.Context, c *call) (int, any, error) {
	var req wire.StartRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	in, err := startInput(req)
	if err != nil {
		return 0, nil, err
	}
	c.info.runID, c.info.threadID = in.RunID, in.ThreadID
	res, err := h.k.Start(ctx, in)
	if err != nil {
		return 0, nil, err
	}
	c.info.outcome = string(res.Outcome)
	out := wire.StartResponse{
		Run:         res.Run,
		Sandbox:     wireSandbox(res.Sandbox),
		Outcome:     wire.Outcome(res.Outcome),
		DriverEpoch: res.Driver.Epoch,
		Cursor:      h.cursors.sign(c.tenant, in.RunID, res.Driver.Cursor, res.Driver.CancelRequested),
		LeaseMs:     res.Driver.LeaseMs,
		LeaseUntil:  res.Driver.LeaseUntil,
	}
	if res.Outcome == keeper.OutcomeTakenOver {
		d := res.Driver
		out.LastOffset, out.Src, out.CancelRequested = &d.LastOffset, &d.Src, &d.CancelRequested
	}
	return http.StatusOK, out, nil
}

// startInput validates the start body into the keeper's input.
func startInput(req wire.StartRequest) (keeper.StartInput, error) {
	if err := contract.CheckID("runId", req.RunID); err != nil {
		return keeper.StartInput{}, err
	}
	if err := contract.CheckID("threadId", req.ThreadID); err != nil {
		return keeper.StartInput{}, err
	}
	in := keeper.StartInput{RunID: req.RunID, ThreadID: req.ThreadID}
	if req.StartedAt != nil {
		if *req.StartedAt < 0 {
			return in, contract.Invalid("startedAt", "must not be negative")
		}
		in.StartedAt = *req.StartedAt
	}
	s := req.Sandbox
	if s == nil {
		return in, contract.Invalid("sandbox", "required")
	}
	if err := contract.CheckID("sandbox.id", s.ID); err != nil {
		return in, err
	}
	if err := contract.CheckID("sandbox.provider", s.Provider); err != nil {
		return in, err
	}
	in.Sandbox = keeper.Setup{ID: s.ID, Provider: s.Provider}
	if !isNull(s.Workspace) {
		if bytes.TrimSpace(s.Workspace)[0] != '{' {
			return in, contract.Invalid("sandbox.workspace", "must be an object")
		}
		in.Sandbox.Workspace = s.Workspace
	}
	if s.Reuse != nil {
		switch r := keeper.Reuse(*s.Reuse); r {
		case keeper.ReuseThread, keeper.ReuseNone:
			in.Sandbox.Reuse = r
		default:
			return in, contract.Invalid("sandbox.reuse", "must be %q or %q", keeper.ReuseThread, keeper.ReuseNone)
		}
	}
	if s.SnapshotMaxAgeMs != nil {
		if *s.SnapshotMaxAgeMs < 0 {
			return in, contract.Invalid("sandbox.snapshotMaxAgeMs", "must not be negative")
		}
		in.Sandbox.SnapshotMaxAgeMs = *s.SnapshotMaxAgeMs
	}
	if s.DestroyOnCancel != nil {
		in.Sandbox.DestroyOnCancel = *s.DestroyOnCancel
	}
	if s.IdleStopMs != nil {
		in.Sandbox.IdleStopMs = *s.IdleStopMs // checked by the keeper (keeper.MinIdleStop, MaxIdleStop)
	}
	return in, nil
}

func (h *handler) attach(ctx context.Context, c *call) (int, any, error) {
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &wire.Empty{}, true); err != nil {
		return 0, nil, err
	}
	// A live shipper keeps the run; a dead one is replaced at a new epoch
	// (docs/design.md §8.3); the launch deadline's rule applies as to any attach.
	res, err := h.runs.AttachShipping(ctx, c.runID)
	if err != nil {
		return 0, nil, err
	}
	d := res.Driver
	out := wire.AttachResponse{
		Run:             res.Run,
		Sandbox:         wireSandbox(res.Sandbox),
		DriverEpoch:     d.Epoch,
		LastOffset:      d.LastOffset,
		Src:             d.Src,
		CancelRequested: d.CancelRequested,
		LeaseMs:         d.LeaseMs,
		LeaseUntil:      d.LeaseUntil,
		Shipping:        res.Shipping,
	}
	if res.Shipping == agentrun.ShippingHost {
		// Only a caller who drives gets the driver's cursor: beside a shipper at the same
		// epoch it would be a second writer.
		out.Cursor = h.cursors.sign(c.tenant, c.runID, d.Cursor, d.CancelRequested)
	}
	return http.StatusOK, out, nil
}

func (h *handler) getRun(ctx context.Context, c *call) (int, any, error) {
	run, err := h.k.Get(ctx, c.runID)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.RunResponse{Run: run}, nil
}

func (h *handler) snapshot(ctx context.Context, c *call) (int, any, error) {
	var req wire.SnapshotRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	label := ""
	if req.Label != nil {
		if label = *req.Label; utf8.RuneCountInString(label) > maxLabelLen {
			return 0, nil, contract.Invalid("label", "longer than %d characters", maxLabelLen)
		}
	}
	cur, err := h.cursorFor(ctx, c, req.Cursor)
	if err != nil {
		return 0, nil, err
	}
	sb, err := h.k.Snapshot(ctx, c.runID, cur, label)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.SandboxResponse{Sandbox: wireSandbox(sb)}, nil
}

func (h *handler) activeRun(ctx context.Context, c *call) (int, any, error) {
	run, err := h.k.ActiveRun(ctx, c.thread)
	if err != nil {
		return 0, nil, err
	}
	if run != nil {
		c.info.runID = run.RunID
	}
	return http.StatusOK, wire.ActiveRunResponse{Run: run}, nil
}

// cursorBody decodes a body that carries only the driver's cursor and opens the cursor.
func (h *handler) cursorBody(ctx context.Context, c *call) (contract.Cursor, error) {
	var req wire.CursorRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return contract.Cursor{}, err
	}
	return h.cursorFor(ctx, c, req.Cursor)
}

func (h *handler) heartbeat(ctx context.Context, c *call) (int, any, error) {
	cur, err := h.cursorBody(ctx, c)
	if err != nil {
		return 0, nil, err
	}
	res, err := h.k.Heartbeat(ctx, c.runID, cur.Epoch)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.HeartbeatResponse{CancelRequested: res.CancelRequested || c.cancelSeen, LeaseUntil: res.LeaseUntil}, nil
}

func (h *handler) detach(ctx context.Context, c *call) (int, any, error) {
	cur, err := h.cursorBody(ctx, c)
	if err != nil {
		return 0, nil, err
	}
	run, err := h.k.Detach(ctx, c.runID, cur.Epoch)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.RunResponse{Run: run}, nil
}

func (h *handler) cancel(ctx context.Context, c *call) (int, any, error) {
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &wire.Empty{}, true); err != nil {
		return 0, nil, err
	}
	run, err := h.k.Cancel(ctx, c.runID)
	if err != nil {
		return 0, nil, err
	}
	h.cancelShipped(ctx, run)
	return http.StatusAccepted, wire.RunResponse{Run: run}, nil
}

// cancelShipped ends a shipped agent of a run whose cancel was just recorded: the kill goes
// through the provider, since a silent run's shipper asks the API only every third of the
// lease (docs/design.md §13). A failure is logged: the shipper still learns of the cancel
// from its next answer.
func (h *handler) cancelShipped(ctx context.Context, run contract.RunRecord) {
	if run.Status.Terminal() || !h.shipping {
		return
	}
	if err := h.runs.CancelShipped(ctx, run.RunID); err != nil {
		h.log.WarnContext(ctx, "httpapi: cancel: killing the shipped agent failed", "runId", run.RunID, "err", err)
	}
}

func (h *handler) cancelThread(ctx context.Context, c *call) (int, any, error) {
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &wire.Empty{}, true); err != nil {
		return 0, nil, err
	}
	run, err := h.k.CancelThread(ctx, c.thread)
	if err != nil {
		return 0, nil, err
	}
	h.cancelShipped(ctx, run)
	c.info.runID = run.RunID
	return http.StatusAccepted, wire.RunResponse{Run: run}, nil
}

func (h *handler) appendEvents(ctx context.Context, c *call) (int, any, error) {
	var req wire.AppendRequest
	if err := decodeBody(c.w, c.r, MaxEventsBytes, &req, false); err != nil {
		return 0, nil, err
	}
	if len(req.Events) == 0 {
		return 0, nil, contract.Invalid("events", "must hold at least one event")
	}
	events := make([]contract.Event, len(req.Events))
	for i, e := range req.Events {
		if e.Data == nil {
			return 0, nil, contract.Invalid(fmt.Sprintf("events[%d].data", i), "required")
		}
		events[i].Data = e.Data
		if e.Src != nil {
			if *e.Src < 0 {
				return 0, nil, contract.Invalid(fmt.Sprintf("events[%d].src", i), "must not be negative")
			}
			events[i].Src = *e.Src
		}
	}
	if err := contract.CheckEvents(events); err != nil {
		return 0, nil, err
	}
	cur, err := h.cursorFor(ctx, c, req.Cursor)
	if err != nil {
		return 0, nil, err
	}
	res, err := h.k.Append(ctx, c.runID, cur, events)
	if err != nil {
		return 0, nil, err
	}
	// Sticky for the epoch: the marker this append stepped over, or one an earlier answer
	// of this epoch (attach, append) reported, lies behind the cursor from now on.
	cancel := res.CancelRequested || c.cancelSeen
	return http.StatusOK, wire.AppendResponse{
		Cursor:          h.cursors.sign(c.tenant, c.runID, res.Cursor, cancel),
		LastOffset:      res.Last,
		CancelRequested: cancel,
	}, nil
}

func (h *handler) readEvents(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	after, err := queryInt(q, "after", 0, 0, math.MaxInt64)
	if err != nil {
		return 0, nil, err
	}
	limit, err := queryInt(q, "limit", DefaultReadLimit, 1, MaxReadLimit)
	if err != nil {
		return 0, nil, err
	}
	waitMs, err := queryInt(q, "waitMs", 0, 0, MaxWaitMs)
	if err != nil {
		return 0, nil, err
	}
	// The log is keyed by tenant and run id, and only runs of this tenant ever write to it:
	// a page with events (or a close) proves the run is the caller's, in one call (docs/design.md §11:
	// "read from a next: 1"). An empty open page may mean no such run in this tenant —
	// another tenant's run or none — so the run is resolved before answering or waiting,
	// and that is a plain 404.
	res, err := h.k.Read(ctx, c.runID, after, int(limit), 0)
	if err != nil {
		return 0, nil, err
	}
	if len(res.Events) == 0 && !res.Closed {
		if _, err := h.k.Get(ctx, c.runID); err != nil {
			return 0, nil, err
		}
		if waitMs > 0 {
			release, err := h.waiting.acquire(c.tenant)
			if err != nil {
				return 0, nil, err
			}
			defer release()
			// The page just read was empty: Await does not read again at once.
			if res, err = h.k.Await(ctx, c.runID, after, int(limit), time.Duration(waitMs)*time.Millisecond); err != nil {
				return 0, nil, err
			}
		}
	}
	if res.Events == nil {
		res.Events = []contract.Event{}
	}
	return http.StatusOK, wire.ReadResponse{Events: res.Events, Next: res.Next, Closed: res.Closed}, nil
}

func (h *handler) finish(ctx context.Context, c *call) (int, any, error) {
	var req wire.FinishRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	st, err := contract.ParseRunStatus(req.Status)
	if err != nil {
		return 0, nil, err
	}
	if st == contract.StatusRunning {
		return 0, nil, contract.Invalid("status", "must be interrupted, completed, failed or aborted")
	}
	in := keeper.FinishInput{Status: st, Error: req.Error}
	if in.Error != nil && in.Error.Message == "" {
		return 0, nil, contract.Invalid("error.message", "required")
	}
	if !isNull(req.Usage) {
		in.Usage = req.Usage
	}
	cur, err := h.cursorFor(ctx, c, req.Cursor)
	if err != nil {
		return 0, nil, err
	}
	run, err := h.runs.Finish(ctx, c.runID, cur, in)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.RunResponse{Run: run}, nil
}

func (h *handler) agent(ctx context.Context, c *call) (int, any, error) {
	var req wire.AgentRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	switch {
	case strings.TrimSpace(req.Command) == "":
		return 0, nil, contract.Invalid("command", "required")
	case len(req.Command) > wire.MaxCommandBytes:
		return 0, nil, contract.Invalid("command", "longer than %d bytes", wire.MaxCommandBytes)
	case strings.IndexByte(req.Command, 0) >= 0 || !utf8.ValidString(req.Command):
		return 0, nil, contract.Invalid("command", "must be UTF-8 text without NUL")
	case len(req.Env) > wire.MaxEnvVars:
		return 0, nil, contract.Invalid("env", "more than %d variables", wire.MaxEnvVars)
	}
	// Never echo a value: it may be a secret (CheckEnv names only the variable).
	if err := contract.CheckEnv(req.Env); err != nil {
		return 0, nil, err
	}
	cur, err := h.cursorFor(ctx, c, req.Cursor)
	if err != nil {
		return 0, nil, err
	}
	res, err := h.runs.Launch(ctx, agentrun.LaunchInput{RunID: c.runID, At: cur, Command: req.Command, Env: req.Env})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.AgentResponse{Launched: res.Launched, Shipping: res.Shipping}, nil
}

func (h *handler) pump(ctx context.Context, c *call) (int, any, error) {
	var req wire.PumpRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	var wait int64
	if req.WaitMs != nil {
		if wait = *req.WaitMs; wait < 0 || wait > wire.MaxPumpWaitMs {
			return 0, nil, contract.Invalid("waitMs", "must be between 0 and %d", wire.MaxPumpWaitMs)
		}
	}
	cur, err := h.cursorFor(ctx, c, req.Cursor)
	if err != nil {
		return 0, nil, err
	}
	if wait > 0 {
		release, err := h.waiting.acquire(c.tenant)
		if err != nil {
			return 0, nil, err
		}
		defer release()
	}
	res, err := h.runs.Pump(ctx, agentrun.PumpInput{RunID: c.runID, At: cur, Wait: time.Duration(wait) * time.Millisecond})
	if err != nil {
		return 0, nil, err
	}
	cancel := res.CancelRequested || c.cancelSeen // sticky for the epoch, as on append
	out := wire.PumpResponse{
		Cursor:          h.cursors.sign(c.tenant, c.runID, res.Cursor, cancel),
		Appended:        res.Appended,
		LastOffset:      res.Cursor.Next - 1,
		Src:             res.Cursor.Src,
		Exited:          res.Exited,
		CancelRequested: cancel,
	}
	if res.Exited {
		out.ExitCode = &res.ExitCode
	}
	return http.StatusOK, out, nil
}

// cursorFor returns the docs/design.md §2.4 cursor a token carries for this run and tenant, and records in
// c whether the token's epoch has seen a cancel. A token that verifies and names this run
// and tenant was issued for a run of this tenant, so the run exists without a read.
// Anything else first resolves the run in the caller's tenant — an
// unknown or foreign run stays a plain 404 whatever the cursor — and is then 409: a token
// this key cannot verify is stale-cursor (most often signed with another key: a dev server
// restarted with a new random one), a verified token of another run or tenant conflict.
func (h *handler) cursorFor(ctx context.Context, c *call, token string) (contract.Cursor, error) {
	if token == "" {
		return contract.Cursor{}, contract.Invalid("cursor", "required")
	}
	cl, openErr := h.cursors.open(token)
	if openErr == nil && cl.RunID == c.runID && cl.Tenant == c.tenant {
		c.cancelSeen = cl.Cancel
		return cl.cursor(), nil
	}
	if _, err := h.k.Get(ctx, c.runID); err != nil {
		return contract.Cursor{}, err
	}
	if openErr != nil {
		return contract.Cursor{}, errStaleCursor
	}
	return contract.Cursor{}, fmt.Errorf("%w: the cursor was not issued for this run", contract.ErrConflict)
}

// errStaleCursor answers a cursor the service cannot verify. Nothing in the token can be
// trusted, so the detail repeats none of it.
var errStaleCursor = &apiError{status: http.StatusConflict, code: CodeStaleCursor,
	detail: "the cursor cannot be verified: it was signed with another key (the server restarted) or is not a cursor; attach again for a new one"}
