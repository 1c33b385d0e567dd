package httpapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// MinCursorKeyLen is the shortest cursor key New accepts.
const MinCursorKeyLen = 16

// maxCursorLen bounds a token before any decoding (run ids are at most 256 chars).
const maxCursorLen = 2048

// cursorDomain separates the cursor MAC from any other use of the key.
const cursorDomain = "sandkeep/cursor/v1\n"

// errBadCursor: the token was not issued by this key (forged, tampered or malformed).
var errBadCursor = errors.New("cursor not issued by this service")

// cursorClaims is what a cursor token carries: the docs/design.md §2.4 cursor plus whose it is, and
// whether its epoch has seen a cancel (the in-band marker lies behind a cursor once
// stepped over, so the token remembers it: cancelRequested stays true for the epoch).
type cursorClaims struct {
	RunID  string `json:"runId"`
	Tenant string `json:"tenant"`
	Epoch  int64  `json:"epoch"`
	Next   int64  `json:"next"`
	Src    int64  `json:"src"`
	Cancel bool   `json:"cancel,omitempty"`
}

func (c cursorClaims) cursor() contract.Cursor {
	return contract.Cursor{Epoch: c.Epoch, Next: c.Next, Src: c.Src}
}

// cursorCodec signs and opens cursor tokens: base64url(JSON claims) "." base64url(HMAC).
type cursorCodec struct{ key []byte }

func (c cursorCodec) mac(payload string) []byte {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(cursorDomain))
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// sign returns the token of cur for the run of tenant; cancel: cur's epoch saw a cancel.
func (c cursorCodec) sign(tenant, runID string, cur contract.Cursor, cancel bool) string {
	b, _ := json.Marshal(cursorClaims{RunID: runID, Tenant: tenant, Epoch: cur.Epoch, Next: cur.Next, Src: cur.Src, Cancel: cancel})
	payload := base64.RawURLEncoding.EncodeToString(b)
	return payload + "." + base64.RawURLEncoding.EncodeToString(c.mac(payload))
}

// open verifies token's signature and returns its claims; anything not signed by this key
// is errBadCursor.
func (c cursorCodec) open(token string) (cursorClaims, error) {
	if len(token) > maxCursorLen {
		return cursorClaims{}, errBadCursor
	}
	payload, sig, ok := strings.Cut(token, ".")
	if !ok {
		return cursorClaims{}, errBadCursor
	}
	// Strict: a lenient decoder ignores the last character's unused bits, so 16 spellings
	// of one signature would all verify (a tampered token accepted).
	got, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil || !hmac.Equal(got, c.mac(payload)) {
		return cursorClaims{}, errBadCursor
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return cursorClaims{}, errBadCursor
	}
	var cl cursorClaims
	if err := json.Unmarshal(raw, &cl); err != nil {
		return cursorClaims{}, errBadCursor
	}
	return cl, nil
}
