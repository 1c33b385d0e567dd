package viewer_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/viewer"
)

// TestWrapServesThePageWithItsCSPAndPassesTheRest: the page and its assets carry the
// restrictive CSP; anything else (the API, a directory, another method) reaches the API.
func TestWrapServesThePageWithItsCSPAndPassesTheRest(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(299) })
	h := viewer.Wrap(api)
	for _, c := range []struct {
		method, path string
		status       int
		ctype        string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8"},
		{"HEAD", "/", 200, "text/html; charset=utf-8"},
		{"GET", "/assets/app.js", 200, "text/javascript; charset=utf-8"},
		{"GET", "/assets/app.css", 200, "text/css; charset=utf-8"},
		{"GET", "/assets/", 299, ""},
		{"GET", "/assets/../go.mod", 299, ""},
		{"GET", "/assets/missing.js", 404, ""},
		{"POST", "/", 299, ""},
		{"GET", "/v1/runs", 299, ""},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, rec.Code, c.status)
			continue
		}
		if c.status == 299 {
			if rec.Header().Get("Content-Security-Policy") != "" {
				t.Errorf("%s %s: the API's answer got the page's headers", c.method, c.path)
			}
			continue
		}
		if csp := rec.Header().Get("Content-Security-Policy"); csp != viewer.CSP {
			t.Errorf("%s %s: CSP %q", c.method, c.path, csp)
		}
		if c.ctype != "" && !strings.EqualFold(rec.Header().Get("Content-Type"), c.ctype) {
			t.Errorf("%s %s: content type %q, want %q", c.method, c.path, rec.Header().Get("Content-Type"), c.ctype)
		}
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: no nosniff", c.method, c.path)
		}
	}
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "require-trusted-types-for 'script'"} {
		if !strings.Contains(viewer.CSP, want) {
			t.Errorf("CSP lacks %s", want)
		}
	}
}

// TestAssetsUseNoHTMLSink: the script never assigns markup (the CSP's Trusted Types would
// throw; this catches it before a browser does) and the page loads nothing from elsewhere.
func TestAssetsUseNoHTMLSink(t *testing.T) {
	h := viewer.Wrap(http.NotFoundHandler())
	get := func(p string) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", p, nil))
		return rec.Body.String()
	}
	js, page := get("/assets/app.js"), get("/")
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(js, sink) {
			t.Errorf("app.js uses %s", sink)
		}
	}
	for _, doc := range []string{js, page, get("/assets/app.css")} {
		if strings.Contains(doc, "http://") || strings.Contains(doc, "https://") || strings.Contains(doc, "//cdn") {
			t.Errorf("an asset names another origin:\n%.200s", doc)
		}
	}
}
