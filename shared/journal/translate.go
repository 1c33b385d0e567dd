package journal

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Translator turns journal lines into log events: one line, one event, each carrying the
// line's Src, so a successor resuming at the log's highest Src delivers every line exactly
// once, whatever language wrote the journal.
type Translator struct {
	nonce string
}

// NewTranslator returns the translator of runID's journal.
func NewTranslator(runID string) *Translator { return &Translator{nonce: ExitNonce(runID)} }

// Event translates one line: valid UTF-8 JSON → that JSON (surrounding space trimmed);
// anything else → the line as a JSON string; a line longer than MaxLineBytes, or whose
// string form would exceed sandbox.MaxEventBytes → {"truncated":<line bytes>}. This run's
// exit sentinel is no event (ok=false); a lookalike with another nonce is a plain event.
func (t *Translator) Event(l Line) (ev sandbox.Event, ok bool) {
	ev.Src = l.Src
	if l.Truncated() {
		ev.Data = truncated(l.Size)
		return ev, true
	}
	if _, isExit := parseSentinel(l.Data, t.nonce); isExit {
		return sandbox.Event{}, false
	}
	if trimmed := bytes.TrimSpace(l.Data); len(trimmed) > 0 && utf8.Valid(trimmed) && json.Valid(trimmed) {
		ev.Data = append(json.RawMessage(nil), trimmed...)
		return ev, true
	}
	s, err := json.Marshal(string(l.Data)) // invalid UTF-8 becomes U+FFFD
	if err != nil || len(s) > sandbox.MaxEventBytes {
		ev.Data = truncated(l.Size)
		return ev, true
	}
	ev.Data = s
	return ev, true
}

func truncated(n int64) json.RawMessage {
	return json.RawMessage(`{"truncated":` + strconv.FormatInt(n, 10) + `}`)
}

// Translate is NewTranslator(runID).Event(l).
func Translate(runID string, l Line) (sandbox.Event, bool) { return NewTranslator(runID).Event(l) }
