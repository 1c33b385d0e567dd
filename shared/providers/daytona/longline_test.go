package daytona_test

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// TestJournalLongLineOverDaytona (docs/design.md §6, long lines): through the Daytona
// executor, an agent's 1.5 MiB line with no newline is read as pieces in one fetch per
// 512 KiB, each byte once; a read with nothing new is one exec fetching nothing, so the
// calls a pump makes grow with new bytes only; the line's end arrives as its last piece.
func TestJournalLongLineOverDaytona(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := contract.WithTenant(ctxFor(t), "")
	id := mustCreate(t, p, "sk_long")
	dir := filepath.Join(f.sandbox(id).dir, "runs")
	gate := filepath.Join(f.sandbox(id).dir, "gate")
	const size = 3 << 19
	if _, err := journal.Launch(ctx, p, id, dir, "long", "head -c "+strconv.Itoa(size)+" /dev/zero | tr '\\0' x; while [ ! -e "+
		journal.Quote(gate)+" ]; do sleep 0.01; done; printf 'end\\n'"); err != nil {
		t.Fatal(err)
	}
	paths, err := journal.PathsFor(dir, "", "long")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := p.Exec(ctx, id, "wc -c < "+journal.Quote(paths.Journal)+" 2>/dev/null")
		if n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout))); err == nil && n >= size {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never wrote its line")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fc := &storetest.FetchCounter{Executor: p, Prefix: "tail -c +"}
	rd, err := journal.NewReader(ctx, fc, id, dir, "long", 0)
	if err != nil {
		t.Fatal(err)
	}
	var lines []journal.Line
	collect := func(l journal.Line) error { lines = append(lines, l); return nil }
	if end, err := rd.Next(ctx, 0, collect); err != nil || end.Pos != size {
		t.Fatalf("first read: %+v, %v", end, err)
	}
	calls := fc.Calls.Load()
	t.Logf("%d bytes with no newline over Daytona: %d pieces, %d execs, %d bytes fetched", size, len(lines), calls, fc.Bytes.Load())
	if fc.Bytes.Load() != size || calls > size/journal.DefaultChunkBytes+1 {
		t.Fatalf("%d execs fetched %d bytes for a %d-byte journal", calls, fc.Bytes.Load(), size)
	}
	n := len(lines)
	for range 3 {
		if _, err := rd.Next(ctx, 0, collect); err != nil {
			t.Fatal(err)
		}
	}
	if len(lines) != n || fc.Calls.Load() != calls+3 || fc.Bytes.Load() != size {
		t.Fatalf("3 idle reads: %d pieces, %d execs, %d bytes; want 3 execs fetching nothing", len(lines)-n, fc.Calls.Load()-calls, fc.Bytes.Load()-size)
	}
	if _, err := p.Exec(ctx, id, ": > "+journal.Quote(gate)); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for journal.Probe(ctx, p, id, dir, "long").State != journal.Finished {
		if time.Now().After(deadline) {
			t.Fatal("no sentinel")
		}
		time.Sleep(10 * time.Millisecond)
	}
	end, err := rd.Next(ctx, 0, collect)
	if err != nil || !end.Finished || len(lines) != n+1 || string(lines[n].Data) != "end" || !lines[n].Cont || lines[n].More {
		t.Fatalf("final read: %+v, %v, %d new pieces", end, err, len(lines)-n)
	}
	var text strings.Builder
	for _, l := range lines {
		text.Write(l.Data)
	}
	if text.String() != strings.Repeat("x", size)+"end" || fc.Bytes.Load() != end.Pos {
		t.Fatalf("%d bytes carried, %d fetched for a %d-byte journal", text.Len(), fc.Bytes.Load(), end.Pos)
	}
}
