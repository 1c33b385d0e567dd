package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

const specPath = "../../../api/openapi.yaml"

var spec struct {
	once   sync.Once
	doc    *openapi3.T
	router routers.Router
	err    error
}

// loadSpec loads api/openapi.yaml once, validates it as a document and builds a router.
func loadSpec(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	spec.once.Do(func() {
		l := openapi3.NewLoader()
		doc, err := l.LoadFromFile(specPath)
		if err != nil {
			spec.err = err
			return
		}
		if err = doc.Validate(l.Context); err != nil {
			spec.err = err
			return
		}
		// Match any host: the handler is served by httptest, not the documented server.
		doc.Servers = nil
		spec.doc = doc
		spec.router, spec.err = legacy.NewRouter(doc)
	})
	if spec.err != nil {
		t.Fatalf("api/openapi.yaml: %v", spec.err)
	}
	return spec.doc, spec.router
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct{ syncbuf.Buffer }

// lines returns the JSON log lines.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		out = append(out, m)
	}
	return out
}

// env is one API under test: the handler, its backend and its log.
type env struct {
	t       *testing.T
	h       http.Handler
	backend contract.Backend
	logs    *syncBuffer
	auth    Authenticator
}

type backendFactory func(t *testing.T) contract.Backend

// backends are the stores every flow test runs on: memstore always, dynamostore when the
// local DynamoDB of `make test` is up (dynamotest skips otherwise).
func backends() map[string]backendFactory {
	return map[string]backendFactory{
		"memstore": func(t *testing.T) contract.Backend { return memstore.New() },
		"dynamostore": func(t *testing.T) contract.Backend {
			client := dynamotest.Client(t)
			return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
		},
	}
}

// forEachBackend runs fn as a subtest per backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, nb backendFactory)) {
	for name, nb := range backends() {
		t.Run(name, func(t *testing.T) { fn(t, nb) })
	}
}

func newEnv(t *testing.T, auth Authenticator, b contract.Backend) *env {
	t.Helper()
	return newEnvWith(t, auth, b, localprocess.New(t.TempDir()))
}

// newEnvWith is newEnv with the given providers.
func newEnvWith(t *testing.T, auth Authenticator, b contract.Backend, providers ...contract.Provider) *env {
	t.Helper()
	loadSpec(t)
	if b == nil {
		b = memstore.New()
	}
	k, err := keeper.New(keeper.Config{
		Backend:   b,
		Providers: providers,
	})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	h := New(Config{
		Keeper:    k,
		Auth:      auth,
		CursorKey: []byte("test cursor key, 32 bytes long!!"),
		Logger:    slog.New(slog.NewJSONHandler(logs, nil)),
	})
	return &env{t: t, h: h, backend: b, logs: logs, auth: auth}
}

// resp is a recorded response.
type resp struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r resp) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("response body is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

func (r resp) problem(t *testing.T) Problem {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != ProblemContentType {
		t.Fatalf("status %d content type %q, want %s: %s", r.Status, ct, ProblemContentType, r.Body)
	}
	var p Problem
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("problem body: %v", err)
	}
	if p.Status != r.Status || p.Code == "" || p.RequestID != r.Header.Get(RequestIDHeader) {
		t.Fatalf("problem %+v does not match status %d / request id %q", p, r.Status, r.Header.Get(RequestIDHeader))
	}
	if leak := internalIn(p.Detail); leak != "" {
		t.Errorf("status %d: detail %q names an internal (%s)", r.Status, p.Detail, leak)
	}
	return p
}

// wantProblem asserts status and code.
func (r resp) wantProblem(t *testing.T, status int, code string) Problem {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d (%s): %s", r.Status, status, code, r.Body)
	}
	p := r.problem(t)
	if p.Code != code {
		t.Fatalf("code %q, want %q: %s", p.Code, code, r.Body)
	}
	return p
}

func (r resp) wantStatus(t *testing.T, status int) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	return r.json(t)
}

// req describes one request.
type req struct {
	method, path string
	tenant       string // X-Sandkeep-Tenant ("" = none)
	body         any    // string = raw bytes; nil = no body; else JSON-encoded
	headers      map[string]string
	claims       map[string]string
	// specSays: "valid" (default) — the document must accept the request; "invalid" — it
	// must reject it too; "silent" — a rule the document cannot express (body size).
	specSays string
}

// do sends r through the handler, validating the request and the response against
// api/openapi.yaml.
func (e *env) do(r req) resp {
	e.t.Helper()
	var raw []byte
	switch b := r.body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			e.t.Fatal(err)
		}
	}
	build := func() *http.Request {
		var body io.Reader
		if raw != nil {
			body = bytes.NewReader(raw)
		}
		hr := httptest.NewRequest(r.method, r.path, body)
		if raw != nil {
			hr.Header.Set("Content-Type", "application/json")
		}
		if r.tenant != "" {
			hr.Header.Set(TenantHeader, r.tenant)
		}
		for k, v := range r.headers {
			hr.Header.Set(k, v)
		}
		if r.claims != nil {
			hr = hr.WithContext(WithJWTClaims(hr.Context(), r.claims))
		}
		return hr
	}
	_, router := loadSpec(e.t)
	vreq := build()
	route, params, routeErr := router.FindRoute(vreq)
	var rvi *openapi3filter.RequestValidationInput
	if routeErr == nil {
		opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
		rvi = &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts}
		verr := openapi3filter.ValidateRequest(context.Background(), rvi)
		switch r.specSays {
		case "", "valid":
			if verr != nil {
				e.t.Fatalf("%s %s: the document rejects a request the test sends as valid: %v", r.method, r.path, verr)
			}
		case "invalid":
			if verr == nil {
				e.t.Fatalf("%s %s: the document accepts a request the handler must refuse: %s", r.method, r.path, raw)
			}
		}
	} else if r.specSays != "invalid" && r.specSays != "silent" {
		e.t.Fatalf("%s %s: no route in the document: %v", r.method, r.path, routeErr)
	}

	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, build())
	out := resp{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
	if out.Header.Get(RequestIDHeader) == "" {
		e.t.Fatalf("%s %s: response without %s", r.method, r.path, RequestIDHeader)
	}
	if out.Status >= 400 {
		out.problem(e.t)
	}
	if out.Status >= 500 && out.Status != http.StatusNotImplemented && out.Header.Get("Retry-After") == "" && out.Status != 500 {
		e.t.Fatalf("%s %s: %d without Retry-After", r.method, r.path, out.Status)
	}
	if rvi != nil {
		rvi.Request = build()
		err := openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
			RequestValidationInput: rvi,
			Status:                 out.Status,
			Header:                 out.Header,
			Body:                   io.NopCloser(bytes.NewReader(out.Body)),
			Options:                &openapi3filter.Options{IncludeResponseStatus: true},
		})
		if err != nil {
			e.t.Fatalf("%s %s: response %d does not match the document: %v\n%s", r.method, r.path, out.Status, err, out.Body)
		}
	}
	return out
}

// tctx is a context scoped to tenant, for reading the backend directly.
func tctx(t *testing.T, tenant string) context.Context {
	return contract.WithTenant(t.Context(), tenant)
}

// internalWords are what a problem's detail never says: package names, Go and backend
// internals. A detail names the field and the rule, or the refusal, in the API's terms.
var internalWords = []string{
	"keeper", "dynamostore", "memstore", "httpapi", "lease:", "driver:", "journal:",
	"reaper:", "awsfn", "dynamodb", "DynamoDB", "ConditionalCheck", "Transaction", "json:",
	"reflect", "encoding/", "runtime", "goroutine", "panic", "nil pointer", "struct", "map[",
	"[]", "*", "localprocess", "daytona:", "e2b:", "errgroup",
}

// internalIn returns the first internal word detail contains ("" = none).
func internalIn(detail string) string {
	for _, w := range internalWords {
		if strings.Contains(detail, w) {
			return w
		}
	}
	return ""
}
