package httpapi

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3filter"
)

// TestSpecDocumentsEveryRoute: api/openapi.yaml has exactly the handler's routes.
func TestSpecDocumentsEveryRoute(t *testing.T) {
	doc, _ := loadSpec(t)
	if doc.OpenAPI != "3.1.0" || !doc.IsOpenAPI31OrLater() {
		t.Fatalf("openapi %q, want 3.1.0", doc.OpenAPI)
	}
	h := Routes()
	documented := 0
	for path, item := range doc.Paths.Map() {
		documented += len(item.Operations())
		for method := range item.Operations() {
			found := false
			for _, r := range h {
				if r.Pattern() == method+" "+path {
					found = true
				}
			}
			if !found {
				t.Errorf("the document has %s %s, the handler does not", method, path)
			}
		}
	}
	for _, r := range h {
		method, path, _ := strings.Cut(r.Pattern(), " ")
		item := doc.Paths.Value(path)
		if item == nil || item.GetOperation(method) == nil {
			t.Errorf("the handler serves %s, the document does not", r.Pattern())
		}
	}
	if documented != len(h) {
		t.Errorf("%d documented operations, %d routes", documented, len(h))
	}
}

// TestSpecCatchesDrift is the negative control of the response checks: the validator the
// handler tests use rejects a response that drifted from the document.
func TestSpecCatchesDrift(t *testing.T) {
	_, router := loadSpec(t)
	r := httptest.NewRequest(http.MethodGet, "/v1/runs/run-1", nil)
	route, params, err := router.FindRoute(r)
	if err != nil {
		t.Fatal(err)
	}
	check := func(status int, ct, body string) error {
		h := http.Header{}
		h.Set("Content-Type", ct)
		h.Set(RequestIDHeader, "rid")
		return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route},
			Status:                 status,
			Header:                 h,
			Body:                   io.NopCloser(bytes.NewReader([]byte(body))),
			Options:                &openapi3filter.Options{IncludeResponseStatus: true},
		})
	}
	good := `{"run":{"runId":"run-1","threadId":"t","status":"running","startedAt":1}}`
	if err := check(200, "application/json", good); err != nil {
		t.Fatalf("a conforming response is rejected: %v", err)
	}
	problem := `{"type":"urn:sandkeep:problem:unknown-run","title":"Unknown run","status":404,"detail":"d","code":"unknown-run","requestId":"rid"}`
	if err := check(404, ProblemContentType, problem); err != nil {
		t.Fatalf("a conforming problem is rejected: %v", err)
	}
	for name, c := range map[string]struct {
		status   int
		ct, body string
	}{
		"extra member":        {200, "application/json", `{"run":{"runId":"run-1","threadId":"t","status":"running","startedAt":1,"tenant":"x"}}`},
		"missing member":      {200, "application/json", `{"run":{"runId":"run-1","threadId":"t","startedAt":1}}`},
		"unknown status":      {200, "application/json", `{"run":{"runId":"run-1","threadId":"t","status":"done","startedAt":1}}`},
		"wrong type":          {200, "application/json", `{"run":{"runId":"run-1","threadId":"t","status":"running","startedAt":"1"}}`},
		"undocumented status": {418, ProblemContentType, problem},
		"unknown code":        {404, ProblemContentType, strings.Replace(problem, `"code":"unknown-run"`, `"code":"nope"`, 1)},
		"problem as json":     {404, "text/plain", problem},
	} {
		if err := check(c.status, c.ct, c.body); err == nil {
			t.Errorf("%s: the validator accepts a drifted response", name)
		}
	}
}

// TestSpecStartResponseTakeoverMembers: lastOffset, src and cancelRequested come together
// (taken-over) or not at all — the document's dependentRequired is enforced.
func TestSpecStartResponseTakeoverMembers(t *testing.T) {
	_, router := loadSpec(t)
	r := httptest.NewRequest(http.MethodPost, "/v1/runs", strings.NewReader("{}"))
	r.Header.Set("Content-Type", "application/json")
	route, params, err := router.FindRoute(r)
	if err != nil {
		t.Fatal(err)
	}
	check := func(extra string) error {
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set(RequestIDHeader, "rid")
		body := `{"run":{"runId":"r","threadId":"t","status":"running","startedAt":1},` +
			`"sandbox":{"key":"k","provider":"p","providerSandboxId":"i"},"outcome":"taken-over",` +
			`"driverEpoch":2,"cursor":"c","leaseMs":60000,"leaseUntil":5` + extra + `}`
		return openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
			RequestValidationInput: &openapi3filter.RequestValidationInput{Request: r, PathParams: params, Route: route},
			Status:                 200,
			Header:                 h,
			Body:                   io.NopCloser(strings.NewReader(body)),
			Options:                &openapi3filter.Options{IncludeResponseStatus: true},
		})
	}
	if err := check(""); err != nil {
		t.Fatalf("start response without take-over members rejected: %v", err)
	}
	if err := check(`,"lastOffset":3,"src":0,"cancelRequested":false`); err != nil {
		t.Fatalf("start response with all take-over members rejected: %v", err)
	}
	if err := check(`,"lastOffset":3`); err == nil {
		t.Fatal("start response with lastOffset alone accepted: dependentRequired is not enforced")
	}
}
