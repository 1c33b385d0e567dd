// Package termsafe is the one rule for what the CLI lets reach a terminal: nothing an agent
// or a server sends may act as a terminal control. C0 controls other than newline and tab,
// DEL, C1 controls (U+0080–U+009F), the bidi overrides and isolates (U+202A–U+202E,
// U+2066–U+2069) and bytes that are not UTF-8 are written as `\uXXXX` (`\ufffd` for a
// byte that is not UTF-8). In a JSON line these runes can only stand inside a string, so
// the escaped line is the same JSON value; in a status line `\u001b` is a visible form.
package termsafe

import (
	"io"
	"unicode/utf8"
)

// Unsafe reports whether r must not reach a terminal as itself.
func Unsafe(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20 || r == 0x7f:
		return true
	case r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

const hexDigits = "0123456789abcdef"

// Append appends p to dst with every unsafe rune escaped.
func Append(dst, p []byte) []byte {
	for i := 0; i < len(p); {
		c := p[i]
		if c >= 0x20 && c < 0x7f || c == '\n' || c == '\t' {
			dst = append(dst, c) // the common case: printable ASCII
			i++
			continue
		}
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n == 1 {
			// A byte that is not UTF-8 (a lone 0x9b is CSI to an 8-bit terminal).
			dst = append(dst, `\ufffd`...)
			i++
			continue
		}
		if Unsafe(r) {
			dst = append(dst, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
		} else {
			dst = append(dst, p[i:i+n]...)
		}
		i += n
	}
	return dst
}

// String returns s with every unsafe rune escaped.
func String(s string) string { return string(Append(nil, []byte(s))) }

// Writer escapes everything written through it. Each Write is escaped on its own (a rune
// split across two writes is two invalid bytes): the CLI writes whole lines.
type Writer struct{ w io.Writer }

// NewWriter returns a Writer writing to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write escapes p and writes it whole; it reports len(p) on success.
func (t *Writer) Write(p []byte) (int, error) {
	if _, err := t.w.Write(Append(make([]byte, 0, len(p)+16), p)); err != nil {
		return 0, err
	}
	return len(p), nil
}
