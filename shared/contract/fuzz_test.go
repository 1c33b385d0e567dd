package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// The fuzz targets of docs/design.md §12's parsing edges: `make fuzz` runs each for FUZZTIME, and
// plain `go test` replays the seeds below plus the grown corpus under testdata/fuzz.

// FuzzParseRunStatus: exactly the five statuses parse, each to itself; everything else is
// ErrInvalid (no case folding, no trimming).
func FuzzParseRunStatus(f *testing.F) {
	for _, s := range []string{"running", "interrupted", "completed", "failed", "aborted",
		"", "Running", " running", "running\x00", "completed\n", "abort", "ABORTED"} {
		f.Add(s)
	}
	known := map[string]bool{"running": true, "interrupted": true, "completed": true, "failed": true, "aborted": true}
	f.Fuzz(func(t *testing.T, s string) {
		st, err := ParseRunStatus(s)
		if known[s] {
			if err != nil || string(st) != s {
				t.Fatalf("ParseRunStatus(%q) = %q, %v", s, st, err)
			}
			if st.Terminal() != (s == "completed" || s == "failed" || s == "aborted") {
				t.Fatalf("%q.Terminal() = %v", s, st.Terminal())
			}
			return
		}
		if !errors.Is(err, ErrInvalid) || st != "" {
			t.Fatalf("ParseRunStatus(%q) = %q, %v; want ErrInvalid", s, st, err)
		}
		if !strings.Contains(err.Error(), "status") {
			t.Fatalf("error %q does not name the field", err)
		}
	})
}

// FuzzFieldJSON: a patch member reads null as Clear, any other value as Set of exactly
// what encoding/json reads into T, and an absent key as left alone; encoding and decoding
// again is a fixed point, and a left-alone member is never encoded.
func FuzzFieldJSON(f *testing.F) {
	for _, s := range []string{`null`, ` null `, `1`, `-9223372036854775808`, `1.5`, `1e3`, `"x"`,
		`"\u0000\ud800"`, `true`, `false`, `{}`, `[]`, `{"message":"m","code":"c"}`,
		`{"Message":"case"}`, `"completed"`, `"\xff"`, `nul`, ``, `{"a":[1,{"b":null}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkField[int64](t, b)
		checkField[string](t, b)
		checkField[bool](t, b)
		checkField[RunStatus](t, b)
		checkField[RunError](t, b)
		checkField[json.RawMessage](t, b)
		checkPatch(t, b)
	})
}

// checkField checks one Field[T] against encoding/json's own reading of b.
func checkField[T any](t *testing.T, b []byte) {
	t.Helper()
	var fld Field[T]
	err := json.Unmarshal(b, &fld)
	var direct T
	derr := json.Unmarshal(b, &direct)
	isNull := bytes.Equal(bytes.TrimSpace(b), []byte("null"))
	switch {
	case err != nil:
		if derr == nil && !isNull {
			t.Fatalf("Field[%T] refused %q that encoding/json reads: %v", direct, b, err)
		}
		if !fld.IsZero() {
			t.Fatalf("Field[%T]: a refused %q changed the field", direct, b)
		}
		return
	case isNull:
		if !fld.IsClear() || fld.IsSet() || fld.IsZero() {
			t.Fatalf("Field[%T]: %q is not Clear", direct, b)
		}
		if fld.Apply(&direct) != nil {
			t.Fatalf("Field[%T]: Clear applied is not absent", direct)
		}
	default:
		if derr != nil {
			t.Fatalf("Field[%T] read %q that encoding/json refuses (%v)", direct, b, derr)
		}
		v, ok := fld.Value()
		if !ok || !fld.IsSet() || fld.IsClear() || fld.IsZero() {
			t.Fatalf("Field[%T]: %q is not Set", direct, b)
		}
		if !reflect.DeepEqual(v, direct) {
			t.Fatalf("Field[%T]: %q set %#v, encoding/json reads %#v", direct, b, v, direct)
		}
		if p := fld.Apply(nil); p == nil || !reflect.DeepEqual(*p, direct) {
			t.Fatalf("Field[%T]: Set applied to absent is %v", direct, p)
		}
	}
	// Round trip: encode, decode, encode again is a fixed point, state preserved.
	out, err := json.Marshal(fld)
	if err != nil {
		t.Fatalf("Field[%T]: marshal of %q: %v", direct, b, err)
	}
	var back Field[T]
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatalf("Field[%T]: %q (from %q) does not decode: %v", direct, out, b, err)
	}
	out2, _ := json.Marshal(back)
	if back.IsSet() != fld.IsSet() || back.IsClear() != fld.IsClear() || !bytes.Equal(out, out2) {
		t.Fatalf("Field[%T]: round trip %q -> %q -> %q changed state", direct, b, out, out2)
	}
	// In a struct with omitzero: left alone is omitted; set and clear are kept.
	type holder struct {
		F Field[T] `json:"f,omitzero"`
	}
	hb, err := json.Marshal(holder{F: fld})
	if err != nil {
		t.Fatal(err)
	}
	var h holder
	if err := json.Unmarshal(hb, &h); err != nil || h.F.IsSet() != fld.IsSet() || h.F.IsClear() != fld.IsClear() {
		t.Fatalf("Field[%T] in a struct: %s -> %+v, %v", direct, hb, h, err)
	}
	if eb, _ := json.Marshal(holder{}); string(eb) != `{}` {
		t.Fatalf("a left-alone Field[%T] is encoded: %s", direct, eb)
	}
}

// checkPatch: any JSON object decodes into a RunPatch or is refused; a patch that decodes
// and passes Check round-trips to a fixed point and applies without panicking.
func checkPatch(t *testing.T, b []byte) {
	t.Helper()
	var p RunPatch
	if json.Unmarshal(b, &p) != nil {
		return
	}
	cerr := p.Check()
	if st, ok := p.Status.Value(); ok {
		// A decoded usage is always JSON, so the status is all Check can refuse.
		if _, perr := ParseRunStatus(string(st)); (perr == nil) != (cerr == nil) {
			t.Fatalf("Check(%q) = %v, but ParseRunStatus(%q) = %v", b, cerr, st, perr)
		}
	}
	if p.Status.IsClear() && !errors.Is(cerr, ErrInvalid) {
		t.Fatalf("Check accepts a cleared status: %q", b)
	}
	if cerr != nil {
		return
	}
	out, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("marshal patch of %q: %v", b, err)
	}
	var back RunPatch
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatalf("patch %q does not decode: %v", out, err)
	}
	out2, _ := json.Marshal(back)
	if !bytes.Equal(out, out2) || back.Empty() != p.Empty() {
		t.Fatalf("patch round trip %q -> %q -> %q", b, out, out2)
	}
	key, det, epoch, yes, fin := "k", int64(7), int64(2), true, int64(9)
	r := RunRecord{RunID: "r", Status: StatusRunning, StartedAt: 1, SandboxKey: &key, DetachedSince: &det,
		DriverEpoch: &epoch, CancelRequested: &yes, FinishedAt: &fin, Usage: json.RawMessage(`{"u":1}`)}
	before, _ := json.Marshal(r)
	got := p.ApplyTo(r)
	if after, _ := json.Marshal(r); !bytes.Equal(before, after) {
		t.Fatalf("ApplyTo modified its input: %s -> %s", before, after)
	}
	if p.Empty() {
		if g, _ := json.Marshal(got); !bytes.Equal(g, before) {
			t.Fatalf("an empty patch changed the run: %s -> %s", before, g)
		}
	}
	if got.Usage != nil && !json.Valid(got.Usage) {
		t.Fatalf("applied usage is not JSON: %q", got.Usage)
	}
}

// FuzzTenantAndID: CheckTenant and CheckID accept exactly their documented charsets and
// lengths, so a tenant or id can never hold a key separator.
func FuzzTenantAndID(f *testing.F) {
	for _, s := range []string{"", "acme", "a.b_c-9", "run:1", "a#b", "a|b", "é", "a b", "a/b",
		strings.Repeat("x", 64), strings.Repeat("x", 65), strings.Repeat("r", 256), strings.Repeat("r", 257), "\x00", ".", "..", "..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		inSet := func(extra byte) bool {
			for i := 0; i < len(s); i++ {
				c := s[i]
				if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
					c == '.' || c == '_' || c == '-' || extra != 0 && c == extra) {
					return false
				}
			}
			return true
		}
		wantTenant := len(s) <= MaxTenantLen && inSet(0)
		if err := CheckTenant(s); (err == nil) != wantTenant || err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("CheckTenant(%q) = %v, want ok=%v", s, err, wantTenant)
		}
		wantID := s != "" && len(s) <= MaxAPIIDLen && inSet(':') && s != "." && s != ".."
		if err := CheckID("runId", s); (err == nil) != wantID || err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("CheckID(%q) = %v, want ok=%v", s, err, wantID)
		}
		if wantID && CheckStoreID("runId", s) != nil {
			t.Fatalf("an API id %q is refused by the stores", s)
		}
		if wantTenant && strings.ContainsAny(s, "#|/:") {
			t.Fatalf("a valid tenant %q holds a separator", s)
		}
	})
}
