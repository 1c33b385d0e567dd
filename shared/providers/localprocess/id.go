package localprocess

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// maxKeyLen bounds the key part of an id, keeping directory names well under NAME_MAX.
const maxKeyLen = 128

// randomLen is the length of the random part of an id: 16 lowercase hex digits.
const randomLen = 16

// checkKey reports whether key can name sandboxes: 1–128 chars of [A-Za-z0-9_-]. No dot, so
// the prefix "<key>." of one key is never the prefix of another key's ids, and no path
// element such as "." or ".." can be formed.
func checkKey(field, key string) error {
	if key == "" || len(key) > maxKeyLen {
		return contract.Invalid(field, "must be 1-%d characters", maxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if !isKeyByte(key[i]) {
			return contract.Invalid(field, "character %q outside [A-Za-z0-9_-]", key[i])
		}
	}
	return nil
}

func isKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// parseID splits an id of the form <key>.<16 lowercase hex> and returns its key; anything
// else (a path, a traversal, another provider's id) is ErrInvalid.
func parseID(field, id string) (key string, err error) {
	key, rnd, ok := strings.Cut(id, ".")
	if !ok || len(rnd) != randomLen {
		return "", contract.Invalid(field, "%q is not of the form <key>.<%d hex>", id, randomLen)
	}
	if err := checkKey(field, key); err != nil {
		return "", err
	}
	for i := 0; i < len(rnd); i++ {
		if c := rnd[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", contract.Invalid(field, "%q is not of the form <key>.<%d hex>", id, randomLen)
		}
	}
	return key, nil
}

// mintID returns a fresh id <key>.<random> for a checked key.
func mintID(key string) (string, error) {
	var b [randomLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("local-process: random id: %w", err)
	}
	return key + "." + hex.EncodeToString(b[:]), nil
}
