// Package awsfn is what sandkeep's Lambda functions share (docs/design.md §9): configuration read
// once per container from the environment (secrets by ARN from Secrets Manager or SSM),
// the construction of SDK clients, stores, provider and handler, the API Gateway HTTP API
// (payload 2.0) adapter over the shared net/http handler set (shared/api/httpapi), the route
// set each function serves (docs/design.md §8), and the scheduled reaper's handler. functions/<name>
// mains only call Main.
package awsfn

import (
	"slices"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
)

// Function names one Lambda of the set; the value is its directory under functions/.
type Function string

// The functions (LogicalIds ResolveFunction, DetachFunction, CancelFunction, LogFunction,
// WaitFunction, ReaperFunction, PushFunction, ShipFunction). Wait serves the routes that
// may wait (read long polls, pumps), each function with its own reserved concurrency, so
// waiting requests never take the capacity of appends and finishes (Log) or cancels
// (Cancel).
const (
	Resolve Function = "resolve"
	Detach  Function = "detach"
	Cancel  Function = "cancel"
	Log     Function = "log"
	Wait    Function = "wait"
	Reaper  Function = "reaper"
	// Push serves the WebSocket API of the deployed push ($connect, $disconnect, messages;
	// docs/design.md §8.1): no HTTP route.
	Push Function = "push"
	// Ship serves the ship routes alone (docs/design.md §8.2), from its own function URL
	// as well as the HTTP API: their one credential is a run's ship token, so it reads no
	// authentication settings, and every other route is refused (docs/design.md §9).
	Ship Function = "ship"
)

// Functions returns every function, API functions first.
func Functions() []Function {
	return []Function{Resolve, Detach, Cancel, Log, Wait, Reaper, Push, Ship}
}

// LogicalID returns the function's template LogicalId (e.g. "ResolveFunction").
func (f Function) LogicalID() string {
	if f == "" {
		return ""
	}
	return string(f[0]-'a'+'A') + string(f[1:]) + "Function"
}

func (f Function) valid() bool { return slices.Contains(Functions(), f) }

// Route is one HTTP route of docs/design.md §8; shared/api/httpapi holds the one table of them.
type Route = httpapi.Route

// Routes returns the routes function f serves: the table's rows whose "function" column
// names f (docs/design.md §8); the reaper serves none.
func Routes(f Function) []Route {
	var out []Route
	for _, r := range httpapi.Routes() {
		if f != "" && r.Function == string(f) {
			out = append(out, r)
		}
	}
	return out
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
