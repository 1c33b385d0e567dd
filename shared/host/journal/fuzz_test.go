package journal

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// refEncode is an independent reading of docs/design.md §6's enc before the cap: keep [A-Za-z0-9.-],
// every other byte of the UTF-8 id as "_" + two lowercase hex digits.
func refEncode(id string) string {
	var b strings.Builder
	for _, c := range []byte(id) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteString("_" + hex.EncodeToString([]byte{c}))
		}
	}
	return b.String()
}

// FuzzEncodeRoundTrip: Encode is total, emits only [A-Za-z0-9._-], never exceeds the cap;
// below the cap it is docs/design.md §6's plain escape and Decode inverts it for every id the stores
// accept; at or over the cap it ends in the id's hash and Decode refuses it.
func FuzzEncodeRoundTrip(f *testing.F) {
	for _, s := range []string{"a", "_", "run-1", "🙂", "a\x00b", "\xff", "x'; touch /tmp/p; '", "a.err",
		strings.Repeat("x", 199), strings.Repeat("x", 200), strings.Repeat("x", 201), strings.Repeat("/", 66),
		strings.Repeat("/", 67), strings.Repeat("x", 167) + "-0d4e2ca9e9cbced7a7a5380eb29e1a37"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		enc := Encode(id)
		if len(enc) > MaxNameLen || enc == "" && id != "" {
			t.Fatalf("Encode(%q) = %q: length %d", id, enc, len(enc))
		}
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; !isNameByte(c) && c != '_' {
				t.Fatalf("Encode(%q) = %q holds %q", id, enc, c)
			}
		}
		plain := refEncode(id)
		capped := enc != plain
		if capped {
			sum := sha256.Sum256([]byte(id))
			if len(enc) != MaxNameLen || !strings.HasSuffix(enc, "-"+hex.EncodeToString(sum[:])[:hashLen]) ||
				!strings.HasPrefix(plain, enc[:MaxNameLen-1-hashLen]) {
				t.Fatalf("Encode(%q) = %q: neither the plain escape %q nor its capped form", id, enc, plain)
			}
			if len(plain) <= MaxNameLen && !looksCapped(plain) {
				t.Fatalf("Encode(%q) capped a plain name %q below the cap", id, plain)
			}
			if back, ok := Decode(enc); ok {
				t.Fatalf("Decode(%q) of a capped name = %q", enc, back)
			}
			return
		}
		back, ok := Decode(enc)
		storable := contract.CheckStoreID("runId", id) == nil
		if ok != storable || ok && back != id {
			t.Fatalf("Decode(Encode(%q)) = %q, %v (id storable: %v)", id, back, ok, storable)
		}
		name := Name("t-1", id)
		for _, ext := range exts {
			if len(name) == MaxNameLen && looksCapped(name) {
				break
			}
			if tn, got, e, ok := SplitName(name + ext); ok != storable || ok && (tn != "t-1" || got != id || e != ext) {
				t.Fatalf("SplitName(%q) = %q %q %q %v", name+ext, tn, got, e, ok)
			}
		}
	})
}

// FuzzDecode: Decode of any token fails closed — what it accepts is canonical (Encode of
// the result is the token itself), a valid store id, never capped; everything else is
// refused without panicking.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{"", "a", "_41", "_2f", "_2F", "a_2fb", "_4", "a_", "_zz", "a b", "_c3_a9", "_c3",
		"_00", "a\nb", "_5f", "__", strings.Repeat("z", 200), strings.Repeat("z", 201),
		strings.Repeat("x", 167) + "-0d4e2ca9e9cbced7a7a5380eb29e1a37"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		id, ok := Decode(token)
		if !ok {
			if id != "" {
				t.Fatalf("refused Decode(%q) returned %q", token, id)
			}
			return
		}
		if Encode(id) != token {
			t.Fatalf("Decode accepted non-canonical %q (canonical %q for %q)", token, Encode(id), id)
		}
		if !utf8.ValidString(id) || contract.CheckStoreID("runId", id) != nil || looksCapped(token) {
			t.Fatalf("Decode(%q) = %q: not a storable id or a capped name", token, id)
		}
	})
}

// FuzzSentinel: the exit sentinel parser accepts exactly a JSON object of two members,
// __exit (an integer) and __nonce (this run's nonce, spelled literally), whatever its
// spacing; every SentinelLine parses back to its code; another run's sentinel never counts.
func FuzzSentinel(f *testing.F) {
	n := ExitNonce("r")
	for _, s := range []string{SentinelLine("r", 0), SentinelLine("r", -1), SentinelLine("other", 0),
		`{ "__nonce" : "` + n + `", "__exit" : 143 }`, `{"__exit":0,"__nonce":"` + n + `","x":1}`,
		`{"__exit":"0","__nonce":"` + n + `"}`, `{"__exit":1e2,"__nonce":"` + n + `"}`,
		`{"__exit":99999999999999999999,"__nonce":"` + n + `"}`, `{"__exit":0,"__exit":1,"__nonce":"` + n + `"}`,
		`{"__exit":0,"__nonce":"\u0031` + n[1:] + `"}`, `{"__EXIT":0,"__nonce":"` + n + `"}`, "", "{"} {
		f.Add("r", 0, []byte(s))
	}
	f.Fuzz(func(t *testing.T, runID string, code int, line []byte) {
		nonce := ExitNonce(runID)
		if got, ok := parseSentinel([]byte(SentinelLine(runID, code)), nonce); !ok || got != code {
			t.Fatalf("SentinelLine(%q, %d) parses as %d %v", runID, code, got, ok)
		}
		got, ok := parseSentinel(line, nonce)
		// Independent reading: exactly two members, __exit an integer, __nonce the nonce.
		want, wantOK := 0, false
		trimmed := bytes.TrimSpace(line)
		var m map[string]json.RawMessage
		if len(trimmed) <= sentinelMax && len(trimmed) > 0 && trimmed[0] == '{' && bytes.Contains(trimmed, []byte(nonce)) &&
			json.Unmarshal(trimmed, &m) == nil && len(m) == 2 {
			var nn string
			if json.Unmarshal(m["__nonce"], &nn) == nil && nn == nonce {
				if c, err := strconv.Atoi(string(m["__exit"])); err == nil {
					want, wantOK = c, true
				}
			}
		}
		if ok != wantOK || got != want {
			t.Fatalf("parseSentinel(%q) = %d %v, want %d %v", line, got, ok, want, wantOK)
		}
		if ok && ExitNonce(runID+"x") != nonce {
			if _, other := parseSentinel(line, ExitNonce(runID+"x")); other {
				t.Fatalf("%q counts as the sentinel of two runs", line)
			}
		}
		// The probe finds it as a complete last line, and never in a partial one.
		if !bytes.ContainsRune(line, '\n') {
			if c, found := findSentinel(append(append([]byte{}, line...), '\n'), nonce); found != ok || found && c != got {
				t.Fatalf("findSentinel over %q = %d %v, parse says %d %v", line, c, found, got, ok)
			}
			if _, found := findSentinel(line, nonce); found {
				t.Fatalf("findSentinel found a sentinel in an unterminated line %q", line)
			}
		}
	})
}
