package shiptoken

import (
	"crypto/hmac"
	"crypto/sha256"
)

// cursorMAC is the cursor codec's MAC (shared/api/httpapi/cursor.go), restated here because this
// package imports only the standard library.
func cursorMAC(key []byte, payload string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("sandkeep/cursor/v1\n"))
	m.Write([]byte(payload))
	return m.Sum(nil)
}
