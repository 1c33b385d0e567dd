package lambdaevent

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/aws/aws-lambda-go/events"
)

// Handler is a function's handler of HTTP events: awsfn's API in process, or an invoke
// of the function under the Runtime Interface Emulator.
type Handler func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)

// Gateway serves HTTP as a front of one function does: each request becomes the event its
// route receives, the function's answer becomes the HTTP answer. Its routes have no
// authorizer (the ship routes), and a function URL has none without IAM auth.
type Gateway struct {
	Handler Handler
	// Route gives a request's route key and whether the function serves it (404
	// otherwise, as API Gateway answers a request no route matches); nil is a function
	// URL: every request, route key DefaultRoute.
	Route func(method, path string) (key string, ok bool)
	// Stage is the stage's name; "" is DefaultRoute.
	Stage string

	ids atomic.Int64
}

// ServeHTTP builds the event (repeated headers joined with commas, the body base64, the
// Host as the domain name) and writes the function's answer.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := DefaultRoute
	if g.Route != nil {
		var ok bool
		if key, ok = g.Route(r.Method, r.URL.Path); !ok {
			http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
			return
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := FromHTTP(r, body)
	req.RouteKey, req.Stage = key, g.Stage
	req.RequestID = fmt.Sprintf("gw%08d=", g.ids.Add(1))
	resp, err := g.Handler(r.Context(), req.Event())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out, err := ResponseBody(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for k, v := range resp.Headers {
		w.Header().Set(k, v)
	}
	for _, c := range resp.Cookies {
		w.Header().Add("Set-Cookie", c)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
}

// FromHTTP is r with body as a front receives it, without route, stage or request id.
func FromHTTP(r *http.Request, body []byte) Request {
	req := Request{Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Body: body,
		Header: make(map[string]string, len(r.Header)+1), DomainName: r.Host}
	for k, vs := range r.Header {
		req.Header[strings.ToLower(k)] = strings.Join(vs, ",")
	}
	req.Header["host"] = r.Host
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		req.SourceIP = ip
	}
	return req
}

// ResponseBody is the answer's body, decoded when the function sent it base64-encoded.
func ResponseBody(resp events.APIGatewayV2HTTPResponse) ([]byte, error) {
	if !resp.IsBase64Encoded {
		return []byte(resp.Body), nil
	}
	b, err := base64.StdEncoding.DecodeString(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("the function's body is marked base64 but does not decode: %w", err)
	}
	return b, nil
}

// Routes matches requests to patterns ("METHOD /path/{param}") as API Gateway matches
// routes: the method and each literal segment equal, a {param} segment any one segment.
func Routes(patterns ...string) func(method, path string) (string, bool) {
	return func(method, path string) (string, bool) {
		parts := strings.Split(strings.Trim(path, "/"), "/")
		for _, p := range patterns {
			m, rp, _ := strings.Cut(p, " ")
			segs := strings.Split(strings.Trim(rp, "/"), "/")
			if m != method || len(segs) != len(parts) {
				continue
			}
			ok := true
			for i, s := range segs {
				if !strings.HasPrefix(s, "{") && s != parts[i] {
					ok = false
					break
				}
			}
			if ok {
				return p, true
			}
		}
		return "", false
	}
}
