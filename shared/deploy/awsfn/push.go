package awsfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
)

// Settings of the deployed push (docs/design.md §8.1).
const (
	// EnvPushEndpoint is the WebSocket API's management endpoint,
	// https://{api}.execute-api.{region}.amazonaws.com/{stage}: required by the push
	// function; set on every function that stores events, which then pushes what it stored
	// (empty: no push, as in a JWT deployment).
	EnvPushEndpoint = "SANDKEEP_PUSH_ENDPOINT"
	// EnvPushURL is the WebSocket API's wss:// URL, told to the resolve function of a JWT
	// deployment: it issues push tickets for it (POST /v1/push/ticket); empty: that route
	// is 501 (an IAM deployment's $connect is signed, not ticketed).
	EnvPushURL = "SANDKEEP_PUSH_URL"
	// EnvPushMaxConnections and EnvPushMaxSubscriptions are the push function's bounds
	// (defaults wire.DefaultMaxConnections per tenant, wire.DefaultMaxSubscriptions per
	// connection).
	EnvPushMaxConnections   = "SANDKEEP_PUSH_MAX_CONNECTIONS"
	EnvPushMaxSubscriptions = "SANDKEEP_PUSH_MAX_SUBSCRIPTIONS"
)

// loadPush reads the push settings of any function.
func (cfg *Config) loadPush(get func(string) string) error {
	cfg.PushEndpoint = get(EnvPushEndpoint)
	if cfg.PushEndpoint != "" {
		if err := push.CheckEndpoint(cfg.PushEndpoint); err != nil {
			return configErr("%s: %v", EnvPushEndpoint, err)
		}
	}
	if u := get(EnvPushURL); u != "" {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "ws" && pu.Scheme != "wss") || pu.Host == "" || pu.RawQuery != "" || pu.Fragment != "" {
			return configErr("%s %q is not an absolute ws(s) URL", EnvPushURL, u)
		}
		cfg.PushURL = u
	}
	if cfg.Function != Push {
		return nil
	}
	if cfg.PushEndpoint == "" {
		return configErr("%s is not set (the WebSocket API's management endpoint)", EnvPushEndpoint)
	}
	n, err := integer(get, EnvPushMaxConnections, wire.DefaultMaxConnections, 1)
	if err != nil {
		return err
	}
	cfg.PushMaxConnections = int(n)
	if n, err = integer(get, EnvPushMaxSubscriptions, wire.DefaultMaxSubscriptions, 1); err != nil {
		return err
	}
	cfg.PushMaxSubscriptions = int(n)
	return nil
}

// deliverer returns the push deliverer of a function that stores events (nil without an
// endpoint: nothing is pushed).
func (d Deps) deliverer(cfg Config, backend *dynamostore.Store) (*push.Deliverer, error) {
	if cfg.PushEndpoint == "" {
		return nil, nil
	}
	if d.PushPoster == nil {
		return nil, fmt.Errorf("awsfn: %s is set but no push poster was built", EnvPushEndpoint)
	}
	return push.NewDeliverer(push.Config{Store: backend, Log: backend.Log(), Poster: d.PushPoster, Logger: d.Logger}), nil
}

// logPush is the keeper's Push of a deliverer (a nil deliverer is no hook at all).
func logPush(dl *push.Deliverer) keeper.LogPush {
	if dl == nil {
		return nil
	}
	return dl
}

// PushAPI adapts the API Gateway WebSocket API's events to the push routes (shared/api/push):
// $connect authenticates the upgrade as the HTTP API does and opens the connection,
// $disconnect removes it, every other route is a client's message, answered by posting
// to the connection. Safe for concurrent use.
type PushAPI struct {
	routes  *push.Routes
	auth    Auth
	key     []byte           // the cursor key: JWT mode verifies push tickets with it
	now     func() time.Time // a ticket's expiry is checked against it
	log     *slog.Logger
	metrics *emf.Recorder
}

// NewPush builds the push function of cfg.
func NewPush(cfg Config, d Deps) (*PushAPI, error) {
	if cfg.Function != Push {
		return nil, fmt.Errorf("awsfn: %s is not the push function", cfg.Function)
	}
	d, err := d.withDefaults()
	if err != nil {
		return nil, err
	}
	backend := NewBackend(cfg, d.DynamoDB, d.Now)
	dl, err := d.deliverer(cfg, backend)
	if err != nil {
		return nil, err
	}
	k, err := keeper.New(keeper.Config{Backend: backend, DriverLease: cfg.DriverLease, Now: d.Now, Logger: d.Logger})
	if err != nil {
		return nil, fmt.Errorf("awsfn: %w", err)
	}
	r := push.NewRoutes(push.RoutesConfig{Keeper: k, Store: backend, Deliverer: dl, Logger: d.Logger,
		MaxConnections: cfg.PushMaxConnections, MaxSubscriptions: cfg.PushMaxSubscriptions})
	return &PushAPI{routes: r, auth: Auth{Mode: cfg.AuthMode, Trusted: cfg.TrustedRoles}, key: cfg.CursorKey, now: d.Now,
		log: d.Logger, metrics: d.Metrics}, nil
}

// Handle serves one WebSocket API event. It never returns an error: $connect's refusal
// is its status and problem (the upgrade fails with it); a message's answers were posted.
func (p *PushAPI) Handle(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-DeadlineMargin))
		defer cancel()
	}
	rc := ev.RequestContext
	id := requestIDOf(ctx, events.APIGatewayV2HTTPRequest{RequestContext: events.APIGatewayV2HTTPRequestContext{RequestID: rc.RequestID}})
	route := rc.RouteKey
	var err error
	switch {
	case rc.ConnectionID == "":
		err = httpapi.PushRefusal(http.StatusBadRequest, httpapi.CodeInvalid, "the event names no connection")
	case route == "$connect":
		var tenant string
		if tenant, err = p.tenant(ev); err == nil {
			err = p.routes.Connect(ctx, tenant, rc.ConnectionID)
		}
	case route == "$disconnect":
		err = p.routes.Disconnect(ctx, rc.ConnectionID)
	default:
		if err = p.routes.Message(ctx, rc.ConnectionID, id, []byte(ev.Body)); err != nil {
			err = nil // answered to the client and logged by the routes; the route itself served
		}
	}
	m, infra := httpapi.PushError("", err, id)
	status := http.StatusOK
	out := events.APIGatewayProxyResponse{StatusCode: status}
	if err != nil {
		status = m.Problem.Status
		b, _ := json.Marshal(m.Problem)
		out = events.APIGatewayProxyResponse{StatusCode: status, Body: string(b),
			Headers: map[string]string{"Content-Type": httpapi.ProblemContentType, httpapi.RequestIDHeader: id}}
	}
	if route == "$connect" && err == nil && offers(ev.Headers, wire.PushSubprotocol) {
		// A client offering the subprotocol fails the handshake unless it is selected.
		out.Headers = map[string]string{"Sec-WebSocket-Protocol": wire.PushSubprotocol}
	}
	level := slog.LevelInfo
	if infra {
		level = slog.LevelError
	}
	attrs := []slog.Attr{slog.String("requestId", id), slog.String("route", route), slog.Int("status", status), slog.String("function", string(Push))}
	if err != nil {
		attrs = append(attrs, slog.String("code", m.Problem.Code), slog.String("error", err.Error()))
	}
	p.log.LogAttrs(ctx, level, "push", attrs...)
	p.metrics.Count("Requests", 1, "Route", route, "Status", strconv.Itoa(status))
	return out, nil
}

// errNoTenant refuses an upgrade that names no tenant.
var errNoTenant = httpapi.PushRefusal(http.StatusUnauthorized, httpapi.CodeUnauthenticated, "the upgrade names no tenant")

// tenant is the $connect's tenant. IAM mode (API Gateway verified the SigV4 signature on
// the upgrade): a session of a trusted role names it in X-Sandkeep-Tenant, or the tenant
// query parameter, exactly as on the HTTP API; any other principal is refused. JWT mode
// ($connect unauthorized at API Gateway, which has no JWT authorizer for WebSocket APIs):
// the push ticket in the ticket query parameter, issued by the JWT-authorized HTTP API
// (POST /v1/push/ticket), names it; no tenant header or parameter is taken beside it.
func (p *PushAPI) tenant(ev events.APIGatewayWebsocketProxyRequest) (string, error) {
	raw := ""
	for k, v := range ev.Headers {
		if strings.EqualFold(k, httpapi.TenantHeader) {
			raw = v
		}
	}
	if raw == "" {
		raw = ev.QueryStringParameters["tenant"]
	}
	if p.auth.Mode == AuthJWT {
		return p.ticketTenant(ev.QueryStringParameters[wire.PushTicketQuery], raw)
	}
	caller := ev.RequestContext.Identity.UserArn
	if !p.auth.Trusted.Trusts(caller) {
		return "", httpapi.PushRefusal(http.StatusForbidden, httpapi.CodeUntrustedPrincipal,
			"the IAM principal "+strconv.Quote(caller)+" is not a session of a role trusted to name tenants (template parameter TrustedRoleArns)")
	}
	if raw == "" {
		return "", errNoTenant
	}
	return httpapi.MapTenant(raw), nil
}

// ticketTenant verifies a JWT deployment's push ticket: 401 invalid-token for none or one
// this service did not mint as a ticket (a ship token, a cursor, another key's), 401
// token-expired past its minute, 403 token-scope when the upgrade also names a tenant (the
// ticket's is the only one taken).
func (p *PushAPI) ticketTenant(ticket, named string) (string, error) {
	if ticket == "" {
		return "", httpapi.PushRefusal(http.StatusUnauthorized, httpapi.CodeInvalidToken,
			"a push connection here takes a push ticket (?"+wire.PushTicketQuery+"=) from POST "+wire.PushTicketPath)
	}
	tenant, err := shiptoken.VerifyPushTicket(p.key, ticket, p.now())
	switch {
	case errors.Is(err, shiptoken.ErrExpired):
		return "", httpapi.PushRefusal(http.StatusUnauthorized, httpapi.CodeTokenExpired, "the push ticket expired; ask POST "+wire.PushTicketPath+" for another")
	case err != nil:
		return "", httpapi.PushRefusal(http.StatusUnauthorized, httpapi.CodeInvalidToken, "the push ticket was not issued by this service")
	case named != "":
		return "", httpapi.PushRefusal(http.StatusForbidden, httpapi.CodeTokenScope, "the push ticket names the tenant; the upgrade names none")
	}
	return tenant, nil
}

// MainPush runs the push function.
func MainPush() {
	start(Push, func(cfg Config, d Deps) (any, error) {
		api, err := NewPush(cfg, d)
		if err != nil {
			return nil, err
		}
		return api.Handle, nil
	})
}

// offers reports whether the upgrade's Sec-WebSocket-Protocol lists proto.
func offers(h map[string]string, proto string) bool {
	for k, v := range h {
		if strings.EqualFold(k, "Sec-WebSocket-Protocol") {
			for _, p := range strings.Split(v, ",") {
				if strings.TrimSpace(p) == proto {
					return true
				}
			}
		}
	}
	return false
}
