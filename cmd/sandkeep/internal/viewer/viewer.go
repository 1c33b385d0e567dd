// Package viewer is the run viewer `sandkeep dev` serves at /: one HTML page, a script and
// a style sheet embedded in the binary (no build step, nothing fetched from the network).
// The page reads only the HTTP API (GET /v1/runs, /v1/runs/{runId}/view, the events long
// poll, /v1/reaper/sweeps) and writes only cancel. Everything it shows is set as text
// (event data is an agent's output: hostile by default), and every response carries a
// Content-Security-Policy that allows this origin's script and style only, no inline code,
// no frames, and Trusted Types for script sinks, so even a bug that reached for innerHTML
// would throw instead of running markup.
package viewer

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// CSP is the Content-Security-Policy of every viewer response.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

// Wrap serves the viewer at / and /assets/ (GET and HEAD) and passes every other request
// to api.
func Wrap(api http.Handler) http.Handler {
	files, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree always has assets/
	}
	static := http.FileServerFS(files)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		page := p == "/" || (strings.HasPrefix(p, "/assets/") && path.Clean(p) == p && !strings.HasSuffix(p, "/"))
		if !page || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			api.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-cache")
		if p == "/" {
			// FileServer redirects /index.html to /: serve the file's bytes directly.
			b, err := fs.ReadFile(files, "index.html")
			if err != nil {
				http.Error(w, "viewer page missing", http.StatusInternalServerError)
				return
			}
			h.Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write(b)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimPrefix(p, "/assets")
		static.ServeHTTP(w, r2)
	})
}
