// Package awsfn is what sandkeep's Lambda functions share (SPEC §9): configuration read
// once per container from the environment (secrets by ARN from Secrets Manager or SSM),
// the construction of SDK clients, stores, provider and handler, the API Gateway HTTP API
// (payload 2.0) adapter over the shared net/http handler set (shared/httpapi), the route
// set each function serves (§8), and the scheduled reaper's handler. functions/<name>
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

// Route is one HTTP route of §8: a method and a net/http pattern path.
type Route struct {
	Method string
	Path   string
}

// Pattern is the net/http ServeMux pattern ("POST /v1/runs/{runId}/attach"); it is also
// API Gateway's route key.
func (r Route) Pattern() string { return r.Method + " " + r.Path }

// Routes returns the routes function f serves (§8 table, "function" column); the reaper
// serves none.
func Routes(f Function) []Route {
	switch f {
	case Resolve:
		return []Route{
			{"POST", "/v1/runs"},
			{"POST", "/v1/runs/{runId}/attach"},
			{"GET", "/v1/runs/{runId}"},
			{"POST", "/v1/runs/{runId}/snapshot"},
			{"GET", "/v1/threads/{threadId}/active-run"},
		}
	case Detach:
		return []Route{
			{"POST", "/v1/runs/{runId}/heartbeat"},
			{"POST", "/v1/runs/{runId}/detach"},
		}
	case Cancel:
		return []Route{
			{"POST", "/v1/runs/{runId}/cancel"},
			{"POST", "/v1/threads/{threadId}/cancel"},
		}
	case Log:
		return []Route{
			{"POST", "/v1/runs/{runId}/events"},
			{"GET", "/v1/runs/{runId}/events"},
			{"POST", "/v1/runs/{runId}/finish"},
		}
	}
	return nil
}
