package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Problem codes (the `code` member of every error body; shared/api/wire holds them).
const (
	CodeInvalid         = wire.CodeInvalid
	CodeUnauthenticated = wire.CodeUnauthenticated
	// CodeUntrustedPrincipal is answered by the Lambda adapter (shared/deploy/awsfn), never here.
	CodeUntrustedPrincipal = wire.CodeUntrustedPrincipal
	CodeUnknownRun         = wire.CodeUnknownRun
	CodeTerminalRun        = wire.CodeTerminalRun
	CodeSuperseded         = wire.CodeSuperseded
	CodeConflict           = wire.CodeConflict
	CodeStaleCursor        = wire.CodeStaleCursor
	CodeLogClosed          = wire.CodeLogClosed
	CodeSandboxGone        = wire.CodeSandboxGone
	CodeUnsupported        = wire.CodeUnsupported
	CodeUnavailable        = wire.CodeUnavailable
	CodeForbiddenHost      = wire.CodeForbiddenHost
	// The store routes' codes (stores.go).
	CodeTrustedCallerRequired = wire.CodeTrustedCallerRequired
	CodeAppDriven             = wire.CodeAppDriven
	CodeSandkeepDriven        = wire.CodeSandkeepDriven
	CodeLockHeld              = wire.CodeLockHeld
	CodeLockLost              = wire.CodeLockLost
	CodeForbiddenOrigin       = wire.CodeForbiddenOrigin
	CodeTooManyWaiting        = wire.CodeTooManyWaiting
	// The ship routes' codes (ship.go).
	CodeInvalidToken = wire.CodeInvalidToken
	CodeTokenExpired = wire.CodeTokenExpired
	CodeTokenScope   = wire.CodeTokenScope
	CodeShipGap      = wire.CodeShipGap
	CodeRateLimited  = wire.CodeRateLimited
	// CodeInternal is a bug of ours (HTTP 500); never a client's mistake.
	CodeInternal = wire.CodeInternal
)

// ProblemContentType is the media type of error bodies (RFC 9457).
const ProblemContentType = wire.ProblemContentType

// retryAfterSeconds is the Retry-After of a 503 and a 429: lock waits and throttling
// clear quickly, and a waiting place frees as soon as any of the tenant's waits answers.
const retryAfterSeconds = "1"

// Problem is the error body of every non-2xx response (shared/api/wire's document).
type Problem = wire.Problem

var titles = map[string]string{
	CodeInvalid:               "Invalid request",
	CodeUnauthenticated:       "Unauthenticated",
	CodeUntrustedPrincipal:    "Caller not trusted to name tenants",
	CodeUnknownRun:            "Unknown run",
	CodeTerminalRun:           "Run is terminal",
	CodeSuperseded:            "Superseded by a newer driver epoch",
	CodeConflict:              "Conflict",
	CodeStaleCursor:           "Cursor cannot be verified",
	CodeLogClosed:             "Event log closed",
	CodeSandboxGone:           "Sandbox gone",
	CodeUnsupported:           "Unsupported by the provider",
	CodeUnavailable:           "Temporarily unavailable",
	CodeForbiddenHost:         "Host not served",
	CodeTrustedCallerRequired: "Trusted caller required",
	CodeAppDriven:             "Run is driven by its app",
	CodeSandkeepDriven:        "Run is driven by sandkeep",
	CodeLockHeld:              "Lock held",
	CodeLockLost:              "Lock lost",
	CodeTooManyConnections:    "Too many push connections",
	CodeTooManySubscriptions:  "Too many subscriptions",
	CodeForbiddenOrigin:       "Origin not allowed",
	CodeTooManyWaiting:        "Too many waiting requests",
	CodeInvalidToken:          "Token not valid",
	CodeTokenExpired:          "Token expired",
	CodeTokenScope:            "Beyond the token's grant",
	CodeShipGap:               "Bytes past the position stored",
	CodeRateLimited:           "Ship rate exceeded",
	CodeInternal:              "Internal error",
}

// apiError is an error the handlers answer with a fixed status and code.
type apiError struct {
	status int
	code   string
	detail string
}

func (e *apiError) Error() string { return e.detail }

// refusals are the documented refusals: each sentinel with its status and code, in the
// order classify tests them.
var refusals = []struct {
	err    error
	status int
	code   string
}{
	{contract.ErrInvalid, http.StatusBadRequest, CodeInvalid},
	{contract.ErrUnknownRun, http.StatusNotFound, CodeUnknownRun},
	{contract.ErrTerminalRun, http.StatusGone, CodeTerminalRun},
	{contract.ErrSuperseded, http.StatusConflict, CodeSuperseded},
	{contract.ErrLogClosed, http.StatusConflict, CodeLogClosed},
	{contract.ErrSandboxGone, http.StatusConflict, CodeSandboxGone},
	{contract.ErrAppDriven, http.StatusConflict, CodeAppDriven},
	{contract.ErrSandkeepDriven, http.StatusConflict, CodeSandkeepDriven},
	{contract.ErrConflict, http.StatusConflict, CodeConflict},
	{keeper.ErrUnsupported, http.StatusNotImplemented, CodeUnsupported},
}

// classify maps an operation's error to its status and code. infra reports an error that
// is not the client's doing (logged in full, answered without its text).
func classify(err error) (status int, code string, infra bool) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, ae.code, ae.status >= 500
	}
	if errors.Is(err, contract.ErrNoTenant) {
		// Every handler's context carries its caller's tenant: none is a bug of ours,
		// never the client's, and retrying cannot help (so not 503).
		return http.StatusInternalServerError, CodeInternal, true
	}
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			return r.status, r.code, false
		}
	}
	// keeper.ErrUnavailable, a lost lock lease, a deadline, throttling and anything we do
	// not recognise: retryable from the client's point of view.
	return http.StatusServiceUnavailable, CodeUnavailable, true
}

// detailOf is the client-facing detail of err: for a refusal, its text from the sentinel
// on ("invalid input: runId: must be ...", "conflict: the cursor was not issued ..."):
// what the layers below prefixed (package, operation, backend) stays in the log. A fixed
// sentence for infrastructure errors (never internals).
func detailOf(err error, code string, infra bool) string {
	switch {
	case code == CodeInternal:
		return "internal error; the request id identifies it in the logs"
	case infra && errors.Is(err, context.DeadlineExceeded):
		return "the operation timed out; retry"
	case infra:
		return "temporarily unavailable; retry after the Retry-After delay"
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.detail
	}
	msg := strings.TrimSpace(err.Error())
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			if i := strings.Index(msg, r.err.Error()); i >= 0 {
				return msg[i:]
			}
			return r.err.Error()
		}
	}
	return msg
}

// writeProblem writes the problem+json body of status/code.
func writeProblem(w http.ResponseWriter, requestID string, status int, code, detail string) {
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		h.Set("Retry-After", retryAfterSeconds)
	}
	w.WriteHeader(status)
	b, _ := encodeJSON(Problem{
		Type:      wire.ProblemTypePrefix + code,
		Title:     titles[code],
		Status:    status,
		Detail:    detail,
		Code:      code,
		RequestID: requestID,
	})
	_, _ = w.Write(b)
}
