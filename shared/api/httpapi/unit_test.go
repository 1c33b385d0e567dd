package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

func TestMapTenant(t *testing.T) {
	hashed := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "t_" + hex.EncodeToString(sum[:])[:32]
	}
	looks := hashed("victim@example.com")
	cases := []struct{ raw, want string }{
		{"", ""},
		{"acme", "acme"},
		{"a.b_c-D9", "a.b_c-D9"},
		{"auth0|x", hashed("auth0|x")},
		{"victim@example.com", looks},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{strings.Repeat("a", 65), hashed(strings.Repeat("a", 65))},
		// A raw value that has the mapped form is hashed again: nobody can name themselves
		// into the mapped tenant of another raw value.
		{looks, hashed(looks)},
		{"t_short", "t_short"},
	}
	for _, c := range cases {
		got := MapTenant(c.raw)
		if got != c.want {
			t.Errorf("MapTenant(%q) = %q, want %q", c.raw, got, c.want)
		}
		if got != "" {
			if err := contract.CheckTenant(got); err != nil {
				t.Errorf("MapTenant(%q) = %q outside the tenant charset: %v", c.raw, got, err)
			}
		}
	}
}

func TestAuthenticators(t *testing.T) {
	req := func(header string, claims map[string]string, origin ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/v1/runs/x", nil)
		for _, o := range origin {
			r.Header.Set("Origin", o)
		}
		if header != "" {
			r.Header.Set(TenantHeader, header)
		}
		if claims != nil {
			r = r.WithContext(WithJWTClaims(r.Context(), claims))
		}
		return r
	}
	cases := []struct {
		name   string
		auth   Authenticator
		header string
		claims map[string]string
		want   string
	}{
		{"dev default", DevAuth{}, "", nil, "local"},
		{"dev header", DevAuth{}, "acme", nil, "acme"},
		{"dev blank header", DevAuth{}, "  ", nil, "local"},
		{"iam missing", IAMAuth{}, "", nil, ""},
		{"iam blank", IAMAuth{}, " ", nil, ""},
		{"iam header", IAMAuth{}, "acme", nil, "acme"},
		{"jwt no claims", JWTAuth{}, "", nil, ""},
		{"jwt default claim", JWTAuth{}, "", map[string]string{"tenant": "acme"}, "acme"},
		{"jwt ignores header", JWTAuth{}, "evil", map[string]string{"sub": "u1"}, ""},
		{"jwt custom claim", JWTAuth{Claim: "org"}, "", map[string]string{"org": "o-1", "tenant": "x"}, "o-1"},
		{"jwt empty claim", JWTAuth{}, "", map[string]string{"tenant": ""}, ""},
	}
	for _, c := range cases {
		if got := c.auth.Tenant(req(c.header, c.claims)); got != c.want {
			t.Errorf("%s: Tenant = %q, want %q", c.name, got, c.want)
		}
	}
	// The dev server refuses browsers of other origins (httptest's Host is example.com).
	for origin, want := range map[string]string{
		"https://evil.example":  "",
		"null":                  "",
		"http://example.com":    "acme",
		"http://example.com:81": "",
	} {
		if got := (DevAuth{}).Tenant(req("acme", nil, origin)); got != want {
			t.Errorf("dev with Origin %q: Tenant = %q, want %q", origin, got, want)
		}
	}
}

func TestCursorCodec(t *testing.T) {
	c := cursorCodec{key: []byte("0123456789abcdef0123456789abcdef")}
	cur := contract.Cursor{Epoch: 3, Next: 17, Src: 4096}
	tok := c.sign("acme", "run-1", cur, false)
	cl, err := c.open(tok)
	if err != nil {
		t.Fatalf("open own token: %v", err)
	}
	if cl.RunID != "run-1" || cl.Tenant != "acme" || cl.cursor() != cur {
		t.Fatalf("claims = %+v", cl)
	}
	payload, sig, _ := strings.Cut(tok, ".")
	forged := cursorCodec{key: []byte("another key of at least 16 bytes")}.sign("acme", "run-1", cur, false)
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	bad := map[string]string{
		"empty":            "",
		"no dot":           payload,
		"payload tampered": flip(payload, len(payload)/2) + "." + sig,
		"sig tampered":     payload + "." + flip(sig, 3),
		"other key":        forged,
		"not base64":       "!!!." + sig,
		"too long":         strings.Repeat("a", maxCursorLen+1),
		"swapped parts":    sig + "." + payload,
	}
	for name, tok := range bad {
		if _, err := c.open(tok); !errors.Is(err, errBadCursor) {
			t.Errorf("%s: open = %v, want errBadCursor", name, err)
		}
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
		infra  bool
	}{
		{contract.Invalid("x", "bad"), 400, CodeInvalid, false},
		{fmt.Errorf("attach: %w", contract.ErrUnknownRun), 404, CodeUnknownRun, false},
		{contract.ErrTerminalRun, 410, CodeTerminalRun, false},
		{contract.ErrSuperseded, 409, CodeSuperseded, false},
		{contract.ErrConflict, 409, CodeConflict, false},
		{contract.ErrLogClosed, 409, CodeLogClosed, false},
		{contract.ErrSandboxGone, 409, CodeSandboxGone, false},
		{keeper.ErrUnsupported, 501, CodeUnsupported, false},
		{fmt.Errorf("lock: %w", keeper.ErrUnavailable), 503, CodeUnavailable, true},
		{contract.ErrLeaseLost, 503, CodeUnavailable, true},
		{context.DeadlineExceeded, 503, CodeUnavailable, true},
		{errors.New("dynamodb: throttled"), 503, CodeUnavailable, true},
		// A context without a tenant is our bug (handlers always set one): 500, not a
		// retryable 503, and never the client's 400.
		{fmt.Errorf("keeper: read: %w", contract.ErrNoTenant), 500, CodeInternal, true},
	}
	for _, c := range cases {
		status, code, infra := classify(c.err)
		if status != c.status || code != c.code || infra != c.infra {
			t.Errorf("classify(%v) = %d %s %v, want %d %s %v", c.err, status, code, infra, c.status, c.code, c.infra)
		}
		detail := detailOf(c.err, code, infra)
		if infra && strings.Contains(detail, c.err.Error()) {
			t.Errorf("detail of infrastructure error leaks it: %q", detail)
		}
	}
}

func TestDecodeBody(t *testing.T) {
	type inner struct {
		ID string `json:"id"`
	}
	type body struct {
		Name  string          `json:"name"`
		N     *int64          `json:"n"`
		Inner *inner          `json:"inner"`
		List  []inner         `json:"list"`
		Raw   json.RawMessage `json:"raw"`
	}
	cases := []struct {
		name, body string
		allowEmpty bool
		field      string // "" = must succeed
	}{
		{"ok", `{"name":"a","n":1,"inner":{"id":"x"},"list":[{"id":"y"}],"raw":{"Any":"Keys"}}`, false, ""},
		{"empty allowed", ``, true, ""},
		{"empty refused", ``, false, "body"},
		{"malformed", `{"name":`, false, "body"},
		{"syntax", `{"name" "a"}`, false, "body"},
		{"two values", `{} {}`, false, "body"},
		{"trailing garbage", `{"name":"a"}x`, false, "body"},
		{"unknown field", `{"tenant":"b"}`, false, "tenant"},
		{"case folded key", `{"Name":"a"}`, false, "Name"},
		{"case folded nested", `{"inner":{"ID":"x"}}`, false, "inner.ID"},
		{"case folded in list", `{"list":[{"id":"a"},{"Id":"x"}]}`, false, "list[1].Id"},
		{"wrong type string", `{"name":5}`, false, "name"},
		{"wrong type int", `{"n":"5"}`, false, "n"},
		{"fraction", `{"n":1.5}`, false, "n"},
		{"top-level array", `[]`, false, "body"},
		{"top-level null", `null`, false, "body"},
		{"top-level null, empty allowed", ` null `, true, "body"},
		{"duplicate key", `{"name":"a","name":"b"}`, false, "name"},
		{"duplicate nested", `{"inner":{"id":"x","id":"y"}}`, false, "inner.id"},
		{"duplicate in list", `{"list":[{"id":"a"},{"id":"b","id":"c"}]}`, false, "list[1].id"},
		{"duplicate inside an opaque document", `{"raw":{"k":1,"k":2}}`, false, ""},
		{"nested null reads as absent", `{"inner":null}`, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(c.body))
			var dst body
			err := decodeBody(httptest.NewRecorder(), r, MaxBodyBytes, &dst, c.allowEmpty)
			if c.field == "" {
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				return
			}
			if !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), c.field+":") {
				t.Fatalf("decode = %v, want ErrInvalid naming %q", err, c.field)
			}
		})
	}
	t.Run("oversize", func(t *testing.T) {
		big := `{"name":"` + strings.Repeat("x", 300) + `"}`
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(big))
		var dst body
		err := decodeBody(httptest.NewRecorder(), r, 100, &dst, false)
		if !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), "larger than 100 bytes") {
			t.Fatalf("decode = %v, want body too large", err)
		}
	})
}

// BenchmarkDecodeEventsBody measures decoding a near-limit POST /events body (strict keys
// pass plus the typed decode).
func BenchmarkDecodeEventsBody(b *testing.B) {
	ev := `{"data":{"text":"` + strings.Repeat("x", 1000) + `"},"src":1}`
	body := `{"cursor":"c","events":[` + strings.TrimSuffix(strings.Repeat(ev+",", 1000), ",") + `]}`
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		var dst appendRequest
		if err := decodeBody(httptest.NewRecorder(), r, MaxEventsBytes, &dst, false); err != nil {
			b.Fatal(err)
		}
	}
}
