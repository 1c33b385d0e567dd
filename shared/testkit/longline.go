package testkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// longLineBytes is the unterminated line of the long-line cases: more than two pieces,
// more than one fetch.
const longLineBytes = 640 << 10

// longLineAgent writes longLineBytes of x with no newline, waits for gate, then ends the
// line with "end" and prints after.
func longLineAgent(gate string, after ...string) string {
	return fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x\n", longLineBytes) + waitGate(gate) + "printf 'end\\n'\n" + printDeltas(after...)
}

// journalSize is runID's journal length in bytes (-1 when unreadable).
func (r *rig) journalSize(psid, runID string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(string(r.exec(psid, "wc -c < "+journal.Quote(r.paths(runID).Journal)+" 2>/dev/null").Stdout)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func journalJ8(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf-long")
	gate := "gate-" + runID
	r.launch(psid, runID, longLineAgent(gate, "after"))
	r.eventually("the unterminated line", func() bool { return r.journalSize(psid, runID) >= longLineBytes })
	fc := &storetest.FetchCounter{Executor: r.ex, Prefix: "tail -c +"}
	rd, err := journal.NewReader(r.ctx, fc, psid, rigJournalDir, runID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lines []journal.Line
	collect := func(l journal.Line) error { lines = append(lines, l); return nil }
	if end, err := rd.Next(r.ctx, 0, collect); err != nil || end.Pos != longLineBytes || end.Finished {
		t.Fatalf("first read: %+v, %v; want the whole unterminated line delivered", end, err)
	}
	for i, l := range lines {
		if l.Cont != (i > 0) || !l.More || len(l.Data) > journal.PieceBytes {
			t.Fatalf("piece %d: cont %v more %v, %d bytes", i, l.Cont, l.More, len(l.Data))
		}
	}
	if fc.Bytes.Load() != longLineBytes {
		t.Fatalf("fetched %d bytes for a %d-byte journal", fc.Bytes.Load(), longLineBytes)
	}
	calls, n := fc.Calls.Load(), len(lines)
	if end, err := rd.Next(r.ctx, 0, collect); err != nil || len(lines) != n || fc.Calls.Load() != calls+1 || fc.Bytes.Load() != longLineBytes {
		t.Fatalf("idle read: %+v, %v: %d pieces, %d calls, %d bytes; want one call fetching nothing",
			end, err, len(lines)-n, fc.Calls.Load()-calls, fc.Bytes.Load()-longLineBytes)
	}
	r.exec(psid, ": >> "+journal.Quote(gate))
	r.waitFinished(psid, runID)
	end, err := rd.Next(r.ctx, 0, collect)
	if err != nil || !end.Finished {
		t.Fatalf("final read: %+v, %v", end, err)
	}
	if got, want := fc.Bytes.Load(), end.Pos; got != want {
		t.Fatalf("fetched %d bytes for a %d-byte journal: some twice", got, want)
	}
	var text strings.Builder
	for _, l := range lines {
		text.Write(l.Data)
		if !l.More {
			text.WriteByte('\n')
		}
	}
	if text.String() != strings.Repeat("x", longLineBytes)+"end\n"+`{"delta":"after"}`+"\n" {
		t.Fatalf("the pieces do not carry the journal (%d bytes)", text.Len())
	}
	last := lines[n]
	if string(last.Data) != "end" || !last.Cont || last.More {
		t.Fatalf("the line's end: %+v", last)
	}
}

// rebuild reassembles a log of piece events and {"delta":d} events into its text: each
// line's pieces concatenated, then "\n"; a delta as "<d>\n". It fails on a piece that
// does not follow its line's previous piece, or a line left open.
func rebuild(evs []contract.Event) (string, error) {
	var b strings.Builder
	open := false
	for i, e := range evs {
		var p struct {
			Cont  *bool   `json:"__cont"`
			More  *bool   `json:"__more"`
			Line  *string `json:"__line"`
			Delta *string `json:"delta"`
		}
		if err := json.Unmarshal(e.Data, &p); err != nil {
			return "", fmt.Errorf("event %d: %w", i, err)
		}
		if i > 0 && e.Src <= evs[i-1].Src {
			return "", fmt.Errorf("event %d: src %d after %d", i, e.Src, evs[i-1].Src)
		}
		switch {
		case p.Line != nil && p.Cont != nil && p.More != nil:
			if *p.Cont != open {
				return "", fmt.Errorf("event %d: continuation %v where a line is open: %v", i, *p.Cont, open)
			}
			b.WriteString(*p.Line)
			open = *p.More
			if !open {
				b.WriteByte('\n')
			}
		case p.Delta != nil && !open:
			b.WriteString(*p.Delta + "\n")
		default:
			return "", fmt.Errorf("event %d: unexpected %.80s (line open: %v)", i, e.Data, open)
		}
	}
	if open {
		return "", errors.New("the last line was left open")
	}
	return b.String(), nil
}

// shiftedReads is a deliberately broken journal reader, built at the Executor seam: each
// fetch starts one byte early, so a reader resuming mid-line delivers a byte twice. T8
// must catch it.
type shiftedReads struct{ contract.Executor }

func (s shiftedReads) Exec(ctx context.Context, id, cmd string) (contract.ExecResult, error) {
	var n int64
	if _, err := fmt.Sscanf(cmd, "tail -c +%d ", &n); err == nil && n > 1 {
		cmd = strings.Replace(cmd, "tail -c +"+strconv.FormatInt(n, 10)+" ", "tail -c +"+strconv.FormatInt(n-1, 10)+" ", 1)
	}
	return s.Executor.Exec(ctx, id, cmd)
}

// longLineTakeover lets a host store the first pieces of a long unterminated line and die;
// a successor reading through ex attaches, the line ends, and the successor drives the run
// to its end (bounded by rigWait; a broken successor's failure is returned, not fatal). It
// returns the log and the successor's first event.
func (r *rig) longLineTakeover(ex contract.Executor, broken bool) ([]contract.Event, contract.Event) {
	t := r.t
	runID := r.id("tko-t8")
	res := r.start(runID, runID+"-t")
	psid := res.Sandbox.ProviderSandboxID
	gate := "gate-" + runID
	r.launch(psid, runID, longLineAgent(gate, "after"))

	hctx, die := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() {
		_, err := r.drive(hctx, runID, psid, res.Driver, nil)
		done <- err
	}()
	r.eventually("the host to store two pieces", func() bool { return len(r.events(runID)) >= 2 })
	die()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("dying host: %v", err)
	}
	stored := len(r.events(runID))
	att, err := r.k.Attach(r.ctx, runID)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if att.Driver.Src <= 0 || att.Driver.Src > longLineBytes {
		t.Fatalf("the successor resumes at %d: not inside the line (the dangerous path was not hit)", att.Driver.Src)
	}
	r.exec(psid, ": >> "+journal.Quote(gate))
	sctx, cancel := context.WithTimeout(r.ctx, rigWait)
	defer cancel()
	if _, err := r.driveWith(sctx, runID, psid, att.Driver, nil, ex); err != nil && !broken {
		t.Fatalf("successor: %v", err)
	}
	evs := r.events(runID)
	if len(evs) <= stored {
		if broken {
			return evs, contract.Event{}
		}
		t.Fatalf("the successor stored nothing")
	}
	return evs, evs[stored]
}

func takeoverT8(t *testing.T, r *rig) {
	want := strings.Repeat("x", longLineBytes) + "end\nafter\n"
	evs, first := r.longLineTakeover(r.ex, false)
	got, err := rebuild(evs)
	if err != nil || got != want {
		t.Fatalf("the log does not carry the line and what followed exactly once (%d bytes of %d): %v", len(got), len(want), err)
	}
	var p struct {
		Cont *bool `json:"__cont"`
	}
	if json.Unmarshal(first.Data, &p) != nil || p.Cont == nil || !*p.Cont {
		t.Fatalf("the successor's first event is no continuation: %.80s", first.Data)
	}
	for _, e := range evs {
		if len(e.Data) > contract.MaxEventBytes {
			t.Fatalf("an event of %d bytes", len(e.Data))
		}
	}
	// The same takeover through a reader that re-reads a byte at each resume: the check
	// above must see it.
	broken, _ := r.longLineTakeover(shiftedReads{r.ex}, true)
	if got, err := rebuild(broken); err == nil && got == want {
		t.Fatal("a successor re-reading a byte mid-line went unnoticed: the check cannot fail")
	}
}
