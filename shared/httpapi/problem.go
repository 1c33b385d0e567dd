package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/wire"
)

// Problem codes (the `code` member of every error body; shared/wire holds them).
const (
	CodeInvalid         = wire.CodeInvalid
	CodeUnauthenticated = wire.CodeUnauthenticated
	// CodeUntrustedPrincipal is answered by the Lambda adapter (shared/awsfn), never here.
	CodeUntrustedPrincipal = wire.CodeUntrustedPrincipal
	CodeUnknownRun         = wire.CodeUnknownRun
	CodeTerminalRun        = wire.CodeTerminalRun
	CodeSuperseded         = wire.CodeSuperseded
	CodeConflict           = wire.CodeConflict
	CodeLogClosed          = wire.CodeLogClosed
	CodeSandboxGone        = wire.CodeSandboxGone
	CodeUnsupported        = wire.CodeUnsupported
	CodeUnavailable        = wire.CodeUnavailable
	CodeForbiddenHost      = wire.CodeForbiddenHost
	// CodeInternal is a bug of ours (HTTP 500); never a client's mistake.
	CodeInternal = wire.CodeInternal
)

// ProblemContentType is the media type of error bodies (RFC 9457).
const ProblemContentType = wire.ProblemContentType

// retryAfterSeconds is the Retry-After of a 503: lock waits and throttling clear quickly.
const retryAfterSeconds = "1"

// Problem is the error body of every non-2xx response (shared/wire's document).
type Problem = wire.Problem

var titles = map[string]string{
	CodeInvalid:            "Invalid request",
	CodeUnauthenticated:    "Unauthenticated",
	CodeUntrustedPrincipal: "Caller not trusted to name tenants",
	CodeUnknownRun:         "Unknown run",
	CodeTerminalRun:        "Run is terminal",
	CodeSuperseded:         "Superseded by a newer driver epoch",
	CodeConflict:           "Conflict",
	CodeLogClosed:          "Event log closed",
	CodeSandboxGone:        "Sandbox gone",
	CodeUnsupported:        "Unsupported by the provider",
	CodeUnavailable:        "Temporarily unavailable",
	CodeForbiddenHost:      "Host not served",
	CodeInternal:           "Internal error",
}

// apiError is an error the handlers answer with a fixed status and code.
type apiError struct {
	status int
	code   string
	detail string
}

func (e *apiError) Error() string { return e.detail }

// classify maps an operation's error to its status and code. infra reports an error that
// is not the client's doing (logged in full, answered without its text).
func classify(err error) (status int, code string, infra bool) {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.code, ae.status >= 500
	case errors.Is(err, sandbox.ErrInvalid):
		return http.StatusBadRequest, CodeInvalid, false
	case errors.Is(err, sandbox.ErrUnknownRun):
		return http.StatusNotFound, CodeUnknownRun, false
	case errors.Is(err, sandbox.ErrTerminalRun):
		return http.StatusGone, CodeTerminalRun, false
	case errors.Is(err, sandbox.ErrSuperseded):
		return http.StatusConflict, CodeSuperseded, false
	case errors.Is(err, sandbox.ErrLogClosed):
		return http.StatusConflict, CodeLogClosed, false
	case errors.Is(err, sandbox.ErrSandboxGone):
		return http.StatusConflict, CodeSandboxGone, false
	case errors.Is(err, sandbox.ErrConflict):
		return http.StatusConflict, CodeConflict, false
	case errors.Is(err, keeper.ErrUnsupported):
		return http.StatusNotImplemented, CodeUnsupported, false
	}
	// keeper.ErrUnavailable, a lost lock lease, a deadline, throttling and anything we do
	// not recognise: retryable from the client's point of view.
	return http.StatusServiceUnavailable, CodeUnavailable, true
}

// detailOf is the client-facing detail of err: its text for the client's own mistakes and
// the documented refusals, a fixed sentence for infrastructure errors (never internals).
func detailOf(err error, code string, infra bool) string {
	switch {
	case code == CodeInternal:
		return "internal error; the request id identifies it in the logs"
	case infra && errors.Is(err, context.DeadlineExceeded):
		return "the operation timed out; retry"
	case infra:
		return "temporarily unavailable; retry after the Retry-After delay"
	}
	return strings.TrimSpace(err.Error())
}

// writeProblem writes the problem+json body of status/code.
func writeProblem(w http.ResponseWriter, requestID string, status int, code, detail string) {
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	if status == http.StatusServiceUnavailable {
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
