package journal_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// journalSize is the journal's length in bytes.
func (b *box) journalSize(runID string) int64 {
	b.t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(string(b.sh("wc -c < "+journal.Quote(b.paths(runID).Journal)).Stdout)), 10, 64)
	if err != nil {
		b.t.Fatal(err)
	}
	return n
}

// TestReadLongUnterminatedLineOnce (docs/design.md §6, long lines): an agent writes 3 MiB
// with no newline and waits. A reader delivers all of it as marked pieces (none over
// PieceBytes) and fetches every byte once; reading again with nothing new is one call
// fetching nothing; the line's end, written later, arrives as its last piece, and nothing
// is lost.
func TestReadLongUnterminatedLineOnce(t *testing.T) {
	b := newBox(t)
	run := "long-line"
	const size = 3 << 20
	gate := journal.Quote(b.root + "/gate")
	if _, err := journal.Launch(tenantCtx(t), b.p, b.id, b.dir, run,
		"head -c "+strconv.Itoa(size)+" /dev/zero | tr '\\0' x; while [ ! -e "+gate+" ]; do sleep 0.01; done; printf 'yz\\n'"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the agent's 3 MiB", func() bool { return b.exists(b.paths(run).Journal) && b.journalSize(run) >= size })
	fc := &storetest.FetchCounter{Executor: b.p, Prefix: "tail -c +"}
	rd, err := journal.NewReader(tenantCtx(t), fc, b.id, b.dir, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lines []journal.Line
	collect := func(l journal.Line) error { lines = append(lines, l); return nil }
	end, err := rd.Next(tenantCtx(t), 0, collect)
	if err != nil || end.Finished || end.Pos != size {
		t.Fatalf("first read: %+v, %v; want every byte delivered (pos %d)", end, err, size)
	}
	for i, l := range lines {
		if l.Whole() || l.Cont != (i > 0) || !l.More || len(l.Data) > journal.PieceBytes || strings.Trim(string(l.Data), "x") != "" {
			t.Fatalf("piece %d: cont %v more %v, %d bytes", i, l.Cont, l.More, len(l.Data))
		}
	}
	calls, fetched := fc.Calls.Load(), fc.Bytes.Load()
	t.Logf("3 MiB unterminated: %d pieces, %d shell calls, %d bytes fetched", len(lines), calls, fetched)
	if fetched != size || calls > size/journal.DefaultChunkBytes+1 {
		t.Fatalf("fetched %d bytes in %d calls for a %d-byte journal", fetched, calls, size)
	}
	n := len(lines)
	if end, err := rd.Next(tenantCtx(t), 0, collect); err != nil || end.Pos != size || len(lines) != n ||
		fc.Calls.Load() != calls+1 || fc.Bytes.Load() != fetched {
		t.Fatalf("idle read: %+v, %v, %d new pieces, %d calls, %d bytes", end, err, len(lines)-n, fc.Calls.Load()-calls, fc.Bytes.Load()-fetched)
	}
	b.sh(": > " + gate)
	eventually(t, "the sentinel", func() bool {
		return journal.Probe(tenantCtx(t), b.p, b.id, b.dir, run).State == journal.Finished
	})
	end, err = rd.Next(tenantCtx(t), 0, collect)
	if err != nil || !end.Finished || end.ExitCode != 0 {
		t.Fatalf("final read: %+v, %v", end, err)
	}
	last := lines[len(lines)-1]
	if len(lines) != n+1 || string(last.Data) != "yz" || !last.Cont || last.More || last.Src != size+3 {
		t.Fatalf("the line's end: %d pieces, last %+v", len(lines)-n, last)
	}
	if joined(lines) != strings.Repeat("x", size)+"yz\n" {
		t.Fatal("the pieces do not carry the line")
	}
	// A successor resuming at any piece's Src, mid-line, reads exactly the rest.
	for _, k := range []int{0, n / 2, n - 1} {
		rest, end2 := b.readAll(run, lines[k].Src)
		if joined(rest) != joined(lines[k+1:]) || !rest[0].Cont || end2 != end {
			t.Fatalf("resume at piece %d: %d bytes, end %+v", k, len(joined(rest)), end2)
		}
	}
}

// An agent whose output ends without a newline still ends its run: the launcher ends the
// line before the sentinel, so the line arrives whole and the sentinel is read.
func TestReadLastLineWithoutNewline(t *testing.T) {
	b := newBox(t)
	run := "no-newline"
	b.runAgent(run, `printf '{"a":1}\nlast words'`)
	lines, end := b.readAll(run, 0)
	if !end.Finished || strings.Join(texts(lines), "|") != `{"a":1}|last words` || !lines[1].Whole() {
		t.Fatalf("lines %q, end %+v", texts(lines), end)
	}
	b.runAgent("silent", `true`)
	if lines, end := b.readAll("silent", 0); !end.Finished || len(lines) != 0 {
		t.Fatalf("an agent that printed nothing: %q, %+v", texts(lines), end)
	}
}

// A short unfinished line is held, not delivered, and a reader that keeps its place never
// fetches it again; a second reader (the next pump) fetches it once more, and no more.
func TestReadHoldsShortUnfinishedLine(t *testing.T) {
	b := newBox(t)
	run := "held"
	j := b.paths(run).Journal
	b.sh("mkdir -p " + journal.Quote(b.dir) + " && printf '{\"a\":1}\\nhalf a li' > " + journal.Quote(j))
	fc := &storetest.FetchCounter{Executor: b.p, Prefix: "tail -c +"}
	rd, err := journal.NewReader(tenantCtx(t), fc, b.id, b.dir, run, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lines []journal.Line
	collect := func(l journal.Line) error { lines = append(lines, l); return nil }
	for range 3 {
		if end, err := rd.Next(tenantCtx(t), 0, collect); err != nil || end.Pos != 8 {
			t.Fatalf("read: %+v, %v", end, err)
		}
	}
	if len(lines) != 1 || fc.Bytes.Load() != 17 || fc.Calls.Load() != 3 {
		t.Fatalf("%d lines, %d bytes fetched in %d calls; want 1 line, 17 bytes once", len(lines), fc.Bytes.Load(), fc.Calls.Load())
	}
	b.sh("printf 'ne\\n' >> " + journal.Quote(j))
	if _, err := rd.Next(tenantCtx(t), 0, collect); err != nil || len(lines) != 2 || string(lines[1].Data) != "half a line" || !lines[1].Whole() {
		t.Fatalf("the completed line: %q, %v", texts(lines), err)
	}
	// Limited: the fetch stops at the limit with the rest left for later.
	rd2, _ := journal.NewReader(tenantCtx(t), b.p, b.id, b.dir, run, 0)
	lines = nil
	if end, err := rd2.Next(tenantCtx(t), 10, collect); err != nil || !end.Limited || end.Pos != 8 || len(lines) != 1 {
		t.Fatalf("limited read: %+v, %v, %q", end, err, texts(lines))
	}
}
