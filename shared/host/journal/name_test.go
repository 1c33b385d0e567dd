package journal

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/contract"
)

func TestEncodeVectors(t *testing.T) {
	cases := map[string]string{
		"run-1":                   "run-1",
		"A.b-9":                   "A.b-9",
		"a_b":                     "a_5fb",
		"a/b":                     "a_2fb",
		"x y":                     "x_20y",
		"é":                       "_c3_a9",
		"..":                      "..",
		"r'$(x)":                  "r_27_24_28x_29",
		"thr-é/🙂":                 "thr-_c3_a9_2f_f0_9f_99_82",
		"x'; touch /tmp/pwned; '": "x_27_3b_20touch_20_2ftmp_2fpwned_3b_20_27",
	}
	for id, want := range cases {
		if got := Encode(id); got != want {
			t.Errorf("Encode(%q) = %q, want %q", id, got, want)
		}
		if back, ok := Decode(want); !ok || back != id {
			t.Errorf("Decode(%q) = %q %v, want %q", want, back, ok, id)
		}
	}
}

func TestEncodeCapsLongNames(t *testing.T) {
	long := strings.Repeat("x", 300)
	got := Encode(long)
	// Independent vector: python3 hashlib.sha256(("x"*300).encode()).hexdigest()[:32].
	want := strings.Repeat("x", 167) + "-0d4e2ca9e9cbced7a7a5380eb29e1a37"
	if got != want {
		t.Fatalf("Encode(300 x) = %q, want %q", got, want)
	}
	if _, ok := Decode(got); ok {
		t.Fatal("a capped name decoded")
	}
	// Escapes count towards the cap: 100 "/" encode to 300 chars.
	if n := len(Encode(strings.Repeat("/", 100))); n != MaxNameLen {
		t.Fatalf("capped length %d", n)
	}
	// Exactly at the cap and not capped-looking: reversible.
	at := strings.Repeat("y", MaxNameLen)
	if Encode(at) != at {
		t.Fatalf("a %d-char safe id was altered", MaxNameLen)
	}
	if back, ok := Decode(at); !ok || back != at {
		t.Fatal("a name at the cap did not decode")
	}
	// An id whose plain encoding looks capped is capped too, so no id can take over the
	// file of a long id by spelling out its capped name.
	forged := strings.Repeat("x", 167) + "-0d4e2ca9e9cbced7a7a5380eb29e1a37"
	if Encode(forged) == Encode(long) || Encode(forged) == forged {
		t.Fatalf("Encode(%q) = %q collides with a capped name", forged, Encode(forged))
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, name := range []string{
		"", "_41", "a_2Fb", "_4", "a_", "_zz", "a b", "a/b", "a_5f_", "_ff", "_c3", "_00", "a\nb",
		strings.Repeat("z", MaxNameLen+1),
	} {
		if id, ok := Decode(name); ok {
			t.Errorf("Decode(%q) = %q, want refusal", name, id)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	ids := []string{"a", "_", "__", "-", ".", "...", "0", "🙂", "tab\there", "x'; touch /tmp/pwned; '$(touch /tmp/pwned2)",
		"`id`", "a\"b\\c", "\u00a0", strings.Repeat("é", 33)}
	for _, id := range ids {
		enc := Encode(id)
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; !isNameByte(c) && c != '_' {
				t.Fatalf("Encode(%q) = %q holds %q", id, enc, c)
			}
		}
		if back, ok := Decode(enc); !ok || back != id {
			t.Errorf("round trip of %q via %q = %q %v", id, enc, back, ok)
		}
		name := Name("acme", id)
		if len(name) == MaxNameLen {
			continue // capped with the tenant: undecodable by design (TestEncodeCapsLongNames)
		}
		for _, ext := range exts {
			if tn, back, e, ok := SplitName(name + ext); !ok || tn != "acme" || back != id || e != ext {
				t.Errorf("SplitName(%q) = %q %q %q %v", name+ext, tn, back, e, ok)
			}
		}
	}
	if _, _, _, ok := SplitName("acme_2frun.txt"); ok {
		t.Error("a foreign extension split")
	}
	if tn, id, ext, ok := SplitName("acme_2fa.err.ndjson"); !ok || tn != "acme" || id != "a.err" || ext != ExtJournal {
		t.Errorf("SplitName(acme_2fa.err.ndjson) = %q %q %q %v", tn, id, ext, ok)
	}
	// The old run-id-only names name no tenant: nobody can tell whose they are.
	if _, _, _, ok := SplitName("a.ndjson"); ok {
		t.Error("a name without a tenant split")
	}
}

// Two tenants' runs of one id never share a name, the empty tenant included, and a run id
// holding the separator cannot pose as another tenant's run.
func TestNameSeparatesTenants(t *testing.T) {
	cases := map[[2]string]string{
		{"alice", "run-x"}:  "alice_2frun-x",
		{"bob", "run-x"}:    "bob_2frun-x",
		{"", "run-x"}:       "_2frun-x",
		{"a_b", "r"}:        "a_5fb_2fr",
		{"", "alice/run-x"}: "_2falice_2frun-x",
		{"t.1-x", "a/b c"}:  "t.1-x_2fa_2fb_20c",
	}
	seen := map[string][2]string{}
	for in, want := range cases {
		got := Name(in[0], in[1])
		if got != want {
			t.Errorf("Name(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("Name(%q) = Name(%q) = %q", in, prev, got)
		}
		seen[got] = in
		if tn, id, ok := ParseName(got); !ok || tn != in[0] || id != in[1] {
			t.Errorf("ParseName(%q) = %q %q %v, want %q %q", got, tn, id, ok, in[0], in[1])
		}
	}
	a, _ := PathsFor("/j", "alice", "run-x")
	b, _ := PathsFor("/j", "bob", "run-x")
	if a.Journal == b.Journal || a.Stderr == b.Stderr || a.PID == b.PID {
		t.Fatalf("two tenants share a file: %+v %+v", a, b)
	}
	if _, err := PathsFor("/j", "bad tenant", "r"); err == nil {
		t.Fatal("an invalid tenant got paths")
	}
}

func TestExitNonceGolden(t *testing.T) {
	// Independent vectors: printf '%s' 'sandkeep/journal-exit/v1:<id>' | sha256sum | cut -c1-32.
	for id, want := range map[string]string{
		"run-1":   "124c54a3c9a087651f643eec79eade54",
		"thr-é/🙂": "81ac59193a748c819596c41573a8d509",
	} {
		if got := ExitNonce(id); got != want {
			t.Errorf("ExitNonce(%q) = %s, want %s", id, got, want)
		}
	}
	if got, want := SentinelLine("run-1", 7), `{"__exit":7,"__nonce":"124c54a3c9a087651f643eec79eade54"}`; got != want {
		t.Errorf("SentinelLine = %s, want %s", got, want)
	}
}

func TestParseSentinel(t *testing.T) {
	n := ExitNonce("r")
	ok := map[string]int{
		SentinelLine("r", 0):                          0,
		SentinelLine("r", -1):                         -1,
		`{ "__nonce" : "` + n + `", "__exit" : 143 }`: 143,
		"  " + SentinelLine("r", 3) + "\r":            3,
	}
	for line, code := range ok {
		if got, found := parseSentinel([]byte(line), n); !found || got != code {
			t.Errorf("parseSentinel(%s) = %d %v, want %d", line, got, found, code)
		}
	}
	for _, line := range []string{
		`{"__exit":0}`,
		SentinelLine("other", 0),
		`{"__exit":0,"__nonce":"` + n + `","extra":1}`,
		`{"__exit":"0","__nonce":"` + n + `"}`,
		`{"__exit":1.5,"__nonce":"` + n + `"}`,
		`["__exit",0,"` + n + `"]`,
		`x` + SentinelLine("r", 0),
		"",
	} {
		if _, found := parseSentinel([]byte(line), n); found {
			t.Errorf("parseSentinel(%s) accepted", line)
		}
	}
}

func TestTranslateOneLineOneEvent(t *testing.T) {
	tr := NewTranslator("r")
	cases := []struct {
		line Line
		want string // "" = no event
	}{
		{Line{Data: []byte(`{"a":1}`), Src: 8}, `{"a":1}`},
		{Line{Data: []byte(` [1, 2] `), Src: 9}, `[1, 2]`},
		{Line{Data: []byte(`hello "x"`), Src: 10}, `"hello \"x\""`},
		{Line{Data: []byte{}, Src: 1}, `""`},
		{Line{Data: []byte("\xff{}"), Src: 4}, `"\ufffd{}"`},
		{Line{Data: []byte("\"\xff\""), Src: 4}, `"\"\ufffd\""`},
		{Line{Data: []byte(SentinelLine("r", 0)), Src: 58}, ""},
		{Line{Data: []byte(SentinelLine("other", 0)), Src: 58}, SentinelLine("other", 0)},
		{Line{Data: []byte("abc"), Src: 103, Cont: true}, `{"__cont":true,"__more":false,"__line":"abc"}`},
		{Line{Data: []byte("abc"), Src: 103, More: true}, `{"__cont":false,"__more":true,"__line":"abc"}`},
	}
	for _, c := range cases {
		evs := tr.Events(c.line)
		if c.want == "" {
			if len(evs) != 0 {
				t.Errorf("Events(%q) = %v, want none", c.line.Data, evs)
			}
			continue
		}
		if len(evs) != 1 || string(evs[0].Data) != c.want || evs[0].Src != c.line.Src {
			t.Errorf("Events(%.40q) = %v, want %s src %d", c.line.Data, evs, c.want, c.line.Src)
		}
		if contract.CheckEvents(evs) != nil || !utf8.Valid(evs[0].Data) {
			t.Errorf("Events(%.40q) is not a storable event", c.line.Data)
		}
	}
	if evs := Translate("r", Line{Data: []byte(`{"a":1}`), Src: 8}); len(evs) != 1 || !json.Valid(evs[0].Data) {
		t.Error("Translate broke JSON")
	}
}

// TestTranslateSplitsWhatOneEventCannotHold: a whole line whose event would pass 256 KiB
// (control bytes escape to 6 bytes each; a long text; multi-byte runes at every cut) and
// a piece of a long line become piece events that each fit, whose Srcs end where the
// journal bytes they carry end, and whose texts concatenate to the line exactly.
func TestTranslateSplitsWhatOneEventCannotHold(t *testing.T) {
	tr := NewTranslator("r")
	cases := []struct {
		name string
		data string
		cont bool
		more bool
	}{
		{"control bytes", strings.Repeat("\x01", MaxLineBytes/2), false, false},
		{"text at the limit", strings.Repeat("q", MaxLineBytes), false, false},
		{"runes of every width", strings.Repeat("aé€😀", MaxLineBytes/9), false, false},
		{"a middle piece", strings.Repeat("<&>", PieceBytes/3), true, true},
		{"a last piece", strings.Repeat("\"", PieceBytes), true, false},
	}
	for _, c := range cases {
		const start = 1000
		nl := int64(0)
		if !c.more {
			nl = 1
		}
		l := Line{Data: []byte(c.data), Src: start + int64(len(c.data)) + nl, Cont: c.cont, More: c.more}
		evs := tr.Events(l)
		if len(evs) < 2 {
			t.Errorf("%s: %d events, want pieces", c.name, len(evs))
			continue
		}
		var text strings.Builder
		pos := int64(start)
		for i, ev := range evs {
			var p struct {
				Cont *bool   `json:"__cont"`
				More *bool   `json:"__more"`
				Line *string `json:"__line"`
			}
			if err := json.Unmarshal(ev.Data, &p); err != nil || p.Cont == nil || p.More == nil || p.Line == nil {
				t.Fatalf("%s: event %d is no piece: %.80s", c.name, i, ev.Data)
			}
			if wantCont, wantMore := c.cont || i > 0, c.more || i < len(evs)-1; *p.Cont != wantCont || *p.More != wantMore {
				t.Errorf("%s: event %d marked cont %v more %v, want %v %v", c.name, i, *p.Cont, *p.More, wantCont, wantMore)
			}
			text.WriteString(*p.Line)
			pos += int64(len(*p.Line))
			if !*p.More {
				pos += nl
			}
			if ev.Src != pos {
				t.Errorf("%s: event %d src %d, want %d", c.name, i, ev.Src, pos)
			}
		}
		if text.String() != c.data {
			t.Errorf("%s: the pieces do not rebuild the line", c.name)
		}
		if err := contract.CheckEvents(evs); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

func TestFindSentinelWindow(t *testing.T) {
	n := ExitNonce("r")
	s := SentinelLine("r", 5) + "\n"
	pad := func(k int) string { return strings.Repeat("p", k-1) + "\n" }
	cases := []struct {
		name string
		tail string
		code int
		ok   bool
	}{
		{"empty", "", 0, false},
		{"only sentinel", s, 5, true},
		{"sentinel then output", s + `{"late":1}` + "\n", 5, true},
		{"partial sentinel", strings.TrimSuffix(s, "\n"), 0, false},
		{"forged without nonce", `{"__exit":0}` + "\n", 0, false},
		// A full window (ProbeBytes+1 bytes read) whose first line is cut: the fragment
		// is never taken for a line, even when it reads like a sentinel.
		{"cut fragment", s[1:] + pad(ProbeBytes+1-len(s)+1), 0, false},
		{"window starts on a line", "\n" + s + pad(ProbeBytes-len(s)), 5, true},
	}
	for _, c := range cases {
		code, ok := findSentinel([]byte(c.tail), n)
		if ok != c.ok || code != c.code {
			t.Errorf("%s: findSentinel = %d %v, want %d %v", c.name, code, ok, c.code, c.ok)
		}
	}
}

func TestParseListing(t *testing.T) {
	out := "100 /j\n" +
		"200 /j/t_2fa.ndjson\n" +
		"300 /j/t_2fa.err\n" +
		"50 /j/t_2fb.ndjson\n" +
		"55 /j/u_2fa.ndjson\n" + // another tenant's run a
		"58 /j/a.ndjson\n" + // the old format: no tenant
		"60 /j/stray_1.ndjson\n" +
		"70 /j/_41.ndjson\n" +
		"80 /jx/t_2fc.ndjson\n" + // another directory
		"90 /j/sub/t_2fd.ndjson\n" + // not a direct child
		"garbage line\n" +
		"x1 /j/t_2fe.ndjson\n"
	l, err := parseListing("/j", "t", out)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Runs) != 2 || l.Runs[0].RunID != "a" || l.Runs[1].RunID != "b" {
		t.Fatalf("runs %+v", l.Runs)
	}
	if got := l.Runs[0]; got.ModTime.Unix() != 300 || strings.Join(got.Names, ",") != "t_2fa.err,t_2fa.ndjson" {
		t.Fatalf("run a = %+v, want the newest mtime 300 and both names", got)
	}
	if strings.Join(l.Undecodable, ",") != "_41.ndjson,a.ndjson,stray_1.ndjson" {
		t.Fatalf("undecodable %v", l.Undecodable)
	}
	if strings.Join(l.Foreign, ",") != "u_2fa.ndjson" {
		t.Fatalf("foreign %v", l.Foreign)
	}
	if _, err := parseListing("/j", "t", "200 /j/t_2fa.ndjson\n"); err == nil {
		t.Fatal("a listing without the witness line was trusted")
	}
	if l, err := parseListing("/j", "t", "100 /j\n"); err != nil || len(l.Runs)+len(l.Undecodable) != 0 {
		t.Fatalf("empty dir: %+v %v", l, err)
	}
}

// The launch script's bytes are wire format: any language's launcher must be able to
// produce the same files. Pin them, quoting included.
func TestCommandGolden(t *testing.T) {
	got := Command("/j'd/", "t", "r'1", "my-agent --json")
	want := `mkdir -p -- '/j'\''d' || exit 125
set -C
if ! true 2>/dev/null >'/j'\''d/t_2fr_271.ndjson'; then echo 'sandkeep: journal exists' >&2; exit 124; fi
set +C
echo $$ >'/j'\''d/t_2fr_271.pid'
(
my-agent --json
) >>'/j'\''d/t_2fr_271.ndjson' 2>>'/j'\''d/t_2fr_271.err'
sandkeep_rc=$?
if [ -s '/j'\''d/t_2fr_271.ndjson' ] && [ "$(tail -c 1 -- '/j'\''d/t_2fr_271.ndjson' | wc -l)" -eq 0 ]; then printf '\n' >>'/j'\''d/t_2fr_271.ndjson'; fi
printf '{"__exit":%d,"__nonce":"%s"}\n' "$sandkeep_rc" 0312d9c08cc834a22ad18b1299f5218d >>'/j'\''d/t_2fr_271.ndjson'
`
	if got != want {
		t.Fatalf("Command =\n%s\nwant\n%s", got, want)
	}
	if n := ExitNonce("r'1"); n != "0312d9c08cc834a22ad18b1299f5218d" {
		t.Fatalf("nonce %s", n)
	}
	if q := Quote(`a'b`); q != `'a'\''b'` {
		t.Fatalf("Quote = %s", q)
	}
}

// plainExec is an Executor without a journal directory of its own; dirExec has one.
type plainExec struct{ contract.Executor }

type dirExec struct{ contract.Executor }

func (dirExec) JournalDir() string { return ".sandkeep/journal" }

// The provider names the directory when the caller does not (the reaper, the driver and
// the journal sweep all resolve it here); a caller's directory always wins.
func TestDirFor(t *testing.T) {
	if got := DirFor(plainExec{}, ""); got != DefaultDir {
		t.Errorf("DirFor(plain, \"\") = %q, want %q", got, DefaultDir)
	}
	if got := DirFor(dirExec{}, ""); got != ".sandkeep/journal" {
		t.Errorf("DirFor(local, \"\") = %q, want the provider's", got)
	}
	if got := DirFor(dirExec{}, "/j"); got != "/j" {
		t.Errorf("DirFor(local, /j) = %q, want the caller's", got)
	}
	p, err := PathsIn(contract.WithTenant(t.Context(), "acme"), dirExec{}, "", "r")
	if err != nil || p.Journal != ".sandkeep/journal/acme_2fr.ndjson" {
		t.Fatalf("PathsIn = %+v %v", p, err)
	}
}
