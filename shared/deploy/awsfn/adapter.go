package awsfn

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

// DeadlineMargin is how long before the invocation deadline the handler's context ends,
// so a long-poll or a slow call still answers before Lambda cuts the invocation.
const DeadlineMargin = 500 * time.Millisecond

// API adapts API Gateway HTTP API (payload format 2.0) events to one function's route set
// of the shared handler; safe for concurrent use.
type API struct {
	fn      Function
	h       http.Handler
	auth    Auth
	log     *slog.Logger
	metrics *emf.Recorder
	// routes matches a request to fn's route pattern, for the metrics of an event that
	// names no route: a function URL's (docs/design.md §9) says only "$default".
	routes *http.ServeMux
}

// Auth is how the adapter treats the authorizer's identity.
type Auth struct {
	Mode string // AuthIAM or AuthJWT
	// Trusted (IAM mode): only sessions of these roles may call at all, and so name the
	// tenant in the header; every other IAM principal is refused with 403. Empty trusts
	// no one.
	Trusted TrustedRoles
}

// NewAPIAdapter returns the adapter of function fn over shared, the full docs/design.md §8 handler set
// (httpapi.New); only fn's routes reach it, any other route is a 404. metrics may be nil.
func NewAPIAdapter(fn Function, shared http.Handler, auth Auth, logger *slog.Logger, metrics *emf.Recorder) *API {
	if logger == nil {
		logger = slog.Default()
	}
	routes := http.NewServeMux()
	for _, rt := range Routes(fn) {
		routes.Handle(rt.Pattern(), http.NotFoundHandler())
	}
	return &API{fn: fn, h: RouteFilter(fn, shared, logger), auth: auth, log: logger, metrics: metrics, routes: routes}
}

// Handle serves one API Gateway HTTP API event, or a Lambda function URL's (the same
// payload 2.0 with routeKey "$default" and no authorizer: docs/design.md §9); requests are
// routed by method and path alone, never by the event's routeKey. It never returns an
// error (every failure is an HTTP answer), so the front never sees a bare 502 from us.
func (a *API) Handle(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-DeadlineMargin))
		defer cancel()
	}
	r, err := a.request(ctx, ev)
	if err != nil {
		// A malformed event (e.g. bad base64 from a direct invoke): the caller's mistake.
		rec := newRecorder()
		writeNotServed(rec, requestIDOf(ctx, ev), http.StatusBadRequest, err.Error())
		return a.response(ev, nil, rec), nil
	}
	rec := newRecorder()
	if caller, ok := a.untrusted(ev); ok {
		id := requestIDOf(ctx, ev)
		a.log.LogAttrs(ctx, slog.LevelWarn, "request",
			slog.String("requestId", id), slog.String("method", r.Method), slog.String("route", ev.RouteKey),
			slog.Int("status", http.StatusForbidden), slog.String("code", httpapi.CodeUntrustedPrincipal),
			slog.String("principal", caller), slog.String("function", string(a.fn)))
		writeProblem(rec, id, http.StatusForbidden, httpapi.CodeUntrustedPrincipal, "Caller not trusted to name tenants",
			"the IAM principal "+strconv.Quote(caller)+" is not a session of a role trusted to name tenants (template parameter TrustedRoleArns)")
		return a.response(ev, r, rec), nil
	}
	a.h.ServeHTTP(rec, r)
	return a.response(ev, r, rec), nil
}

// untrusted reports, in IAM mode, a caller the IAM authorizer let through that is not a
// session of a trusted role (with its ARN, "" when the event names none). A request
// without the IAM identity is not refused here: it names no tenant (401 from the handler).
func (a *API) untrusted(ev events.APIGatewayV2HTTPRequest) (callerARN string, refused bool) {
	if a.auth.Mode != AuthIAM || ev.RequestContext.Authorizer == nil || ev.RequestContext.Authorizer.IAM == nil {
		return "", false
	}
	arn := ev.RequestContext.Authorizer.IAM.UserARN
	return arn, !a.auth.Trusted.Trusts(arn)
}

// request builds the net/http request of ev: method, raw path and query, headers and
// cookies, the (base64) body, the request id of API Gateway, and the authorizer's
// identity (JWT claims into the context; the tenant header only when IAM authorized it).
func (a *API) request(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (*http.Request, error) {
	method := ev.RequestContext.HTTP.Method
	path := ev.RawPath
	if path == "" {
		path = ev.RequestContext.HTTP.Path
	}
	if method == "" || !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("the event names no method or path (method %q, path %q)", method, path)
	}
	query := ev.RawQueryString
	if query == "" && len(ev.QueryStringParameters) > 0 {
		q := url.Values{}
		for k, v := range ev.QueryStringParameters {
			// API Gateway joins repeated parameters with commas.
			q[k] = strings.Split(v, ",")
		}
		query = q.Encode()
	}
	target := path
	if query != "" {
		target += "?" + query
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, fmt.Errorf("bad path or query: %w", err)
	}
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return nil, fmt.Errorf("the body is marked base64 but does not decode: %w", err)
		}
	}
	if su := StageURL(ev.RequestContext); su != "" {
		ctx = agentrun.WithShipURL(ctx, su)
	}
	r, err := http.NewRequestWithContext(a.identity(ctx, ev), method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	r.RequestURI = u.RequestURI()
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body = http.NoBody
	}
	for k, v := range ev.Headers {
		r.Header.Set(k, v)
	}
	if len(ev.Cookies) > 0 {
		r.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	r.Host = r.Header.Get("Host")
	if r.Host == "" {
		r.Host = ev.RequestContext.DomainName
	}
	r.RemoteAddr = ev.RequestContext.HTTP.SourceIP
	// The request id is API Gateway's (also in its access log), never the caller's.
	r.Header.Set(httpapi.RequestIDHeader, requestIDOf(ctx, ev))
	// Only a request IAM authorized may name its tenant in the header (the calling service
	// is trusted); under JWT the tenant comes from the verified claims only.
	if a.auth.Mode != AuthIAM || ev.RequestContext.Authorizer == nil || ev.RequestContext.Authorizer.IAM == nil {
		r.Header.Del(httpapi.TenantHeader)
	}
	for k, v := range ev.PathParameters {
		r.SetPathValue(k, v)
	}
	return r, nil
}

// StageURL is the API's base URL as the request reached it, from API Gateway's request
// context alone: https:// + domainName, + "/" + stage unless the stage is $default (whose
// URL has no path prefix). The client's Host header never enters it: a caller cannot point
// a sandbox's shipper, and so its ship token, at an address of its choosing. A domain
// name that is not a plain host name (a port allowed) gives "": the host pumps. A custom
// domain mapped under a base path needs the PublicUrl parameter.
func StageURL(rc events.APIGatewayV2HTTPRequestContext) string {
	d := rc.DomainName
	if d == "" || len(d) > 253+6 {
		return ""
	}
	for _, c := range d {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == ':') {
			return ""
		}
	}
	if strings.HasPrefix(d, ".") || strings.HasPrefix(d, "-") || strings.HasPrefix(d, ":") {
		return ""
	}
	u := "https://" + d
	if st := rc.Stage; st != "" && st != "$default" {
		if url.PathEscape(st) != st {
			return ""
		}
		u += "/" + st
	}
	return u
}

// identity puts the verified JWT claims (JWT mode only) into ctx.
func (a *API) identity(ctx context.Context, ev events.APIGatewayV2HTTPRequest) context.Context {
	if a.auth.Mode == AuthJWT && ev.RequestContext.Authorizer != nil && ev.RequestContext.Authorizer.JWT != nil {
		return httpapi.WithJWTClaims(ctx, ev.RequestContext.Authorizer.JWT.Claims)
	}
	return ctx
}

// response turns the recorded answer into the API Gateway response and records metrics
// (r is nil for an event that made no request): Requests by route and status, at once
// but for a ship route's routine answer (httpapi.QuietShip), which is summed.
func (a *API) response(ev events.APIGatewayV2HTTPRequest, r *http.Request, rec *recorder) events.APIGatewayV2HTTPResponse {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	out := events.APIGatewayV2HTTPResponse{StatusCode: status, Headers: map[string]string{}}
	for k, vs := range rec.header {
		if k == "Set-Cookie" {
			out.Cookies = append(out.Cookies, vs...)
			continue
		}
		out.Headers[k] = strings.Join(vs, ",")
	}
	b := rec.body.Bytes()
	if textual(rec.header.Get("Content-Type")) && utf8.Valid(b) {
		out.Body = string(b)
	} else {
		out.Body = base64.StdEncoding.EncodeToString(b)
		out.IsBase64Encoded = true
	}
	route := ev.RouteKey
	if (route == "" || route == "$default") && r != nil {
		_, route = a.routes.Handler(r) // "" when fn serves no such route
	}
	if route == "" || route == "$default" {
		route = "unmatched"
	}
	if httpapi.QuietShip(route, status) {
		// A shipper's routine answers, hundreds a run: one sum a minute (docs/design.md §9).
		a.metrics.Sum("Requests", 1, "Route", route, "Status", strconv.Itoa(status))
	} else {
		a.metrics.Count("Requests", 1, "Route", route, "Status", strconv.Itoa(status))
	}
	if status == http.StatusConflict && problemCode(rec) == httpapi.CodeSuperseded {
		a.metrics.Count("Superseded", 1)
	}
	return out
}

// problemCode returns the code of a problem+json answer ("" otherwise).
func problemCode(rec *recorder) string {
	if rec.header.Get("Content-Type") != httpapi.ProblemContentType {
		return ""
	}
	var p httpapi.Problem
	if json.Unmarshal(rec.body.Bytes(), &p) != nil {
		return ""
	}
	return p.Code
}

// textual reports whether a body of content type ct travels as text (else base64).
func textual(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return strings.HasPrefix(mt, "text/") || mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// requestIDOf returns API Gateway's request id made safe for httpapi's id charset
// ([A-Za-z0-9._:-]: its base64-like ids lose "=" and map "+" "/" to "-" "."), else the
// Lambda request id.
func requestIDOf(ctx context.Context, ev events.APIGatewayV2HTTPRequest) string {
	id := strings.Map(func(r rune) rune {
		switch {
		case r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == ':', r == '-':
			return r
		case r == '+':
			return '-'
		case r == '/':
			return '.'
		}
		return -1
	}, ev.RequestContext.RequestID)
	if id == "" || len(id) > 128 {
		if lc, ok := lambdacontext.FromContext(ctx); ok {
			id = lc.AwsRequestID
		}
	}
	return id
}

// RouteFilter returns a handler passing only fn's routes (docs/design.md §8) to shared; every other
// request is a 404 problem (code invalid), so a misrouted request can never run another
// function's operation with this function's permissions.
func RouteFilter(fn Function, shared http.Handler, logger *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range Routes(fn) {
		mux.Handle(rt.Pattern(), shared)
	}
	refuse := func(w http.ResponseWriter, r *http.Request, detail string) {
		id := r.Header.Get(httpapi.RequestIDHeader)
		logger.LogAttrs(r.Context(), slog.LevelWarn, "request",
			slog.String("requestId", id), slog.String("method", r.Method),
			slog.String("route", "unmatched"), slog.Int("status", http.StatusNotFound),
			slog.String("code", httpapi.CodeInvalid), slog.String("function", string(fn)))
		writeNotServed(w, id, http.StatusNotFound, detail)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		refuse(w, r, fmt.Sprintf("no such route on the %s function", fn))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpapi.CanonicalPath(r.URL.Path) {
			refuse(w, r, httpapi.NonCanonicalDetail) // the mux would redirect it (bare 307)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// writeNotServed answers a request no operation saw, in httpapi's problem shape.
func writeNotServed(w http.ResponseWriter, id string, status int, detail string) {
	writeProblem(w, id, status, httpapi.CodeInvalid, "Invalid request", detail)
}

// writeProblem writes a problem+json answer of the adapter's own.
func writeProblem(w http.ResponseWriter, id string, status int, code, title, detail string) {
	w.Header().Set("Content-Type", httpapi.ProblemContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set(httpapi.RequestIDHeader, id)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(httpapi.Problem{
		Type: "urn:sandkeep:problem:" + code, Title: title,
		Status: status, Detail: detail, Code: code, RequestID: id,
	})
}

// recorder is the in-memory ResponseWriter one invocation answers into.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// Flush is a no-op: the whole answer is returned at the end of the invocation.
func (r *recorder) Flush() {}
