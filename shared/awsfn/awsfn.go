// Package awsfn is what sandkeep's Lambda functions share (docs/design.md §9): configuration read
// once per container from the environment (secrets by ARN from Secrets Manager or SSM),
// the construction of SDK clients, stores, provider and handler, the API Gateway HTTP API
// (payload 2.0) adapter over the shared net/http handler set (shared/httpapi), the route
// set each function serves (docs/design.md §8), and the scheduled reaper's handler. functions/<name>
// mains only call Main.
package awsfn

import "slices"

// Function names one Lambda of the set; the value is its directory under functions/.
type Function string

// The five functions (LogicalIds ResolveFunction, DetachFunction, CancelFunction,
// LogFunction, ReaperFunction).
const (
	Resolve Function = "resolve"
	Detach  Function = "detach"
	Cancel  Function = "cancel"
	Log     Function = "log"
	Reaper  Function = "reaper"
)

// Functions returns every function, API functions first.
func Functions() []Function { return []Function{Resolve, Detach, Cancel, Log, Reaper} }

// LogicalID returns the function's template LogicalId (e.g. "ResolveFunction").
func (f Function) LogicalID() string {
	if f == "" {
		return ""
	}
	return string(f[0]-'a'+'A') + string(f[1:]) + "Function"
}

func (f Function) valid() bool { return slices.Contains(Functions(), f) }

// Route is one HTTP route of docs/design.md §8: a method and a net/http pattern path.
type Route struct {
	Method string
	Path   string
	// Provider: the route's operation calls the sandbox provider (start resolves or creates
	// a sandbox, snapshot takes one, agent launches in one, pump reads its journal, finish
	// kills an aborted run's agent). Only a function serving such a route holds a provider
	// and reads its API key.
	Provider bool
}

// Pattern is the net/http ServeMux pattern ("POST /v1/runs/{runId}/attach"); it is also
// API Gateway's route key.
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// Routes returns the routes function f serves (docs/design.md §8 table, "function" column); the reaper
// serves none.
func Routes(f Function) []Route {
	switch f {
	case Resolve:
		return []Route{
			{"POST", "/v1/runs", true},
			{"POST", "/v1/runs/{runId}/attach", false},
			{"GET", "/v1/runs/{runId}", false},
			{"POST", "/v1/runs/{runId}/snapshot", true},
			{"GET", "/v1/threads/{threadId}/active-run", false},
			{"POST", "/v1/runs/{runId}/agent", true},
			{"GET", "/v1/runs", false},
			{"GET", "/v1/runs/{runId}/view", false},
		}
	case Detach:
		return []Route{
			{"POST", "/v1/runs/{runId}/heartbeat", false},
			{"POST", "/v1/runs/{runId}/detach", false},
		}
	case Cancel:
		return []Route{
			{"POST", "/v1/runs/{runId}/cancel", false},
			{"POST", "/v1/threads/{threadId}/cancel", false},
		}
	case Log:
		return []Route{
			{"POST", "/v1/runs/{runId}/events", false},
			{"GET", "/v1/runs/{runId}/events", false},
			{"POST", "/v1/runs/{runId}/finish", true},
			{"POST", "/v1/runs/{runId}/pump", true},
		}
	}
	return nil
}

// UsesProvider reports whether f calls the sandbox provider: the reaper (it destroys and
// probes sandboxes) and every function serving a Provider route. Only these read the
// provider's API key and are granted its secret (template.yaml; a test compares).
func (f Function) UsesProvider() bool {
	if f == Reaper {
		return true
	}
	for _, r := range Routes(f) {
		if r.Provider {
			return true
		}
	}
	return false
}
