package journal

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Translator turns journal lines into log events: a line is one event carrying the line's
// Src, a line too long for one event several (pieces, each with its own Src), so a
// successor resuming at the log's highest Src delivers every byte exactly once, whatever
// language wrote the journal.
type Translator struct {
	nonce string
}

// NewTranslator returns the translator of runID's journal.
func NewTranslator(runID string) *Translator { return &Translator{nonce: ExitNonce(runID)} }

// Events translates one line or piece. A whole line: valid UTF-8 JSON → that JSON
// (surrounding space trimmed); anything else → the line as a JSON string (invalid UTF-8
// becomes U+FFFD); when that would exceed contract.MaxEventBytes, pieces as below. A piece
// (or a whole line too long for one event) → {"__cont":C,"__more":M,"__line":"<text>"}
// events, each at most contract.MaxEventBytes: C says the piece continues a line earlier
// events began, M that the line goes on in later ones; the concatenated texts of a first
// piece (C false) through a last (M false) are the line. This run's exit sentinel is no
// event; a lookalike with another nonce is a plain event.
func (t *Translator) Events(l Line) []contract.Event {
	if l.Whole() {
		if _, isExit := parseSentinel(l.Data, t.nonce); isExit {
			return nil
		}
		if trimmed := bytes.TrimSpace(l.Data); len(trimmed) > 0 && len(trimmed) <= contract.MaxEventBytes && utf8.Valid(trimmed) && json.Valid(trimmed) {
			return []contract.Event{{Src: l.Src, Data: append(json.RawMessage(nil), trimmed...)}}
		}
		if s, err := json.Marshal(string(l.Data)); err == nil && len(s) <= contract.MaxEventBytes {
			return []contract.Event{{Src: l.Src, Data: s}}
		}
	}
	nl := int64(0)
	if !l.More {
		nl = 1 // the newline is counted in the last piece's Src
	}
	return pieceEvents(nil, l.Data, l.Src-int64(len(l.Data))-nl, l.Cont, l.More, nl)
}

// pieceEvents appends the piece events of data, which starts at journal position start,
// halving (at a rune start) whatever does not fit one event.
func pieceEvents(out []contract.Event, data []byte, start int64, cont, more bool, nl int64) []contract.Event {
	if ev, err := pieceData(data, cont, more); err == nil && len(ev) <= contract.MaxEventBytes {
		src := start + int64(len(data))
		if !more {
			src += nl
		}
		return append(out, contract.Event{Src: src, Data: ev})
	}
	mid := runeCut(data, len(data)/2)
	out = pieceEvents(out, data[:mid], start, cont, true, nl)
	return pieceEvents(out, data[mid:], start+int64(mid), true, more, nl)
}

// piece is the JSON of one piece event (this member order).
type piece struct {
	Cont bool   `json:"__cont"`
	More bool   `json:"__more"`
	Line string `json:"__line"`
}

func pieceData(data []byte, cont, more bool) (json.RawMessage, error) {
	return json.Marshal(piece{Cont: cont, More: more, Line: string(data)})
}

// Translate is NewTranslator(runID).Events(l).
func Translate(runID string, l Line) []contract.Event { return NewTranslator(runID).Events(l) }
