// Package httpapi is sandkeep's HTTP API (docs/design.md §8) as one net/http handler set, shared by
// the dev server and the Lambda functions: authentication to a tenant, strict input
// validation, signed cursors, problem+json errors, a request id and one JSON log line per
// request (a ship route's routine answer at DEBUG: QuietShip). The operations themselves
// live in shared/ops/keeper; the routes that reach into a run's sandbox (attach, cancel,
// agent, pump, finish, ship) go through shared/ops/agentrun's Service, which runs the same
// pump step as a host's driver loop.
package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// RequestIDHeader carries the request id on every response (and is reused from the
// request when it is sane).
const RequestIDHeader = "X-Request-Id"

// statusClientClosed is logged (never sent) when the client disconnected first, as nginx
// does.
const statusClientClosed = 499

// Config configures the handler set.
type Config struct {
	Keeper *keeper.Keeper
	// Auth names the caller's tenant (DevAuth, IAMAuth or JWTAuth).
	Auth Authenticator
	// CursorKey signs cursors (HMAC-SHA256); at least MinCursorKeyLen bytes. Every replica
	// serving one table must share it.
	CursorKey []byte
	// Sweeps serves GET /v1/reaper/sweeps (the dev server); nil: that route is 501.
	Sweeps *Sweeps
	// JournalDir is the run journal's directory inside sandboxes ("" = the provider's).
	JournalDir string
	// HostProviders names providers whose commands run on the serving host itself
	// (local-process): the agent route refuses them with 501. The Lambdas set it.
	HostProviders []string
	// AllowHost, when set, admits only requests whose Host it accepts or names PublicURL's
	// host (ship routes: any Host); any other is 403 forbidden-host before routing (the dev
	// server: LoopbackHost). nil admits any Host.
	AllowHost func(host string) bool
	// Push serves the push protocol at GET /v1/subscribe (the dev server); nil: that path
	// is 404, and clients fall back to long polls.
	Push *PushConfig
	// PushTicketURL is the push endpoint whose $connect takes push tickets (a JWT
	// deployment's WebSocket API, docs/design.md §8.1): POST /v1/push/ticket issues them
	// for it. "": that route is 501.
	PushTicketURL string
	// MaxWaiting bounds each tenant's concurrently waiting requests on this server (long
	// polls past an empty first page, pumps with waitMs); one more is 429
	// too-many-waiting. 0 = DefaultMaxWaiting.
	MaxWaiting int
	// PublicURL is the API's base URL as a sandbox reaches it (docs/design.md §6): the
	// agent route starts a shipper beside each agent (its token minted under CursorKey) and
	// the cancel routes kill shipped agents through the provider. "": every run is pumped
	// by its host.
	PublicURL string
	// RequestPublicURL: with PublicURL empty, each request's own API address is the
	// sandboxes' (agentrun.WithShipURL, which the Lambda adapter sets from API Gateway's
	// request context, docs/design.md §9); agents may then be shipped, so the cancel routes
	// kill shipped agents through the provider.
	RequestPublicURL bool
	// ShipLimits bounds each run's ship requests on this server (zero: the defaults).
	ShipLimits ShipLimits
	Logger     *slog.Logger     // default slog.Default()
	Now        func() time.Time // default time.Now; measures latency
}

// New returns the handler serving every route of docs/design.md §8. It panics on a missing Keeper or
// Auth or a short CursorKey: a programming error caught at start.
func New(cfg Config) http.Handler {
	if cfg.Keeper == nil || cfg.Auth == nil {
		panic("httpapi.New: Keeper and Auth are required")
	}
	if len(cfg.CursorKey) < MinCursorKeyLen {
		panic(fmt.Sprintf("httpapi.New: CursorKey must be at least %d bytes", MinCursorKeyLen))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var ship *agentrun.ShipConfig
	if cfg.PublicURL != "" || cfg.RequestPublicURL {
		ship = &agentrun.ShipConfig{URL: cfg.PublicURL, Key: slices.Clone(cfg.CursorKey)}
	}
	runs, err := agentrun.NewService(agentrun.ServiceConfig{Keeper: cfg.Keeper, Dir: cfg.JournalDir,
		HostProviders: cfg.HostProviders, Logger: cfg.Logger, Ship: ship})
	if err != nil {
		panic(fmt.Sprintf("httpapi.New: %v", err))
	}
	publicHost := ""
	if u, err := url.Parse(cfg.PublicURL); err == nil {
		publicHost = u.Host
	}
	h := &handler{
		publicHost: publicHost,
		k:          cfg.Keeper,
		runs:       runs,
		shipping:   ship != nil,
		auth:       cfg.Auth,
		host:       cfg.AllowHost,
		cursors:    cursorCodec{key: slices.Clone(cfg.CursorKey)},
		log:        cfg.Logger,
		now:        cfg.Now,
		sweeps:     cfg.Sweeps,
		waiting:    newWaiters(cfg.MaxWaiting),
		mux:        http.NewServeMux(),
		shipRate:   newShipRate(cfg.ShipLimits),
		step:       agentrun.Step,

		pushTicketURL: cfg.PushTicketURL,
	}
	if cfg.Push != nil {
		h.push = newPusher(*cfg.Push, cfg.Keeper)
	}
	h.routes()
	return h
}

type handler struct {
	k    *keeper.Keeper
	runs *agentrun.Service // agent, pump and finish
	// shipping: agents are launched with shippers, so a cancel kills a shipped agent.
	shipping bool
	auth     Authenticator
	host     func(string) bool // nil: any Host
	// publicHost is PublicURL's host, served beside host's (servesHost).
	publicHost string
	cursors    cursorCodec
	log        *slog.Logger
	now        func() time.Time
	sweeps     *Sweeps
	push       *pusher // nil: no push endpoint
	waiting    *waiters
	mux        *http.ServeMux
	// shipRate bounds each run's ship requests; step is the pump's step the ship route
	// stores through (agentrun.Step; a test's seam).
	shipRate *shipRate
	step     func(context.Context, agentrun.StepInput) (agentrun.StepResult, error)
	// pushTicketURL: Config.PushTicketURL.
	pushTicketURL string
}

// reqInfo is what the request's log line reports; the route wrapper and the operation
// fill it in.
type reqInfo struct {
	id       string
	route    string
	tenant   string
	runID    string
	threadID string
	outcome  string
	code     string
	err      error // infrastructure error or panic, logged only
	// clientGone: the client disconnected before the answer; logged with status 499.
	clientGone bool
}

type infoKey struct{}

func infoFrom(ctx context.Context) *reqInfo {
	if i, ok := ctx.Value(infoKey{}).(*reqInfo); ok {
		return i
	}
	return &reqInfo{}
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// ServeHTTP stamps the request id, recovers panics (500, logged: a bug of ours) and logs
// one line per request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := h.now()
	info := &reqInfo{id: requestID(r)}
	w.Header().Set(RequestIDHeader, info.id)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		p := recover()
		if p != nil && p != http.ErrAbortHandler {
			info.code = CodeInternal
			info.err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
			if sw.status == 0 {
				writeProblem(sw, info.id, http.StatusInternalServerError, CodeInternal, detailOf(nil, CodeInternal, true))
			}
		}
		status := sw.status
		if info.clientGone && status == 0 {
			status = statusClientClosed
		}
		h.logRequest(r, info, status, h.now().Sub(start))
		if p == http.ErrAbortHandler {
			panic(p)
		}
	}()
	r = r.WithContext(context.WithValue(r.Context(), infoKey{}, info))
	if h.shipElsewhere(r) {
		// The sandbox's one credential grants its own run's ship routes and nothing else.
		h.fail(sw, info, &apiError{http.StatusForbidden, CodeTokenScope, "a ship token is accepted only on its run's ship routes"})
		return
	}
	if !h.servesHost(r) {
		// A DNS-rebinding page reaches a loopback server under its own name; the browser
		// then sends that name as Host (and as Origin, which therefore proves nothing).
		h.fail(sw, info, &apiError{http.StatusForbidden, CodeForbiddenHost, "the Host header must name this server's loopback address (127.0.0.1, localhost or [::1] with its port)"})
		return
	}
	preflight, err := h.checkOrigin(sw, r)
	if err != nil {
		h.fail(sw, info, err)
		return
	}
	if preflight {
		info.route = "preflight"
		sw.WriteHeader(http.StatusNoContent)
		return
	}
	if !CanonicalPath(r.URL.Path) {
		h.fail(sw, info, &apiError{http.StatusNotFound, CodeInvalid, NonCanonicalDetail})
		return
	}
	if err := CheckQuery(r.URL.RawQuery); err != nil {
		h.fail(sw, info, err)
		return
	}
	h.mux.ServeHTTP(sw, r)
}

// servesHost is the one Host rule (docs/design.md §8, §8.2): with AllowHost set (the dev
// server), a request is served under a Host AllowHost admits or the host of PublicURL (the
// address the operator gave sandboxes, such as a forwarder's); a ship route under any Host,
// since a sandbox reaches the server by its public address and a page cannot use the route
// without the run's ship token.
func (h *handler) servesHost(r *http.Request) bool {
	return h.host == nil || h.host(r.Host) || h.publicHost != "" && strings.EqualFold(r.Host, h.publicHost) || h.shipRoute(r)
}

// NonCanonicalDetail is the problem detail of a request for a non-canonical path.
const NonCanonicalDetail = "path is not in canonical form (no empty, . or .. segments, no trailing slash)"

// CanonicalPath reports whether p is a path the API routes: non-empty and its own
// path.Clean. A net/http ServeMux answers any other (/v1//runs, /v1/runs/../x) with a bare
// 307 redirect; every layer in front of a mux refuses it first, with problem+json.
func CanonicalPath(p string) bool {
	return p != "" && path.Clean(p) == p
}

// CheckQuery refuses a query string url.ParseQuery cannot read whole (a malformed
// %-escape, a ';' separator): URL.Query drops such a pair silently, so ?limit=%zz would
// be served with the default limit. The error wraps contract.ErrInvalid.
func CheckQuery(rawQuery string) error {
	if _, err := url.ParseQuery(rawQuery); err != nil {
		return contract.Invalid("query", "not a valid URL query (%v)", err)
	}
	return nil
}

// logRequest writes the request's line: at ERROR for a 5xx, at DEBUG for a ship route's
// routine answer (QuietShip) that was not slow, else at INFO.
func (h *handler) logRequest(r *http.Request, info *reqInfo, status int, latency time.Duration) {
	level := slog.LevelInfo
	switch {
	case status >= 500:
		level = slog.LevelError
	case QuietShip(info.route, status) && latency < slowShip:
		level = slog.LevelDebug
	}
	if !h.log.Enabled(r.Context(), level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("requestId", info.id),
		slog.String("method", r.Method),
		slog.String("route", info.route),
		slog.Int("status", status),
		slog.Float64("latencyMs", float64(latency.Microseconds())/1000),
	}
	for _, kv := range [][2]string{
		{"tenant", info.tenant}, {"runId", info.runID}, {"threadId", info.threadID},
		{"code", info.code}, {"outcome", info.outcome},
	} {
		if kv[1] != "" {
			attrs = append(attrs, slog.String(kv[0], kv[1]))
		}
	}
	if info.err != nil {
		attrs = append(attrs, slog.String("error", info.err.Error()))
	}
	h.log.LogAttrs(r.Context(), level, "request", attrs...)
}

// requestID reuses a sane incoming X-Request-Id (1–128 of [A-Za-z0-9._:-]) or makes one.
func requestID(r *http.Request) string {
	if id := r.Header.Get(RequestIDHeader); id != "" && len(id) <= 128 && contract.CheckID("id", id) == nil {
		return id
	}
	return strings.ToLower(rand.Text())
}

// call is one authenticated request as an operation sees it.
type call struct {
	w      http.ResponseWriter
	r      *http.Request
	info   *reqInfo
	tenant string
	runID  string // validated path value ("" on thread routes)
	thread string // validated path value ("" on run routes)
	// cancelSeen: the request's cursor says its epoch has seen a cancel (cursorFor).
	cancelSeen bool
	// ship: a ship route's verified token (ship.go).
	ship *shiptoken.Claims
}

// op runs an operation under the caller's tenant and returns the success status and body.
type op func(ctx context.Context, c *call) (status int, body any, err error)

// handle registers pattern: it resolves the tenant, validates the path ids, runs fn and
// answers JSON or problem+json.
func (h *handler) handle(pattern string, fn op) {
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		info := infoFrom(r.Context())
		info.route = r.Pattern
		c := &call{w: w, r: r, info: info}
		raw := h.auth.Tenant(r)
		if raw == "" {
			h.fail(w, info, &apiError{http.StatusUnauthorized, CodeUnauthenticated, "the request names no tenant"})
			return
		}
		c.tenant = MapTenant(raw)
		info.tenant = c.tenant
		if v := r.PathValue("runId"); strings.Contains(pattern, "{runId}") {
			if err := contract.CheckID("runId", v); err != nil {
				h.fail(w, info, err)
				return
			}
			c.runID, info.runID = v, v
		}
		if v := r.PathValue("threadId"); strings.Contains(pattern, "{threadId}") {
			if err := contract.CheckID("threadId", v); err != nil {
				h.fail(w, info, err)
				return
			}
			c.thread, info.threadID = v, v
		}
		status, body, err := fn(contract.WithTenant(r.Context(), c.tenant), c)
		h.respond(c, status, body, err)
	})
}

// respond answers an operation's outcome: JSON, or problem+json for err.
func (h *handler) respond(c *call, status int, body any, err error) {
	if err != nil && c.r.Context().Err() != nil && errors.Is(err, context.Canceled) {
		// The client went away (a long poll abandoned): nobody reads an answer, and it
		// is not an infrastructure failure.
		c.info.code = "client-closed"
		c.info.clientGone = true
		return
	}
	if err != nil {
		h.fail(c.w, c.info, err)
		return
	}
	writeJSON(c.w, status, body)
}

// fail answers err as problem+json and records it for the log line.
func (h *handler) fail(w http.ResponseWriter, info *reqInfo, err error) {
	status, code, infra := classify(err)
	info.code = code
	if infra {
		info.err = err
	}
	writeProblem(w, info.id, status, code, detailOf(err, code, infra))
}

// writeJSON answers body as JSON without HTML escaping: an API answer is never embedded
// in HTML (and is served nosniff), and escaping turns each '<' of an event into six bytes.
func writeJSON(w http.ResponseWriter, status int, body any) {
	if status == http.StatusNoContent { // the store routes' writes: no body at all
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(status)
		return
	}
	b, err := encodeJSON(body)
	if err != nil {
		// Our own response types always marshal; reaching this is a bug (recovered → 500).
		panic(fmt.Sprintf("httpapi: marshal response: %v", err))
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// encodeJSON is v's JSON (HTML left unescaped) and a newline.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return buf.Bytes(), err
}

// notFound answers paths no route serves (404) and known paths with another method (405,
// with Allow); both are the client's mistake, code invalid.
func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	info := infoFrom(r.Context())
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		r2 := r.Clone(r.Context())
		r2.Method = m
		if _, pat := h.mux.Handler(r2); pat != "" && pat != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		h.fail(w, info, &apiError{http.StatusMethodNotAllowed, CodeInvalid, fmt.Sprintf("method %s not allowed here", r.Method)})
		return
	}
	h.fail(w, info, &apiError{http.StatusNotFound, CodeInvalid, "no such route"})
}
