package daytona

import (
	"errors"
	"fmt"
	"net/http"
)

// Sentinel errors of the provider; test with errors.Is. None of them is ever
// contract.ErrSandboxGone: gone is reported only on a confirmed gone state.
var (
	// ErrAuth: Daytona rejected the API key (401) or refused it the operation (403).
	ErrAuth = errors.New("daytona: API key rejected")
	// ErrConfig: the provider is misconfigured (ErrAuth is one); retrying cannot help.
	ErrConfig = errors.New("daytona: configuration error")
	// ErrTransient: throttling, a server error, a timeout or a network failure outlasted
	// the retries within the caller's deadline; a later call may succeed.
	ErrTransient = errors.New("daytona: temporarily unavailable")
	// ErrNotStarted: the sandbox exists but is not running (commands need Resume first).
	ErrNotStarted = errors.New("daytona: sandbox not started")
)

// APIError is a failed Daytona request after its retries. Its text never contains the
// API key or an injected secret: server messages are redacted before they are kept.
type APIError struct {
	Op       string // what was attempted, e.g. "create sandbox"
	Status   int    // HTTP status; 0 when no response arrived
	Message  string // the server's message (redacted, truncated), or the transport error's
	Attempts int
	err      error // the transport or context error (Status 0), for errors.Is
}

// Error reads "daytona: API key rejected (401): <op>" for auth failures, else
// "daytona: <op>: HTTP <status>: <message>".
func (e *APIError) Error() string {
	tries := ""
	if e.Attempts > 1 {
		tries = fmt.Sprintf(" (after %d attempts)", e.Attempts)
	}
	switch {
	case e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden:
		return fmt.Sprintf("daytona: API key rejected (%d): %s%s", e.Status, e.Op, tries)
	case e.Status == 0:
		return fmt.Sprintf("daytona: %s: %s%s", e.Op, e.Message, tries)
	case e.Message == "":
		return fmt.Sprintf("daytona: %s: HTTP %d%s", e.Op, e.Status, tries)
	}
	return fmt.Sprintf("daytona: %s: HTTP %d: %s%s", e.Op, e.Status, e.Message, tries)
}

// Is matches ErrAuth and ErrConfig for 401/403 and ErrTransient for retryable failures.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrAuth, ErrConfig:
		return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
	case ErrTransient:
		return transientStatus(e.Status)
	}
	return false
}

// Unwrap returns the transport or context error of a request that got no response.
func (e *APIError) Unwrap() error { return e.err }

// transientStatus reports whether a status (0 = no response) may succeed when repeated.
func transientStatus(s int) bool {
	return s == 0 || s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500
}

// statusOf returns the HTTP status of a failed request (0 when there is none).
func statusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// transientf returns a transient error of the provider's own (a deadline while polling, a
// state that has not settled).
func transientf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrTransient}, args...)...)
}
