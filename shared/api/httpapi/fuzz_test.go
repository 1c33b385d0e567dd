package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

var fuzzKey = []byte("fuzz cursor key, 32 bytes long!!")

// fuzzMethods are the methods FuzzHandler picks from (the low bits of its method byte).
var fuzzMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete,
	http.MethodHead, http.MethodOptions, http.MethodPatch, "BREW"}

// fuzzAPI is one handler set over memstore with an in-memory provider (no disk), in dev
// mode (tenant from the header) or JWT mode (tenant from the claims).
type fuzzAPI struct {
	dev, jwt http.Handler
	live     string // a valid cursor of run "live" (tenant "local"), for the seeds
}

func newFuzzAPI(tb testing.TB) *fuzzAPI {
	tb.Helper()
	b := memstore.New()
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{counting.New("local-process")}})
	if err != nil {
		tb.Fatal(err)
	}
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	a := &fuzzAPI{
		dev: New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: fuzzKey, Logger: quiet}),
		jwt: New(Config{Keeper: k, Auth: JWTAuth{}, CursorKey: fuzzKey, Logger: quiet}),
	}
	ctx := contract.WithTenant(context.Background(), DefaultDevTenant)
	res, err := k.Start(ctx, keeper.StartInput{RunID: "live", ThreadID: "thread-live",
		Sandbox: keeper.Setup{ID: "default", Provider: "local-process"}})
	if err != nil {
		tb.Fatal(err)
	}
	a.live = cursorCodec{key: fuzzKey}.sign(DefaultDevTenant, "live", res.Driver.Cursor, false)
	return a
}

// knownCodes are the problem codes of docs/design.md §8 (plus internal, which the check refuses).
var knownCodes = map[string]bool{CodeInvalid: true, CodeUnauthenticated: true, CodeUnknownRun: true,
	CodeTerminalRun: true, CodeSuperseded: true, CodeConflict: true, CodeStaleCursor: true, CodeLogClosed: true,
	CodeSandboxGone: true, CodeUnsupported: true, CodeUnavailable: true}

// serveFuzz sends one arbitrary request and checks the answer's shape: never a 500 or a
// panic, every error problem+json with a known code matching its status, every success
// JSON, a request id always. It returns the response for further checks.
func (a *fuzzAPI) serveFuzz(t *testing.T, method byte, path, query, tenant string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	raw := path
	if !strings.HasPrefix(raw, "/") {
		raw = "/" + raw
	}
	if query != "" {
		raw += "?" + query
	}
	// A short deadline bounds long-polls; a 503 is accepted only once it has passed.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, fuzzMethods[int(method)%len(fuzzMethods)], "http://sandkeep.test"+raw, bytes.NewReader(body))
	if err != nil {
		return nil // not a request a client could send
	}
	r.Header.Set("Content-Type", "application/json")
	h := a.dev
	if method&0x80 != 0 {
		h = a.jwt
		r = r.WithContext(WithJWTClaims(r.Context(), map[string]string{DefaultTenantClaim: tenant}))
	}
	if tenant != "" {
		r.Header.Set(TenantHeader, tenant)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	status, hdr, out := w.Code, w.Header(), w.Body.Bytes()
	if hdr.Get(RequestIDHeader) == "" {
		t.Fatalf("%s %s: no request id", r.Method, raw)
	}
	switch {
	case status >= 500 && status != http.StatusNotImplemented && status != http.StatusServiceUnavailable:
		t.Fatalf("%s %s (tenant %q, body %q): status %d: %s", r.Method, raw, tenant, body, status, out)
	case status == http.StatusServiceUnavailable && ctx.Err() == nil:
		t.Fatalf("%s %s (body %q): 503 for a client's request: %s", r.Method, raw, body, out)
	case status >= 300 && status < 400:
		// Only ServeMux's path cleaning redirects (e.g. "//" or ".." segments).
		if status != http.StatusMovedPermanently && status != http.StatusTemporaryRedirect && status != http.StatusPermanentRedirect ||
			hdr.Get("Location") == "" {
			t.Fatalf("%s %s: unexpected %d (Location %q)", r.Method, raw, status, hdr.Get("Location"))
		}
	case status >= 400:
		if ct := hdr.Get("Content-Type"); ct != ProblemContentType {
			t.Fatalf("%s %s: %d with content type %q: %s", r.Method, raw, status, ct, out)
		}
		var p Problem
		if err := json.Unmarshal(out, &p); err != nil || p.Status != status || !knownCodes[p.Code] ||
			p.RequestID != hdr.Get(RequestIDHeader) || p.Title == "" || p.Type != "urn:sandkeep:problem:"+p.Code {
			t.Fatalf("%s %s: %d with a malformed problem (%v): %s", r.Method, raw, status, err, out)
		}
	case status >= 200:
		if ct := hdr.Get("Content-Type"); ct != "application/json" || !json.Valid(out) {
			t.Fatalf("%s %s: %d with content type %q, body %q", r.Method, raw, status, ct, out)
		}
	default:
		t.Fatalf("%s %s: status %d", r.Method, raw, status)
	}
	return w
}

// FuzzHandler feeds arbitrary methods, paths, queries, tenants and bodies to the docs/design.md §8
// handler set: a client's input never yields a 500 or a panic, and every refusal is
// problem+json with a docs/design.md §8 code.
func FuzzHandler(f *testing.F) {
	a := newFuzzAPI(f)
	cur := a.live
	start := `{"runId":"r1","threadId":"t1","sandbox":{"id":"default","provider":"local-process","workspace":{"secrets":{"K":"v"}},"reuse":"none"}}`
	seeds := []struct {
		m           byte
		path, query string
		tenant      string
		body        string
	}{
		{1, "/v1/runs", "", "local", start},
		{1, "/v1/runs", "", "auth0|x", `{"runId":"r2","threadId":"t2","startedAt":1,"sandbox":{"id":"s","provider":"local-process","snapshotMaxAgeMs":5}}`},
		{0x81, "/v1/runs", "", "user@example.com", start},
		{1, "/v1/runs", "", "", `{"runId":"r1","RunId":"x"}`},
		{1, "/v1/runs/live/attach", "", "local", `{}`},
		{0, "/v1/runs/live", "", "local", ``},
		{1, "/v1/runs/live/snapshot", "", "local", `{"cursor":"` + cur + `","label":"l"}`},
		{0, "/v1/threads/thread-live/active-run", "", "local", ``},
		{1, "/v1/runs/live/heartbeat", "", "local", `{"cursor":"` + cur + `"}`},
		{1, "/v1/runs/live/detach", "", "local", `{"cursor":"` + cur + `"}`},
		{1, "/v1/runs/live/events", "", "local", `{"cursor":"` + cur + `","events":[{"data":{"a":1},"src":3},{"data":"x"}]}`},
		{0, "/v1/runs/live/events", "after=0&limit=10&waitMs=0", "local", ``},
		{0, "/v1/runs/live/events", "after=-1&limit=1001&waitMs=x", "other", ``},
		{1, "/v1/runs/live/finish", "", "local", `{"cursor":"` + cur + `","status":"completed","error":{"message":"m"},"usage":{"t":1}}`},
		{1, "/v1/runs/live/cancel", "", "local", ``},
		{1, "/v1/threads/thread-live/cancel", "", "local", `{}`},
		{1, "/v1/runs/live/events", "", "local", `{"cursor":"x.y","events":[]}`},
		{3, "/v1/runs/live", "", "local", ``},
		{0, "/v1//runs/../runs/live", "", "local", ``},
		{0, "/v1/runs/%2e%2e", "", "local", ``},
		{0, "/v1/runs/a%2Fb", "", "local", ``},
		{1, "/v1/runs", "", "local", `{"runId":"r3","threadId":"t3","sandbox":{"id":"d","provider":"local-process","workspace":[1]}}`},
		{1, "/v1/runs", "", "local", `[]`},
		{1, "/v1/runs", "", "local", `{"runId":"r4","threadId":"t4","sandbox":{"id":"d","provider":"nope"}} {}`},
	}
	for _, s := range seeds {
		f.Add(s.m, s.path, s.query, s.tenant, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, method byte, path, query, tenant string, body []byte) {
		a.serveFuzz(t, method, path, query, tenant, body)
	})
}

// FuzzCursorOpen: opening any token never panics, and what opens is exactly a token this
// key issued: re-signing its claims reproduces it byte for byte (no malleable encoding,
// no alias of another token). A token signed by another key never opens.
func FuzzCursorOpen(f *testing.F) {
	c := cursorCodec{key: fuzzKey}
	other := cursorCodec{key: []byte("another key of at least 16 bytes")}
	for _, tok := range []string{
		c.sign("acme", "run-1", contract.Cursor{Epoch: 1, Next: 1}, false),
		c.sign("t_0123456789abcdef0123456789abcdef", strings.Repeat("r", 256), contract.Cursor{Epoch: 1 << 62, Next: -1, Src: 1 << 40}, false),
		c.sign("", "", contract.Cursor{}, false),
		other.sign("acme", "run-1", contract.Cursor{Epoch: 1, Next: 1}, false),
		"", ".", "a.b", "not-a-cursor", "e30.", "e30.AAAA", strings.Repeat("A", maxCursorLen+1),
	} {
		f.Add(tok)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		cl, err := c.open(tok)
		if err != nil {
			if !errors.Is(err, errBadCursor) || cl != (cursorClaims{}) {
				t.Fatalf("open(%q) = %+v, %v", tok, cl, err)
			}
			return
		}
		if again := c.sign(cl.Tenant, cl.RunID, cl.cursor(), cl.Cancel); again != tok {
			t.Fatalf("open accepted %q, which this key issues as %q: a malleable token", tok, again)
		}
		if _, err := other.open(tok); err == nil {
			t.Fatalf("a token of one key opens under another: %q", tok)
		}
	})
}

// FuzzCursorTamper: every token round-trips its claims exactly, and changing any one byte
// of it makes it refused (as the API answers: 409 conflict).
func FuzzCursorTamper(f *testing.F) {
	f.Add("acme", "run-1", int64(1), int64(1), int64(0), uint16(0), byte('A'))
	f.Add("t_0123456789abcdef0123456789abcdef", "run:x.y", int64(7), int64(42), int64(4096), uint16(500), byte('.'))
	f.Add("local", "live", int64(1), int64(1), int64(0), uint16(65535), byte('B'))
	c := cursorCodec{key: fuzzKey}
	f.Fuzz(func(t *testing.T, tenant, runID string, epoch, next, src int64, pos uint16, b byte) {
		cur := contract.Cursor{Epoch: epoch, Next: next, Src: src}
		tok := c.sign(tenant, runID, cur, false)
		cl, err := c.open(tok)
		if len(tok) > maxCursorLen {
			if err == nil {
				t.Fatalf("a %d-byte token opened", len(tok))
			}
			return
		}
		// Tenants and run ids are validated ASCII before they are signed; invalid UTF-8 is
		// only carried as JSON's replacement characters.
		exact := utf8.ValidString(tenant) && utf8.ValidString(runID)
		if err != nil || exact && (cl.Tenant != tenant || cl.RunID != runID) || cl.cursor() != cur {
			t.Fatalf("round trip of (%q, %q, %+v): %+v, %v", tenant, runID, cur, cl, err)
		}
		i := int(pos) % len(tok)
		if tok[i] == b {
			return
		}
		bad := tok[:i] + string([]byte{b}) + tok[i+1:]
		if got, err := c.open(bad); err == nil {
			t.Fatalf("tampered token (byte %d %q -> %q) opened: %q -> %+v", i, tok[i], b, bad, got)
		}
	})
}

// FuzzMapTenant: every authenticated name maps to a valid, non-empty store tenant; names
// within the charset that do not look mapped are kept; everything else is hashed; two
// different names never share a tenant.
func FuzzMapTenant(f *testing.F) {
	for _, p := range [][2]string{{"acme", "ACME"}, {"auth0|x", "auth0|y"}, {"user@example.com", "t_0123456789abcdef0123456789abcdef"},
		{"t_0123456789abcdef0123456789abcdef", "t_0123456789abcdef0123456789abcdeF"}, {"", " "}, {strings.Repeat("x", 64), strings.Repeat("x", 65)},
		{"a#b", "a/b"}, {"é", "\xff"}} {
		f.Add(p[0], p[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ma, mb := MapTenant(a), MapTenant(b)
		for _, c := range []struct{ raw, m string }{{a, ma}, {b, mb}} {
			if c.raw == "" {
				if c.m != "" {
					t.Fatalf("MapTenant(\"\") = %q", c.m)
				}
				continue
			}
			if c.m == "" || contract.CheckTenant(c.m) != nil {
				t.Fatalf("MapTenant(%q) = %q: not a valid tenant", c.raw, c.m)
			}
			kept := contract.CheckTenant(c.raw) == nil && !looksMapped(c.raw)
			if kept != (c.m == c.raw) || !kept && !looksMapped(c.m) {
				t.Fatalf("MapTenant(%q) = %q (kept=%v)", c.raw, c.m, kept)
			}
			if MapTenant(c.raw) != c.m {
				t.Fatalf("MapTenant(%q) is not deterministic", c.raw)
			}
		}
		if a != b && ma == mb {
			t.Fatalf("MapTenant(%q) == MapTenant(%q) == %q", a, b, ma)
		}
	})
}
