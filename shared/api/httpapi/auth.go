package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// TenantHeader is the header a trusted caller (IAM mode) or a developer (dev mode) names the
// tenant in.
const TenantHeader = "X-Sandkeep-Tenant"

// DefaultDevTenant is the dev server's tenant when the request names none.
const DefaultDevTenant = "local"

// DefaultTenantClaim is the JWT claim JWTAuth reads by default.
const DefaultTenantClaim = "tenant"

// Authenticator names the caller's tenant. It never sees the body: a body never chooses
// the tenant.
type Authenticator interface {
	// Tenant returns the caller's raw tenant name; "" means unauthenticated (HTTP 401).
	Tenant(r *http.Request) string
}

// DevAuth is the dev server's authentication: header X-Sandkeep-Tenant, else "local".
// A browser request from an origin it does not allow (OriginRule: its own, and
// AllowOrigins) is refused 403 forbidden-origin by the handler: the dev server trusts
// whoever reaches it, and a web page must not drive it (a cross-site POST needs no
// preflight).
type DevAuth struct {
	// AllowOrigins are further origins whose pages may call the API (canonical, as
	// ParseOrigin returns them; sandkeep dev --allow-origin).
	AllowOrigins []string
}

// Tenant returns the header's value, or DefaultDevTenant when it is absent or empty; ""
// for a request from an origin it does not allow (the handler refuses it before), or
// whose header is repeated or made only of Unicode whitespace (never trimmed into another
// name, nor read as absent).
func (a DevAuth) Tenant(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" && !a.AllowsOrigin(o, r.Host) {
		return ""
	}
	vs := r.Header.Values(TenantHeader)
	if len(vs) == 0 || len(vs) == 1 && strings.Trim(vs[0], " \t") == "" {
		return DefaultDevTenant
	}
	return headerTenant(r)
}

// QueryTenant is Tenant for the push upgrade (GET /v1/subscribe), whose browser client
// cannot send headers: the query's tenant parameter when the header is absent. The Origin
// rule is Tenant's; a repeated or blank parameter names no tenant.
func (a DevAuth) QueryTenant(r *http.Request) string {
	q := r.URL.Query()
	if len(r.Header.Values(TenantHeader)) > 0 || !q.Has("tenant") {
		return a.Tenant(r)
	}
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
		return ""
	}
	if vs := q["tenant"]; len(vs) == 1 {
		return rawTenant(vs[0])
	}
	return ""
}

// headerTenant returns the tenant header's value exactly as sent, less only HTTP's own
// optional whitespace (space and tab) around it, as a raw tenant name (rawTenant); a
// header given more than once names no tenant ("").
func headerTenant(r *http.Request) string {
	vs := r.Header.Values(TenantHeader)
	if len(vs) != 1 {
		return ""
	}
	return rawTenant(strings.Trim(vs[0], " \t"))
}

// rawTenant is the one rule for a raw tenant name: nothing is trimmed, so two distinct
// byte strings never become one name (MapTenant hashes what lies outside the charset),
// and a name made only of whitespace (Unicode's included) names no tenant ("").
func rawTenant(t string) string {
	if strings.TrimSpace(t) == "" {
		return ""
	}
	return t
}

// LoopbackHost returns the dev server's Host rule: 127.0.0.1, localhost (any case) or
// [::1], each with port, the port the server listens on. Any other Host — a DNS name that
// resolves to loopback included — is a page that rebound its name to this machine.
func LoopbackHost(port string) func(host string) bool {
	return func(host string) bool {
		name, p, err := net.SplitHostPort(host)
		if err != nil || p != port {
			return false
		}
		return name == "127.0.0.1" || name == "::1" && strings.HasPrefix(host, "[") || strings.EqualFold(name, "localhost")
	}
}

// sameOrigin reports whether origin (scheme://host[:port]) names host.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && strings.EqualFold(u.Host, host)
}

// IAMAuth trusts the calling service (authenticated by API Gateway's IAM authorizer) to
// name the tenant in X-Sandkeep-Tenant.
type IAMAuth struct{}

// Tenant returns the header's value; absent, blank or repeated is unauthenticated.
func (IAMAuth) Tenant(r *http.Request) string {
	return headerTenant(r)
}

// JWTAuth reads the tenant from the verified JWT claims the Lambda adapter put into the
// request context (WithJWTClaims); headers are ignored.
type JWTAuth struct {
	Claim string // the claim naming the tenant; "" = DefaultTenantClaim
}

// Tenant returns the configured claim exactly as verified (nothing trimmed); absent or
// blank is unauthenticated.
func (a JWTAuth) Tenant(r *http.Request) string {
	claim := a.Claim
	if claim == "" {
		claim = DefaultTenantClaim
	}
	claims, _ := r.Context().Value(jwtClaimsKey{}).(map[string]string)
	return rawTenant(claims[claim])
}

type jwtClaimsKey struct{}

// WithJWTClaims returns ctx carrying the verified JWT claims of the request (set by the
// Lambda adapter from API Gateway's authorizer context); JWTAuth reads them.
func WithJWTClaims(ctx context.Context, claims map[string]string) context.Context {
	return context.WithValue(ctx, jwtClaimsKey{}, claims)
}

// MapTenant turns a raw tenant name into a store tenant: a value within the tenant charset
// ([A-Za-z0-9._-], at most 64 bytes) is kept, anything else — whitespace of any kind
// included — becomes "t_" + the first 32 hex of its SHA-256, so an e-mail address or
// "auth0|x" works and no two distinct byte strings share a tenant. A raw value that already has the mapped form is hashed too, so no
// caller can name itself into another caller's mapped tenant. "" stays "" (unauthenticated).
func MapTenant(raw string) string {
	if raw == "" {
		return ""
	}
	if contract.CheckTenant(raw) == nil && !looksMapped(raw) {
		return raw
	}
	sum := sha256.Sum256([]byte(raw))
	return "t_" + hex.EncodeToString(sum[:])[:32]
}

// looksMapped reports whether t has the form MapTenant produces for a hashed value.
func looksMapped(t string) bool {
	if len(t) != 34 || !strings.HasPrefix(t, "t_") {
		return false
	}
	for i := 2; i < len(t); i++ {
		if c := t[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
