package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// OriginRule is implemented by an Authenticator that admits browser requests (those with
// an Origin header) only from some origins: the handler answers any other 403
// forbidden-origin before routing, and adds the CORS headers for an admitted origin that
// is not the server's own (DevAuth).
type OriginRule interface {
	// AllowsOrigin reports whether a request with Origin origin, addressed to host, is
	// admitted.
	AllowsOrigin(origin, host string) bool
}

// ParseOrigin checks an origin given to allow (sandkeep dev --allow-origin) and returns
// its canonical form: scheme "http" or "https", a host with an optional port, nothing
// else (no path but "/", no user, query or fragment), lower case.
func ParseOrigin(s string) (string, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("origin %q: %w", s, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Opaque != "":
		return "", fmt.Errorf("origin %q: want http://HOST[:PORT] or https://HOST[:PORT]", s)
	case u.User != nil, u.Path != "" && u.Path != "/", u.RawQuery != "", u.ForceQuery, u.Fragment != "":
		return "", fmt.Errorf("origin %q: an origin is a scheme and a host (and port) only", s)
	}
	return strings.ToLower(u.Scheme + "://" + u.Host), nil
}

// AllowsOrigin admits the server's own origin (the viewer's pages) and the origins of
// AllowOrigins (canonical, ParseOrigin); any other browser request is refused, since the
// dev server trusts whoever reaches it and a cross-site POST needs no preflight.
func (a DevAuth) AllowsOrigin(origin, host string) bool {
	return sameOrigin(origin, host) || slices.Contains(a.AllowOrigins, strings.ToLower(origin))
}

// corsMaxAgeSeconds is how long a browser may cache a preflight's answer.
const corsMaxAgeSeconds = "600"

// checkOrigin applies the authenticator's OriginRule to r: nil when r has no Origin, the
// rule admits it, or there is no rule; else the 403 forbidden-origin refusal. For an
// admitted origin other than the server's own it sets the CORS headers on w and reports
// a preflight (OPTIONS with Access-Control-Request-Method), which the caller answers 204.
func (h *handler) checkOrigin(w http.ResponseWriter, r *http.Request) (preflight bool, err error) {
	origin := r.Header.Get("Origin")
	rule, ok := h.auth.(OriginRule)
	if origin == "" || !ok {
		return false, nil
	}
	if !rule.AllowsOrigin(origin, r.Host) {
		return false, &apiError{http.StatusForbidden, CodeForbiddenOrigin,
			fmt.Sprintf("browser requests from origin %q are not allowed; start the dev server with --allow-origin %s to allow it", origin, origin)}
	}
	if sameOrigin(origin, r.Host) {
		return false, nil
	}
	hd := w.Header()
	hd.Set("Access-Control-Allow-Origin", origin)
	hd.Add("Vary", "Origin")
	hd.Set("Access-Control-Expose-Headers", RequestIDHeader+", Retry-After")
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		hd.Set("Access-Control-Allow-Methods", "GET, POST")
		hd.Set("Access-Control-Allow-Headers", "Content-Type, "+TenantHeader+", "+RequestIDHeader)
		hd.Set("Access-Control-Max-Age", corsMaxAgeSeconds)
		return true, nil
	}
	return false, nil
}
