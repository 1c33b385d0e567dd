package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

// The ship routes (docs/design.md §8.2): a run's shipper, inside its sandbox, sends the
// journal's raw bytes by position; the server turns them into events with the pump's own
// step (agentrun.Step over journal.Bytes) and appends them fenced at the token's epoch, so
// exactly-once rests on the log's Src alignment and fencing (docs/design.md §2.4, §6).

// Ship bounds.
const (
	// DefaultShipRate and DefaultShipBurst bound each run's ship requests on one server
	// (per second, and the burst); DefaultShipByteRate and DefaultShipByteBurst its bytes.
	// A shipper lingers 20–50 ms before a batch, so a chatty agent costs at most about 20
	// requests a second; a flood past these gets 429 rate-limited and waits.
	DefaultShipRate      = 20
	DefaultShipBurst     = 40
	DefaultShipByteRate  = 2 << 20
	DefaultShipByteBurst = 4 * wire.MaxShipBytes
	// maxShipBuckets bounds the rate table; a full table is dropped whole (it only
	// throttles).
	maxShipBuckets = 4096
)

// ShipLimits is each run's ship rate on one server; zero members take the defaults.
type ShipLimits struct {
	Rate      float64 // requests per second
	Burst     float64
	ByteRate  float64 // body bytes per second
	ByteBurst float64
}

func (l ShipLimits) withDefaults() ShipLimits {
	if l.Rate <= 0 {
		l.Rate = DefaultShipRate
	}
	if l.Burst <= 0 {
		l.Burst = DefaultShipBurst
	}
	if l.ByteRate <= 0 {
		l.ByteRate = DefaultShipByteRate
	}
	if l.ByteBurst < wire.MaxShipBytes {
		l.ByteBurst = DefaultShipByteBurst
	}
	return l
}

// Ship reports whether the route is a ship route: its one credential is a run's ship token
// (in a deployment it has no authorizer), and a ship token is refused anywhere else.
func (r Route) Ship() bool {
	switch r.Path {
	case wire.ShipProbePath, "/v1/runs/{runId}/ship", "/v1/runs/{runId}/ship/end":
		return true
	}
	return false
}

// shipRoutes are the ship rows of the route table; the Ship function serves them and
// nothing else (docs/design.md §8.2, §9). The bytes come from the sandbox, not through the
// provider's API; only the end calls the provider: it settles a one-run sandbox, which
// goes with its run (keeper.SettleEnded).
func shipRoutes() []route {
	return []route{
		{Route{"GET", wire.ShipProbePath, fnShip, false}, (*handler).shipProbe},
		{Route{"POST", "/v1/runs/{runId}/ship", fnShip, false}, (*handler).ship},
		{Route{"POST", "/v1/runs/{runId}/ship/end", fnShip, true}, (*handler).shipEnd},
	}
}

// shipLifetime is a ship token's lifetime.
func (h *handler) shipLifetime() time.Duration { return agentrun.ShipTokenLeases * h.k.DriverLease() }

// mintShip returns the ship token of runID of tenant (the store tenant) at cur's epoch,
// carrying cur and cancel as hints, expiring ShipTokenLeases driver leases from now: the
// agent route hands it to the run's shipper (with ShipFrom(cur) as its first position).
func (h *handler) mintShip(tenant, runID string, cur contract.Cursor, cancel bool) (string, time.Time) {
	exp := h.now().Add(h.shipLifetime()).Truncate(time.Millisecond)
	return h.shipToken(tenant, runID, cur, cancel, exp), exp
}

func (h *handler) shipToken(tenant, runID string, cur contract.Cursor, cancel bool, exp time.Time) string {
	return agentrun.ShipToken(h.cursors.key, tenant, runID, cur, cancel, exp)
}

// bearerShip returns the ship token of r's Authorization header ("Bearer <token>"), and
// whether the header holds one (by its shape; nothing is verified).
func bearerShip(r *http.Request) (string, bool) {
	for _, v := range r.Header.Values("Authorization") {
		scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
		if ok && strings.EqualFold(scheme, "Bearer") && shiptoken.Looks(strings.TrimSpace(tok)) {
			return strings.TrimSpace(tok), true
		}
	}
	return "", false
}

// shipElsewhere reports a request that carries a ship token to a route that is not a ship
// route: refused (403 token-scope) before anything runs, whatever else it carries.
func (h *handler) shipElsewhere(r *http.Request) bool {
	if _, ok := bearerShip(r); !ok {
		return false
	}
	return !h.shipRoute(r)
}

// shipRoute reports whether r is for a ship route.
func (h *handler) shipRoute(r *http.Request) bool {
	_, pattern := h.mux.Handler(r)
	return shipPattern(pattern)
}

// shipPattern reports whether pattern ("METHOD /path", a route's key) is a ship route's.
func shipPattern(pattern string) bool {
	method, path, _ := strings.Cut(pattern, " ")
	return (Route{Method: method, Path: path}).Ship()
}

// QuietShip reports whether an answer of the route pattern (its "METHOD /path" key) with
// status is a ship route's routine one, below 400: a shipper sends one request a batch,
// hundreds in a run that its log records anyway, so such an answer, when not slow
// (slowShip), is logged at DEBUG, not INFO, and the Lambda adapter sums its Requests
// metric per minute (docs/design.md §9). Every refusal and failure is logged and counted
// one by one.
func QuietShip(pattern string, status int) bool {
	return status > 0 && status < 400 && shipPattern(pattern)
}

// slowShip is the latency from which a ship route's routine answer is logged at INFO: a
// batch is stored and pushed in tens of milliseconds (docs/bench.md), so one past a second
// tells of a slow table, provider or post.
const slowShip = time.Second

// shipClaims verifies the request's ship token: its only credential.
func (h *handler) shipClaims(r *http.Request) (shiptoken.Claims, error) {
	if len(r.Header.Values(TenantHeader)) > 0 {
		return shiptoken.Claims{}, &apiError{http.StatusUnauthorized, CodeInvalidToken, "a ship route takes only its ship token (Authorization: Bearer), no tenant header"}
	}
	vs := r.Header.Values("Authorization")
	tok, ok := bearerShip(r)
	if !ok || len(vs) != 1 {
		return shiptoken.Claims{}, &apiError{http.StatusUnauthorized, CodeInvalidToken, "a ship route needs exactly one Authorization: Bearer <ship token>"}
	}
	cl, err := shiptoken.Verify(h.cursors.key, tok, h.now())
	switch {
	case errors.Is(err, shiptoken.ErrExpired):
		return cl, &apiError{http.StatusUnauthorized, CodeTokenExpired, "the ship token expired"}
	case err != nil:
		return cl, &apiError{http.StatusUnauthorized, CodeInvalidToken, "the ship token was not issued by this service"}
	}
	return cl, nil
}

// handleShip registers a ship route: the token (none for the probe) names the tenant and
// the run, never a header.
func (h *handler) handleShip(pattern string, fn op, probe bool) {
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		info := infoFrom(r.Context())
		info.route = r.Pattern
		c := &call{w: w, r: r, info: info}
		ctx := r.Context()
		if !probe {
			cl, err := h.shipClaims(r)
			if err != nil {
				h.fail(w, info, err)
				return
			}
			runID := r.PathValue("runId")
			if err := contract.CheckID("runId", runID); err != nil {
				h.fail(w, info, err)
				return
			}
			c.runID, info.runID = runID, runID
			if cl.RunID != runID {
				h.fail(w, info, &apiError{http.StatusForbidden, CodeTokenScope, "the ship token is for another run"})
				return
			}
			c.tenant, info.tenant, c.ship = cl.Tenant, cl.Tenant, &cl
			ctx = contract.WithTenant(ctx, cl.Tenant)
		}
		status, body, err := fn(ctx, c)
		h.respond(c, status, body, err)
	})
}

func (h *handler) shipProbe(_ context.Context, c *call) (int, any, error) {
	if c.r.ContentLength > 0 {
		return 0, nil, contract.Invalid("body", "the probe takes none")
	}
	return http.StatusNoContent, nil, nil
}

// shipBody reads a ship route's raw body, at most limit bytes.
func shipBody(c *call, limit int64) ([]byte, error) {
	data, err := io.ReadAll(http.MaxBytesReader(c.w, c.r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, contract.Invalid("body", "larger than %d bytes", tooBig.Limit)
		}
		return nil, contract.Invalid("body", "unreadable: %v", err)
	}
	return data, nil
}

// ShipFrom is the journal position a shipper sends from when the log stores up to cur.Src:
// one byte before it, so the bytes show whether that position starts a line (a long line's
// piece may end there).
func ShipFrom(cur contract.Cursor) int64 { return max(cur.Src-1, 0) }

// ship stores the journal lines of the body (bytes from position src) that lie at or past
// the log's stored position: bytes before it are skipped, a src past it is ship-gap. It
// appends at the cursor the token carries, as a pump appends at its cursor: a stale one (an
// answer was lost) meets its own batch (stored once) or another (the step fences again and
// reads on from the position really stored), and a superseded epoch stores nothing.
func (h *handler) ship(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	src, err := queryInt(q, "src", -1, 0, math.MaxInt64)
	if err == nil && src < 0 {
		err = contract.Invalid("src", "required: the journal position of the body's first byte")
	}
	if err != nil {
		return 0, nil, err
	}
	body, err := shipBody(c, wire.MaxShipBytes)
	if err != nil {
		return 0, nil, err
	}
	if err := h.shipRate.take(c.tenant, c.runID, len(body), h.now()); err != nil {
		return 0, nil, err
	}
	cl := *c.ship
	at := contract.Cursor{Epoch: cl.Epoch, Next: cl.Next, Src: cl.Src}
	cancel := cl.Cancel
	if at.Next < 1 {
		// A token without a cursor: the fence answers where the log stands for its epoch.
		fence, err := h.k.Fence(ctx, c.runID, cl.Epoch)
		if err != nil {
			return 0, nil, h.shipRefusal(c, err, 0)
		}
		at, cancel = fence.Cursor, cancel || fence.CancelRequested
	}
	source := journal.Bytes{Start: src, Data: body}
	if len(body) == 0 {
		source = journal.Bytes{} // a heartbeat: no bytes anywhere, whatever src says
	}
	res, err := h.step(ctx, agentrun.StepInput{Log: h.k, Source: source, RunID: c.runID, At: at})
	if err != nil {
		return 0, nil, h.shipRefusal(c, err, res.Cursor.Src)
	}
	c.info.outcome = strconv.Itoa(res.Appended)
	cancel = cancel || res.CancelRequested
	exp := cl.Expires
	if now := h.now(); !res.Exited && !now.Before(exp.Add(-h.shipLifetime()+agentrun.ShipRenewAfter(h.k.DriverLease()))) {
		// The token's expiry moves only with a renewed lease, so its age is the time since
		// this driver's lease was last renewed: renew both every half lease at most, one
		// fenced write per half lease however chatty the run.
		hb, err := h.k.Heartbeat(ctx, c.runID, cl.Epoch)
		switch {
		case errors.Is(err, contract.ErrSuperseded) || errors.Is(err, contract.ErrTerminalRun) || errors.Is(err, contract.ErrUnknownRun):
			return 0, nil, h.shipRefusal(c, err, res.Cursor.Src)
		case err != nil:
			// The lease has slack for two misses (a quiet shipper beats every quarter
			// lease); the next request beats again.
			h.log.WarnContext(ctx, "ship: heartbeat failed", "runId", c.runID, "err", err)
		default:
			cancel = cancel || hb.CancelRequested
			exp = now.Add(h.shipLifetime()).Truncate(time.Millisecond)
		}
	}
	state := wire.ShipRunning
	switch {
	case res.Exited:
		state = wire.ShipExited
	case cancel:
		state = wire.ShipCancel
	}
	out := wire.ShipResponse{Next: ShipFrom(res.Cursor), State: state,
		Token: h.shipToken(c.tenant, c.runID, res.Cursor, cancel, exp), ExpiresAt: exp.UnixMilli()}
	hd := c.w.Header()
	hd.Set(wire.ShipNextHeader, strconv.FormatInt(out.Next, 10))
	hd.Set(wire.ShipStateHeader, out.State)
	hd.Set(wire.ShipTokenHeader, out.Token)
	return http.StatusOK, out, nil
}

// shipRefusal answers a ship route's refusal in the ship's terms: a superseded epoch is
// the token's scope (403: it grants nothing past a takeover's fence), a closed log or an
// ended run terminal-run, bytes that start past the stored position ship-gap naming where
// to send from (stored).
func (h *handler) shipRefusal(c *call, err error, stored int64) error {
	switch {
	case errors.Is(err, journal.ErrNotHeld):
		next := ShipFrom(contract.Cursor{Src: stored})
		c.w.Header().Set(wire.ShipNextHeader, strconv.FormatInt(next, 10))
		return &apiError{http.StatusConflict, CodeShipGap, fmt.Sprintf("the bytes start past the position stored; send from %d", next)}
	case errors.Is(err, contract.ErrSuperseded):
		return &apiError{http.StatusForbidden, CodeTokenScope, "the ship token's epoch was superseded by a takeover"}
	case errors.Is(err, contract.ErrLogClosed), errors.Is(err, contract.ErrTerminalRun):
		return &apiError{http.StatusGone, CodeTerminalRun, "the run has ended"}
	}
	return err
}

// shipEnd ends the run from its agent's exit code as a drive's finish does: completed (0),
// failed exit-<n> with the stderr tail the body carries, aborted when a cancel was
// requested; then the log is closed. A retry after the end landed answers the same.
func (h *handler) shipEnd(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	code, err := queryInt(q, "code", math.MinInt64, math.MinInt32, math.MaxInt32)
	if err == nil && code == math.MinInt64 {
		err = contract.Invalid("code", "required: the agent's exit code")
	}
	if err != nil {
		return 0, nil, err
	}
	tail, err := shipBody(c, wire.MaxShipEndBytes)
	if err != nil {
		return 0, nil, err
	}
	if err := h.shipRate.take(c.tenant, c.runID, len(tail), h.now()); err != nil {
		return 0, nil, err
	}
	cl := *c.ship
	rec, err := h.k.Get(ctx, c.runID)
	if err != nil {
		return 0, nil, err
	}
	// Finish is fenced by the epoch and idempotent at it: a retry whose first attempt
	// landed (its answer lost) closes the log again and answers the run as it ended.
	at := contract.Cursor{Epoch: cl.Epoch, Next: cl.Next, Src: cl.Src}
	if at.Next < 1 && !rec.Status.Terminal() {
		fence, err := h.k.Fence(ctx, c.runID, cl.Epoch)
		if err != nil {
			return 0, nil, h.shipRefusal(c, err, 0)
		}
		at = fence.Cursor
	}
	in := agentrun.ExitInput(int(code), tail, cl.Cancel || rec.Cancelled())
	rec, err = h.k.Finish(ctx, c.runID, at, in)
	if err != nil {
		return 0, nil, h.shipRefusal(c, err, 0)
	}
	h.runs.Settle(ctx, rec) // the shipper has ended its agent: a one-run sandbox goes now
	c.info.outcome = string(rec.Status)
	return http.StatusOK, wire.ShipEndResponse{State: wire.ShipEnded, Status: string(rec.Status)}, nil
}

// shipRate is each run's token buckets (requests and bytes) on this server.
type shipRate struct {
	lim     ShipLimits
	mu      sync.Mutex
	buckets map[runRef]*shipBucket
}

type runRef struct{ tenant, runID string }

type shipBucket struct {
	reqs, bytes float64
	at          time.Time
}

func newShipRate(l ShipLimits) *shipRate {
	return &shipRate{lim: l.withDefaults(), buckets: map[runRef]*shipBucket{}}
}

// take charges one request of n body bytes to the run, or refuses it (429 rate-limited)
// and charges nothing.
func (s *shipRate) take(tenant, runID string, n int, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref := runRef{tenant, runID}
	b, ok := s.buckets[ref]
	if !ok {
		if len(s.buckets) >= maxShipBuckets {
			clear(s.buckets)
		}
		b = &shipBucket{reqs: s.lim.Burst, bytes: s.lim.ByteBurst, at: now}
		s.buckets[ref] = b
	}
	if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.reqs = min(s.lim.Burst, b.reqs+dt*s.lim.Rate)
		b.bytes = min(s.lim.ByteBurst, b.bytes+dt*s.lim.ByteRate)
		b.at = now
	}
	if b.reqs < 1 || b.bytes < float64(n) {
		return &apiError{http.StatusTooManyRequests, CodeRateLimited, "the run's ship rate is spent; retry after the Retry-After delay"}
	}
	b.reqs--
	b.bytes -= float64(n)
	return nil
}
