// Package lambdaevent holds the events a Lambda function receives from its HTTP fronts,
// as those fronts build them from a request: API Gateway's HTTP API and a function URL
// (payload format 2.0), and API Gateway's WebSocket API. Gateway is such a front in
// process: it serves HTTP by invoking a handler of those events (in process or under the
// Runtime Interface Emulator), for the benchmark and the deployment's tests.
// shared/deploy/awsfn adapts the events to the handlers; this package is the other side
// and imports none of it.
package lambdaevent

import (
	"encoding/base64"
	"encoding/json"
	"strings"

	"github.com/aws/aws-lambda-go/events"
)

// DefaultRoute is the route key and the stage name of an event without a route or a
// named stage: every function URL event, and API Gateway's $default stage.
const DefaultRoute = "$default"

// Request is an HTTP request as a front hands it to a function.
type Request struct {
	Method string
	Path   string // raw (escaped) path
	Query  string // raw query string
	// RouteKey is the API Gateway route the request matched ("POST /v1/runs/{runId}/ship");
	// a function URL has no routes, its events carry DefaultRoute.
	RouteKey string
	// Header values by name; the event carries the names lower-cased, as both fronts do.
	Header map[string]string
	// Body is sent base64-encoded (IsBase64Encoded), as a front sends a body it does not
	// know to be text; none when empty.
	Body []byte
	// RequestID is the front's id of the request; Stage "" is DefaultRoute.
	RequestID string
	Stage     string
	// DomainName is the host name the caller reached (the adapter's stage URL).
	DomainName string
	SourceIP   string
	// Authorizer is what the route's authorizer verified (IAM, JWT); nil for a route
	// without one and for a function URL with no IAM auth.
	Authorizer *events.APIGatewayV2HTTPRequestContextAuthorizerDescription
}

// JSON returns r with v as its JSON body and content type; a nil v leaves r bodiless.
func (r Request) JSON(v any) Request {
	if v == nil {
		return r
	}
	b, err := json.Marshal(v)
	if err != nil {
		panic("lambdaevent: a JSON body that does not marshal: " + err.Error()) // a caller's literal
	}
	r.Body = b
	h := make(map[string]string, len(r.Header)+1)
	for k, v := range r.Header {
		h[k] = v
	}
	h["content-type"] = "application/json"
	r.Header = h
	return r
}

// Event is r as the payload 2.0 event its front sends.
func (r Request) Event() events.APIGatewayV2HTTPRequest {
	stage := r.Stage
	if stage == "" {
		stage = DefaultRoute
	}
	ev := events.APIGatewayV2HTTPRequest{
		Version: "2.0", RouteKey: r.RouteKey, RawPath: r.Path, RawQueryString: r.Query,
		Headers: make(map[string]string, len(r.Header)),
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			RouteKey: r.RouteKey, RequestID: r.RequestID, Stage: stage, DomainName: r.DomainName,
			HTTP:       events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: r.Method, Path: r.Path, SourceIP: r.SourceIP},
			Authorizer: r.Authorizer,
		},
	}
	for k, v := range r.Header {
		ev.Headers[strings.ToLower(k)] = v
	}
	if len(r.Body) > 0 {
		ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString(r.Body), true
	}
	return ev
}

// FunctionURL is r as a function URL's event: no route (DefaultRoute), the default stage.
func (r Request) FunctionURL() events.APIGatewayV2HTTPRequest {
	r.RouteKey, r.Stage = DefaultRoute, DefaultRoute
	return r.Event()
}

// IAM is the authorizer of a route with IAM auth: the caller's signing identity.
func IAM(accountID, userARN string) *events.APIGatewayV2HTTPRequestContextAuthorizerDescription {
	return &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
		IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{AccountID: accountID, UserARN: userARN}}
}

// JWT is the authorizer of a route behind a JWT authorizer: the verified claims.
func JWT(claims map[string]string) *events.APIGatewayV2HTTPRequestContextAuthorizerDescription {
	return &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
		JWT: &events.APIGatewayV2HTTPRequestContextAuthorizerJWTDescription{Claims: claims}}
}

// WebSocket is a WebSocket API event as API Gateway sends it to the route's function.
type WebSocket struct {
	Route  string // "$connect", "$disconnect" or a message's route
	ConnID string
	Body   string
	// Header and Query as sent on the upgrade, $connect's only (header names keep their
	// case); Event leaves them out of any other route's event.
	Header    map[string]string
	Query     map[string]string
	RequestID string
	Stage     string
	// DomainName is the host the client reached (the API's execute-api host).
	DomainName string
	// UserARN is the IAM identity of a $connect with IAM auth; "" for none.
	UserARN string
}

// Event is w as the event its route's function receives. Only $connect carries the
// upgrade's headers, query and the caller's IAM identity: API Gateway hands a message
// (eventType MESSAGE) its body and request context alone (route, connection, direction
// IN, message and request ids, stage, domain), and $disconnect none of the client's
// headers, so a function takes a message's tenant from what its $connect stored, never
// from a header.
func (w WebSocket) Event() events.APIGatewayWebsocketProxyRequest {
	kind := "MESSAGE"
	switch w.Route {
	case "$connect":
		kind = "CONNECT"
	case "$disconnect":
		kind = "DISCONNECT"
	}
	ev := events.APIGatewayWebsocketProxyRequest{Body: w.Body,
		RequestContext: events.APIGatewayWebsocketProxyRequestContext{RouteKey: w.Route, EventType: kind, MessageDirection: "IN",
			ConnectionID: w.ConnID, RequestID: w.RequestID, Stage: w.Stage, DomainName: w.DomainName}}
	if kind == "MESSAGE" {
		ev.RequestContext.MessageID = "m-" + w.RequestID
	}
	if kind != "CONNECT" {
		return ev
	}
	ev.RequestContext.Identity = events.APIGatewayRequestIdentity{UserArn: w.UserARN}
	ev.Headers = make(map[string]string, len(w.Header))
	for k, v := range w.Header {
		ev.Headers[k] = v
	}
	if len(w.Query) > 0 {
		ev.QueryStringParameters = make(map[string]string, len(w.Query))
		for k, v := range w.Query {
			ev.QueryStringParameters[k] = v
		}
	}
	return ev
}
