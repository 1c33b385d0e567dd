package daytona_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sandkeep/sandkeep/shared/testkit/published"
)

// The published Daytona descriptions are read from files shared/testkit/published names
// (`make test` sets them from ../shared/vendor).

// docKind says which requests a description covers.
type docKind int

const (
	kindSubset  docKind = iota // management (after /api) and toolbox (/toolbox/{id}/...)
	kindAPI                    // management only, paths after /api
	kindToolbox                // toolbox only, paths after /toolbox/{id}
)

// vdoc is one loaded description.
type vdoc struct {
	name    string
	kind    docKind
	version string
	router  routers.Router
	strict  bool // undocumented statuses fail (the subset documents every answer)
}

var docs struct {
	once sync.Once
	list []vdoc
	errs []error
	used []string
}

// loadDocs loads the subset (required) and the published descriptions (when available),
// once per test binary.
func loadDocs(t *testing.T) []vdoc {
	t.Helper()
	docs.once.Do(func() {
		add := func(name string, kind docKind, data []byte, strict, validate bool) {
			l := openapi3.NewLoader()
			doc, err := l.LoadFromData(data)
			if err == nil && validate {
				err = doc.Validate(l.Context)
			}
			if err != nil {
				docs.errs = append(docs.errs, fmt.Errorf("%s: %w", name, err))
				return
			}
			doc.Servers = nil // served by httptest on any host
			var opts []openapi3.ValidationOption
			if !validate {
				opts = append(opts, openapi3.DisableExamplesValidation())
			}
			r, err := legacy.NewRouter(doc, opts...)
			if err != nil {
				docs.errs = append(docs.errs, fmt.Errorf("%s: router: %w", name, err))
				return
			}
			docs.list = append(docs.list, vdoc{name: name, kind: kind, version: doc.Info.Version, router: r, strict: strict})
			docs.used = append(docs.used, fmt.Sprintf("%s (info.version %s)", name, doc.Info.Version))
		}
		subset, err := os.ReadFile(filepath.Join("testdata", "daytona-subset.yaml"))
		if err != nil {
			docs.errs = append(docs.errs, err)
			return
		}
		add("testdata/daytona-subset.yaml", kindSubset, subset, true, true)
		for _, d := range []struct {
			env, name string
			kind      docKind
		}{{published.DaytonaOpenAPI, "published main API", kindAPI}, {published.DaytonaToolboxOpenAPI, "published toolbox API", kindToolbox}} {
			data, from, err := published.Read(d.env)
			if errors.Is(err, published.ErrMissing) {
				docs.used = append(docs.used, d.name+": not available, skipped ("+err.Error()+")")
				continue
			}
			if err != nil { // unreadable, or missing under CI=true
				docs.errs = append(docs.errs, fmt.Errorf("%s: %w", d.name, err))
				continue
			}
			// Published documents are loaded, not validated as documents: their quirks are
			// not this client's concern, only whether its traffic fits them.
			add(d.name+" from "+from, d.kind, data, false, false)
		}
	})
	for _, err := range docs.errs {
		t.Fatalf("openapi: %v", err)
	}
	return docs.list
}

// offContractHeader marks a fake's answer that deliberately breaks the documents.
const offContractHeader = "X-Test-Off-Contract"

// validator checks every request and response passing through it against every loaded
// description that covers it; it records failures for the test to report.
type validator struct {
	docs []vdoc
	next http.Handler

	mu      sync.Mutex
	errs    []string
	checked map[string]int // per description: exchanges validated
}

func newValidator(t *testing.T, next http.Handler) *validator {
	v := &validator{docs: loadDocs(t), next: next, checked: map[string]int{}}
	t.Cleanup(func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		for _, e := range v.errs {
			t.Errorf("openapi: %s", e)
		}
	})
	return v
}

func (v *validator) fail(format string, args ...any) {
	v.mu.Lock()
	v.errs = append(v.errs, fmt.Sprintf(format, args...))
	v.mu.Unlock()
}

// takeErrs returns the failures recorded so far and forgets them.
func (v *validator) takeErrs() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	e := v.errs
	v.errs = nil
	return e
}

// Checked returns how many exchanges each description validated.
func (v *validator) Checked() map[string]int {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := map[string]int{}
	for k, n := range v.checked {
		out[k] = n
	}
	return out
}

// docPath maps a request path to the path a description uses; ok=false when the
// description does not cover it.
func docPath(kind docKind, path string) (string, bool) {
	switch {
	case strings.HasPrefix(path, "/api/"):
		return strings.TrimPrefix(path, "/api"), kind == kindSubset || kind == kindAPI
	case strings.HasPrefix(path, "/toolbox/"):
		switch kind {
		case kindSubset:
			return path, true
		case kindToolbox:
			rest := strings.TrimPrefix(path, "/toolbox/")
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				return rest[i:], true
			}
		}
	}
	return "", false
}

// bearer accepts a request carrying a bearer token (the value is the fake's concern).
func bearer(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if h := in.RequestValidationInput.Request.Header.Get("Authorization"); !strings.HasPrefix(h, "Bearer ") || len(h) == len("Bearer ") {
		return fmt.Errorf("no bearer token")
	}
	return nil
}

func (v *validator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	type checked struct {
		d     vdoc
		input *openapi3filter.RequestValidationInput
	}
	var ins []checked
	for _, d := range v.docs {
		p, ok := docPath(d.kind, r.URL.Path)
		if !ok {
			continue
		}
		rr := r.Clone(r.Context())
		u := *r.URL
		u.Path, u.RawPath = p, ""
		rr.URL = &u
		rr.Body = io.NopCloser(bytes.NewReader(body))
		route, params, err := d.router.FindRoute(rr)
		if err != nil {
			v.fail("%s: %s %s: no such operation: %v", d.name, r.Method, p, err)
			continue
		}
		in := &openapi3filter.RequestValidationInput{Request: rr, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: bearer, MultiError: true}}
		if err := openapi3filter.ValidateRequest(r.Context(), in); err != nil {
			v.fail("%s: request %s %s: %v", d.name, r.Method, p, err)
		}
		ins = append(ins, checked{d, in})
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec := httptest.NewRecorder()
	v.next.ServeHTTP(rec, r)
	// The fake marks answers that leave the contract on purpose (a state no document
	// lists, to prove the client's handling of future states); they are not validated.
	offContract := rec.Header().Get(offContractHeader) != ""
	rec.Header().Del(offContractHeader)
	if r.Context().Err() == nil && !offContract { // a hung request's answer reaches nobody
		for _, c := range ins {
			out := &openapi3filter.ResponseValidationInput{
				RequestValidationInput: c.input,
				Status:                 rec.Code,
				Header:                 rec.Header(),
				Body:                   io.NopCloser(bytes.NewReader(rec.Body.Bytes())),
				Options:                &openapi3filter.Options{IncludeResponseStatus: c.d.strict, MultiError: true},
			}
			if err := openapi3filter.ValidateResponse(r.Context(), out); err != nil {
				v.fail("%s: response %d to %s %s: %v", c.d.name, rec.Code, r.Method, r.URL.Path, err)
			}
			v.mu.Lock()
			v.checked[c.d.name]++
			v.mu.Unlock()
		}
	}
	for k, vals := range rec.Header() {
		w.Header()[k] = vals
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}
