package apiclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// ErrUnauthenticated: the API named no tenant for the request's credentials (HTTP 401).
var ErrUnauthenticated = errors.New("unauthenticated")

// ErrUnsupported: the server or the run's provider does not offer what was asked (501
// unsupported). The driver's side sees it as keeper.ErrUnsupported (shared/host/driver/apitransport).
var ErrUnsupported = errors.New("unsupported")

// ErrUnavailable: the service was temporarily unavailable (503 unavailable, or a 429,
// 502, 503 or 504 without a code this client knows); a later call may succeed. The driver's
// side sees it as keeper.ErrUnavailable (shared/host/driver/apitransport).
var ErrUnavailable = errors.New("temporarily unavailable")

// ErrStaleCursor: the API could not verify the cursor (409 stale-cursor; a server that
// restarted with another cursor key). It is a conflict no retry heals, so it also matches
// contract.ErrConflict; a new attach issues a cursor the server verifies.
var ErrStaleCursor = fmt.Errorf("stale cursor: %w", contract.ErrConflict)

// Error is a non-2xx answer of the API. errors.Is matches the sandbox sentinel of its code
// (superseded → contract.ErrSuperseded, unknown-run → contract.ErrUnknownRun, …; unsupported
// and unavailable → ErrUnsupported and ErrUnavailable; unauthenticated →
// ErrUnauthenticated; stale-cursor → ErrStaleCursor).
type Error struct {
	Status     int           // the HTTP status
	Code       string        // the problem's stable code ("" when the body was not problem+json)
	Title      string        // the problem's title
	Detail     string        // the problem's detail, or the start of a foreign body
	RequestID  string        // the request id (body or X-Request-Id)
	RetryAfter time.Duration // the answer's Retry-After (0 = none)
}

// Error reads like "superseded (409): the cursor's epoch 1 is older than 2 [request r-1]".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("sandkeep API: ")
	if e.Code != "" {
		b.WriteString(e.Code)
	} else {
		b.WriteString(http.StatusText(e.Status))
	}
	fmt.Fprintf(&b, " (%d)", e.Status)
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	if e.RequestID != "" {
		b.WriteString(" [request " + e.RequestID + "]")
	}
	return b.String()
}

// codeSentinels maps each problem code to the sentinel it stands for.
var codeSentinels = map[string]error{
	wire.CodeInvalid:         contract.ErrInvalid,
	wire.CodeUnauthenticated: ErrUnauthenticated,
	wire.CodeUnknownRun:      contract.ErrUnknownRun,
	wire.CodeTerminalRun:     contract.ErrTerminalRun,
	wire.CodeSuperseded:      contract.ErrSuperseded,
	wire.CodeConflict:        contract.ErrConflict,
	wire.CodeStaleCursor:     ErrStaleCursor,
	wire.CodeLogClosed:       contract.ErrLogClosed,
	wire.CodeSandboxGone:     contract.ErrSandboxGone,
	wire.CodeUnsupported:     ErrUnsupported,
	wire.CodeUnavailable:     ErrUnavailable,
}

// Unwrap returns the sentinel of the code; an answer without a code this client knows
// (API Gateway's own, a proxy's, a newer server's) falls back on its status (401 unauthenticated, 429/502/503/504 unavailable).
func (e *Error) Unwrap() error {
	if s, ok := codeSentinels[e.Code]; ok {
		return s
	}
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrUnauthenticated
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return ErrUnavailable
	}
	return nil
}

// problem is the problem+json body, plus the member API Gateway's own answers carry
// ({"message":"Forbidden"}).
type problem struct {
	wire.Problem
	Message string `json:"message"`
}

// problemError reads a non-2xx answer. A body that is not a problem (API Gateway's, a
// proxy's) keeps its status and the start of its text.
func problemError(resp *http.Response, data []byte) *Error {
	e := &Error{
		Status:     resp.StatusCode,
		RequestID:  resp.Header.Get("X-Request-Id"),
		RetryAfter: parseRetryAfter(resp.Header, time.Now()),
	}
	var p problem
	if json.Unmarshal(data, &p) == nil {
		e.Code, e.Title, e.Detail = p.Code, p.Title, p.Detail
		if p.RequestID != "" {
			e.RequestID = p.RequestID
		}
		if e.Detail == "" {
			e.Detail = p.Message
		}
	}
	if e.Detail == "" && e.Code == "" {
		d := strings.ToValidUTF8(strings.TrimSpace(string(data)), "")
		if len(d) > 200 {
			d = strings.ToValidUTF8(d[:200], "") + "…"
		}
		e.Detail = d
	}
	return e
}
