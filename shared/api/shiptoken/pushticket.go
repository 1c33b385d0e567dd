package shiptoken

import (
	"encoding/json"
	"time"
)

// Push tickets (docs/design.md §8.1): a WebSocket API authenticates $connect by IAM or a
// Lambda authorizer, never by JWT, so in a JWT deployment the JWT-authorized HTTP API
// issues a short-lived ticket naming the caller's tenant, and the push function's $connect
// verifies it. A ticket grants opening push connections for its tenant until it expires and
// nothing else: it is MACed under the cursor key in a domain of its own, so it is never a
// cursor or a ship token, and neither of those is a ticket.
const (
	// PushPrefix starts every push ticket.
	PushPrefix = "skpush1."
	// PushTicketTTL is a ticket's lifetime: long enough to connect with, short enough
	// that a ticket copied out of a URL (the browser's upgrade carries it in the query)
	// is soon worthless.
	PushTicketTTL = time.Minute
	pushDomain    = "sandkeep/push/v1\n"
)

type wireTicket struct {
	Tenant  string `json:"t"`
	Expires int64  `json:"x"`
}

// MintPushTicket returns the push ticket of tenant until expires under key.
func MintPushTicket(key []byte, tenant string, expires time.Time) string {
	return seal(key, pushDomain, PushPrefix, wireTicket{Tenant: tenant, Expires: expires.UnixMilli()})
}

// VerifyPushTicket returns the tenant of ticket when key minted it and it has not expired
// at now: ErrInvalid for anything not minted under key as a push ticket, ErrExpired for a
// genuine ticket past its expiry.
func VerifyPushTicket(key []byte, ticket string, now time.Time) (string, error) {
	raw, err := open(key, pushDomain, PushPrefix, ticket)
	if err != nil {
		return "", err
	}
	var w wireTicket
	if err := json.Unmarshal(raw, &w); err != nil || w.Tenant == "" {
		return "", ErrInvalid
	}
	if !now.Before(time.UnixMilli(w.Expires)) {
		return "", ErrExpired
	}
	return w.Tenant, nil
}
