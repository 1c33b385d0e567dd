// Package shiptoken mints and verifies ship tokens: the one credential a sandbox's shipper
// holds (docs/design.md §8.2). A token names one run of one tenant at one epoch and expires; it
// lets its holder append to, heartbeat and finish that run and nothing else. It is an
// HMAC-SHA256 under the service's cursor key with a domain of its own, so a cursor is never
// a token and a token never a cursor. It imports only the standard library: the shipper's
// side and the server's both use it.
package shiptoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// Prefix starts every ship token, so a token is told from a cursor (and from a JWT) by
// its shape before any MAC is checked.
const Prefix = "skship1."

// MaxLen bounds a token before any decoding (run ids are at most 256 characters).
const MaxLen = 2048

// domain separates the ship MAC from any other use of the key (the cursor's is
// "sandkeep/cursor/v1\n").
const domain = "sandkeep/ship/v1\n"

var (
	// ErrInvalid: the token was not minted under this key for these claims (forged,
	// tampered, malformed, or another key's).
	ErrInvalid = errors.New("ship token not issued by this service")
	// ErrExpired: the token is genuine but its lifetime has passed.
	ErrExpired = errors.New("ship token expired")
)

// Claims is what a ship token grants: appending to, heartbeating and finishing RunID of
// Tenant while the run's driver epoch is Epoch, until Expires. Next, Src and Cancel are the
// log cursor the server last answered at (0: unknown) and whether that epoch saw a cancel:
// hints that save the server a read, never trusted for exactly-once (the log's fenced,
// position-aligned appends are).
type Claims struct {
	Tenant  string
	RunID   string
	Epoch   int64
	Expires time.Time
	Next    int64
	Src     int64
	Cancel  bool
}

// wireClaims is the signed payload; the expiry in Unix milliseconds so a token's text is
// one for one instant.
type wireClaims struct {
	Tenant  string `json:"t"`
	RunID   string `json:"r"`
	Epoch   int64  `json:"e"`
	Expires int64  `json:"x"`
	Next    int64  `json:"n,omitempty"`
	Src     int64  `json:"s,omitempty"`
	Cancel  bool   `json:"c,omitempty"`
}

// macIn is the MAC of payload under key in one use's domain (a ship token's, a push
// ticket's), so no credential of one use verifies as another's.
func macIn(domain string, key []byte, payload string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(domain))
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// Mint returns the token of c under key: Prefix + base64url(JSON claims) + "." +
// base64url(HMAC).
func Mint(key []byte, c Claims) string {
	return seal(key, domain, Prefix, wireClaims{Tenant: c.Tenant, RunID: c.RunID, Epoch: c.Epoch, Expires: c.Expires.UnixMilli(),
		Next: c.Next, Src: c.Src, Cancel: c.Cancel})
}

// seal is prefix + base64url(JSON of v) + "." + base64url(the MAC in domain).
func seal(key []byte, domain, prefix string, v any) string {
	b, _ := json.Marshal(v)
	payload := base64.RawURLEncoding.EncodeToString(b)
	return prefix + payload + "." + base64.RawURLEncoding.EncodeToString(macIn(domain, key, payload))
}

// open returns the JSON payload of a credential sealed under key in domain with prefix,
// ErrInvalid for anything else.
func open(key []byte, domain, prefix, token string) ([]byte, error) {
	if len(token) > MaxLen || !strings.HasPrefix(token, prefix) {
		return nil, ErrInvalid
	}
	payload, sig, ok := strings.Cut(token[len(prefix):], ".")
	if !ok {
		return nil, ErrInvalid
	}
	// Strict: a lenient decoder ignores the last character's unused bits, so several
	// spellings of one signature would verify.
	got, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil || !hmac.Equal(got, macIn(domain, key, payload)) {
		return nil, ErrInvalid
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(payload)
	if err != nil {
		return nil, ErrInvalid
	}
	return raw, nil
}

// Looks reports whether s has a ship token's shape (its prefix); nothing is verified.
func Looks(s string) bool { return strings.HasPrefix(s, Prefix) }

// Verify returns token's claims when key minted it and it has not expired at now: ErrInvalid
// for anything not minted under key, ErrExpired (with the claims) for a genuine token past
// its expiry.
func Verify(key []byte, token string, now time.Time) (Claims, error) {
	raw, err := open(key, domain, Prefix, token)
	if err != nil {
		return Claims{}, err
	}
	var w wireClaims
	if err := json.Unmarshal(raw, &w); err != nil || w.Tenant == "" || w.RunID == "" || w.Epoch < 1 || w.Next < 0 || w.Src < 0 {
		return Claims{}, ErrInvalid
	}
	c := Claims{Tenant: w.Tenant, RunID: w.RunID, Epoch: w.Epoch, Expires: time.UnixMilli(w.Expires),
		Next: w.Next, Src: w.Src, Cancel: w.Cancel}
	if !now.Before(c.Expires) {
		return c, ErrExpired
	}
	return c, nil
}
