package viewer_test

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/viewer"
	"github.com/sandkeep/sandkeep/shared/contract"
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

// TestPageRulesAreTheServers: the id and tenant rules app.js checks addresses with before
// fetching are the server's (contract.CheckID, contract.CheckTenant), on every byte and at
// the length bounds. The two regular expressions use only syntax JavaScript and Go read
// alike (anchors, one character class, a bound).
func TestPageRulesAreTheServers(t *testing.T) {
	rec := httptest.NewRecorder()
	viewer.Wrap(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest("GET", "/assets/app.js", nil))
	js := rec.Body.String()
	rule := func(name string) *regexp.Regexp {
		m := regexp.MustCompile(`const ` + name + ` = /(\^[^/]*\$)/;`).FindStringSubmatch(js)
		if m == nil {
			t.Fatalf("app.js has no %s", name)
		}
		return regexp.MustCompile(m[1])
	}
	idRule, tenantRule := rule("idRule"), rule("tenantRule")
	if !strings.Contains(js, `const validId = (s) => idRule.test(s) && s !== '.' && s !== '..';`) {
		t.Fatal("app.js's validId is not the id rule without . and ..")
	}
	samples := []string{"", ".", "..", "...", "a.b", "run-1", "t:1", "a b", "a/b", "%2E", "ä",
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 256), strings.Repeat("a", 257)}
	for c := range 256 {
		samples = append(samples, string([]byte{byte(c)}), "x"+string([]byte{byte(c)})+"y")
	}
	for _, s := range samples {
		page := idRule.MatchString(s) && s != "." && s != ".."
		if server := contract.CheckID("runId", s) == nil; page != server {
			t.Errorf("id %q: the page says valid=%v, the server %v", s, page, server)
		}
		if page, server := tenantRule.MatchString(s), contract.CheckTenant(s) == nil; page != server {
			t.Errorf("tenant %q: the page says valid=%v, the server %v", s, page, server)
		}
	}
}
