package wire

// Problem codes (the `code` member of every error body).
const (
	CodeInvalid         = "invalid"
	CodeUnauthenticated = "unauthenticated"
	// CodeUntrustedPrincipal (403): an IAM caller that is not a session of a role trusted to
	// name tenants (the Lambdas' TrustedRoleArns).
	CodeUntrustedPrincipal = "untrusted-principal"
	CodeUnknownRun         = "unknown-run"
	CodeTerminalRun        = "terminal-run"
	CodeSuperseded         = "superseded"
	CodeConflict           = "conflict"
	// CodeStaleCursor (409): a cursor the server cannot verify, most often one signed with
	// another key (a dev server restarted with a new random key); attach again.
	CodeStaleCursor = "stale-cursor"
	CodeLogClosed   = "log-closed"
	CodeSandboxGone = "sandbox-gone"
	CodeUnsupported = "unsupported"
	CodeUnavailable = "unavailable"
	// CodeForbiddenHost (403): the dev server was reached under a Host other than its own
	// loopback address (a DNS-rebinding page).
	CodeForbiddenHost = "forbidden-host"
	// CodeTrustedCallerRequired (403): a store route (/v1/store/...) called by an end user
	// (JWT); only trusted callers (IAM trusted roles, the dev server) may call them.
	CodeTrustedCallerRequired = "trusted-caller-required"
	// CodeAppDriven (409): start or attach of a run created through the store routes; its
	// app drives it.
	CodeAppDriven = "app-driven-run"
	// CodeSandkeepDriven (409): a store route's write to a run sandkeep's start drives.
	CodeSandkeepDriven = "sandkeep-driven-run"
	// CodeLockHeld (409): a lock acquire's wait ended with the lock still held; call again.
	CodeLockHeld = "lock-held"
	// CodeLockLost (409): a renew whose token does not hold the lock (any more).
	CodeLockLost = "lock-lost"
	// CodeTooManyConnections (429): the tenant holds its bound of push connections on
	// this server (api/asyncapi.yaml).
	CodeTooManyConnections = "too-many-connections"
	// CodeTooManySubscriptions: a push connection holds its bound of subscriptions.
	CodeTooManySubscriptions = "too-many-subscriptions"
	// CodeForbiddenOrigin (403): a browser request from an origin the dev server does not
	// allow (its own, and those of sandkeep dev --allow-origin).
	CodeForbiddenOrigin = "forbidden-origin"
	// CodeTooManyWaiting (429, with Retry-After): the caller's tenant already holds its
	// bound of waiting requests (long polls, waiting pumps) on this server.
	CodeTooManyWaiting = "too-many-waiting"
	// CodeInvalidToken (401): a ship route without a ship token this service minted
	// (absent, forged, tampered, another key's), or with another credential beside it; a
	// JWT deployment's push $connect without a push ticket this service minted.
	CodeInvalidToken = "invalid-token"
	// CodeTokenExpired (401): a genuine ship token or push ticket past its expiry.
	CodeTokenExpired = "token-expired"
	// CodeTokenScope (403): a ship token used beyond its grant: on another route, for
	// another run, or at an epoch a takeover superseded; a push $connect naming a tenant
	// beside its ticket.
	CodeTokenScope = "token-scope"
	// CodeShipGap (409): a ship request's bytes start past the position stored; the
	// Sandkeep-Next header names where to send from.
	CodeShipGap = "ship-gap"
	// CodeRateLimited (429, with Retry-After): the run's shipper exceeded its append rate.
	CodeRateLimited = "rate-limited"
	// CodeInternal is a bug of the service (HTTP 500); never a client's mistake.
	CodeInternal = "internal"
)

// ProblemContentType is the media type of error bodies (RFC 9457).
const ProblemContentType = "application/problem+json"

// ProblemTypePrefix prefixes the code in a problem's type URI.
const ProblemTypePrefix = "urn:sandkeep:problem:"

// Problem is the error body of every non-2xx response.
type Problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      string `json:"code"`
	RequestID string `json:"requestId"`
}
