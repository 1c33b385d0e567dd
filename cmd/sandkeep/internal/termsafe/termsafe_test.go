package termsafe

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestUnsafeRunes: exactly C0 but newline and tab, DEL, C1 and the bidi overrides and
// isolates are unsafe; their neighbours are not.
func TestUnsafeRunes(t *testing.T) {
	for r := rune(0); r <= 0x3000; r++ {
		want := (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f) ||
			(r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
		if Unsafe(r) != want {
			t.Errorf("Unsafe(%U) = %v, want %v", r, !want, want)
		}
	}
	for _, r := range []rune{'a', ' ', '~', 'é', 0xa0, 0x2029, 0x2065, 0x206a, 0x202f, utf8.RuneError, '😀'} {
		if Unsafe(r) {
			t.Errorf("Unsafe(%U): a printable rune", r)
		}
	}
}

// TestStringEscapes: a hostile agent's output (an OSC title change, an SGR colour), a C1
// CSI, a bidi override and a byte that is not UTF-8 come out as visible text with no
// control left in it.
func TestStringEscapes(t *testing.T) {
	cases := map[string]string{
		"\x1b]0;PWNED\x07\x1b[31mRED":  `\u001b]0;PWNED\u0007\u001b[31mRED`,
		"a\u009b31mb":                  `a\u009b31mb`,
		"file\u202etxt.exe":            `file\u202etxt.exe`,
		"\u2066x\u2069":                `\u2066x\u2069`,
		"del\x7f cr\r bs\b nul\x00":    `del\u007f cr\u000d bs\u0008 nul\u0000`,
		"line 1\nline\t2":              "line 1\nline\t2",
		"lone \x9b byte, cut \xe2\x80": `lone \ufffd byte, cut \ufffd\ufffd`,
		"héllo wörld 😀 \u00a0\u2028":   "héllo wörld 😀 \u00a0\u2028",
	}
	for in, want := range cases {
		got := String(in)
		if got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
		for _, r := range got {
			if Unsafe(r) {
				t.Errorf("String(%q) kept %U", in, r)
			}
		}
	}
}

// TestJSONStaysJSON: a JSON line escaped is still JSON, and decodes to the same value
// (strings keep their controls as data; only the bytes on the terminal change).
func TestJSONStaysJSON(t *testing.T) {
	v := map[string]any{"line": "\x1b[31mred\u009b\u202e\x7f", "n": 1.0, "nested": []any{"\u2066ok\u2069", "tab\there"}}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	esc := Append(nil, b)
	if bytes.ContainsAny(esc, "\x1b\x7f\u009b\u202e\u2066") {
		t.Fatalf("escaped JSON keeps a control: %q", esc)
	}
	var back map[string]any
	if err := json.Unmarshal(esc, &back); err != nil {
		t.Fatalf("escaped JSON %q does not decode: %v", esc, err)
	}
	if back["line"] != v["line"] || back["nested"].([]any)[0] != "\u2066ok\u2069" {
		t.Fatalf("decoded %v, want %v", back, v)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("closed") }

// TestWriter: a Writer escapes each write and reports the caller's length.
func TestWriter(t *testing.T) {
	var out strings.Builder
	w := NewWriter(&out)
	n, err := w.Write([]byte("\x1b[2Jx\n"))
	if err != nil || n != 6 || out.String() != "\\u001b[2Jx\n" {
		t.Fatalf("Write: %d %v %q", n, err, out.String())
	}
	if _, err := NewWriter(failingWriter{}).Write([]byte("x")); err == nil {
		t.Fatal("a failing writer's error was lost")
	}
}
