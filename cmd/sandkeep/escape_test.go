package main

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/termsafe"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// agentEscapes prints an event line holding a C1 CSI (U+009B), a bidi override (U+202E)
// and DEL, then an OSC title change and an SGR colour on stderr, and exits 3.
const agentEscapes = `printf '{"s":"\302\23331mX\342\200\256Y\177"}\n'; printf '\033]0;PWNED\007\033[31mRED' >&2; exit 3`

// eventS is the "s" member the agent printed.
const eventS = "\u009b31mX\u202eY\x7f"

// checkTerminalSafe fails if out holds anything termsafe escapes.
func checkTerminalSafe(t *testing.T, what, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Errorf("%s is not UTF-8: %q", what, out)
	}
	for i, r := range out {
		if termsafe.Unsafe(r) {
			t.Errorf("%s holds %U at byte %d: %q", what, r, i, out)
			return
		}
	}
}

// TestTerminalEscapesNeverPrinted: what an agent writes reaches the operator's terminal as
// text, never as a control. run and tail print the event line as JSON with \u escapes (it
// decodes to exactly what the agent wrote) and the stderr tail of the failed run in a
// visible form.
func TestTerminalEscapesNeverPrinted(t *testing.T) {
	t.Parallel()
	dev := clitest.StartDev(t, nil)
	for _, args := range [][]string{
		{"run", "--thread", "th-esc", "--run", "run-esc", "--", agentEscapes},
		{"tail", "run-esc"},
		{"attach", "run-esc"}, // an ended run: printed to its close, as tail does
	} {
		code, out, errOut := sk(t, dev, args...)
		checkTerminalSafe(t, args[0]+"'s stdout", out)
		checkTerminalSafe(t, args[0]+"'s stderr", errOut)
		if code != 3 || !strings.Contains(errOut, `\u001b]0;PWNED\u0007\u001b[31mRED`) {
			t.Errorf("%s: exit %d, want 3 with the stderr tail escaped\n%s", args[0], code, errOut)
		}
		evs := parseEvents(t, out)
		var got struct{ S string }
		if len(evs) != 1 || json.Unmarshal(evs[0].Data, &got) != nil || got.S != eventS ||
			!strings.Contains(out, `\u009b31mX\u202eY\u007f`) {
			t.Errorf("%s printed %q; want one event line whose s decodes to %q", args[0], out, eventS)
		}
	}
}
