package testkit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
)

// RunJournalConformance proves the in-sandbox journal of docs/design.md §6 against a provider with a real
// shell (reference journal-conformance J1–J7, and J8): stdout appended with the sentinel, the
// agent's exit code, stderr kept apart, absolute resumable byte positions, incremental
// follow (proved causally with a gate file), a follow read stopped by its context, a
// kill that reaches the sandbox-side process group, and a long unterminated line read in
// pieces with each byte fetched once through the provider.
func RunJournalConformance(t *testing.T, newProvider NewProvider) {
	t.Helper()
	runRigCases(t, []rigCase{
		{"J1 stdout into the journal then the sentinel", journalJ1},
		{"J2 the agent's non-zero exit in the sentinel", journalJ2},
		{"J3 stderr kept out of the journal", journalJ3},
		{"J4 resumable absolute byte positions", journalJ4},
		{"J5 follow delivers each line before the next is produced", journalJ5},
		{"J6 a follow read stops when its context ends", journalJ6},
		{"J7 kill reaches the sandbox-side process group", journalJ7},
		{"J8 a long unterminated line arrives in pieces, each byte fetched once", journalJ8},
	}, nil, newProvider)
}

// rigCase is one case of the journal, takeover and reaper suites.
type rigCase struct {
	name string
	run  func(t *testing.T, r *rig)
}

// runRigCases runs every case as a parallel subtest in a rig of its own: a fresh backend
// (none when newBackend is nil) and a fresh provider.
func runRigCases(t *testing.T, cases []rigCase, newBackend NewBackend, newProvider NewProvider) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var b contract.Backend
			if newBackend != nil {
				b = newBackend(t, cfOptions())
			}
			c.run(t, newRig(t, b, newProvider(t)))
		})
	}
}

// journalBytes returns runID's journal exactly.
func (r *rig) journalBytes(psid, runID string) string {
	return string(r.exec(psid, "cat -- "+journal.Quote(r.paths(runID).Journal)).Stdout)
}

func journalJ1(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf")
	r.launch(psid, runID, `printf '{"a":1}\n{"b":2}\n'`)
	if code := r.waitFinished(psid, runID); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	want := "{\"a\":1}\n{\"b\":2}\n" + journal.SentinelLine(runID, 0) + "\n"
	if got := r.journalBytes(psid, runID); got != want {
		t.Fatalf("journal = %q, want %q", got, want)
	}
}

func journalJ2(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf-exit")
	r.launch(psid, runID, "exit 7")
	if code := r.waitFinished(psid, runID); code != 7 {
		t.Fatalf("exit code %d, want 7", code)
	}
	if got, want := r.journalBytes(psid, runID), journal.SentinelLine(runID, 7)+"\n"; got != want {
		t.Fatalf("journal = %q, want %q (exit must not skip the sentinel)", got, want)
	}
}

func journalJ3(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf-err")
	r.launch(psid, runID, `printf '{"a":1}\n'; echo 'a warning' >&2`)
	r.waitFinished(psid, runID)
	got := r.journalBytes(psid, runID)
	if want := "{\"a\":1}\n" + journal.SentinelLine(runID, 0) + "\n"; got != want || strings.Contains(got, "a warning") {
		t.Fatalf("journal = %q, want %q", got, want)
	}
	tail, err := journal.StderrTail(r.ctx, r.ex, psid, rigJournalDir, runID, 0)
	if err != nil || string(tail) != "a warning\n" {
		t.Fatalf("stderr sidecar = %q, %v", tail, err)
	}
}

func journalJ4(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf-seek")
	r.launch(psid, runID, `printf '{"a":1}\n{"b":2}\n'`)
	r.waitFinished(psid, runID)
	read := func(from int64) ([]journal.Line, journal.End) {
		var lines []journal.Line
		end, err := journal.Read(r.ctx, r.ex, psid, rigJournalDir, runID, from, false, func(l journal.Line) error {
			lines = append(lines, journal.Line{Data: append([]byte(nil), l.Data...), Src: l.Src, Cont: l.Cont, More: l.More})
			return nil
		}, journal.WithChunkBytes(5)) // tiny chunks: lines reassembled across fetches
		if err != nil {
			t.Fatalf("read from %d: %v", from, err)
		}
		return lines, end
	}
	first, end := read(0)
	if len(first) != 2 || string(first[0].Data) != `{"a":1}` || string(first[1].Data) != `{"b":2}` || !end.Finished {
		t.Fatalf("first read = %+v, end %+v", first, end)
	}
	if first[0].Src != 8 || first[1].Src != 16 {
		t.Fatalf("positions %d, %d; want 8, 16 (bytes after each line)", first[0].Src, first[1].Src)
	}
	resumed, end2 := read(first[0].Src)
	if len(resumed) != 1 || string(resumed[0].Data) != `{"b":2}` || resumed[0].Src != first[1].Src || end2.Pos != end.Pos {
		t.Fatalf("resumed read = %+v, end %+v (first end %+v)", resumed, end2, end)
	}
}

func journalJ5(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf-follow")
	gate := "gate-" + runID
	r.launch(psid, runID, printDeltas("a")+waitGate(gate)+`[ -f `+journal.Quote(gate)+` ] || printf '{"gate":"never"}\n'`+"\n"+printDeltas("b"))
	if r.exists(psid, gate) {
		t.Fatal("premise: the gate exists before the reader opened it")
	}
	ctx, cancel := context.WithTimeout(r.ctx, rigWait)
	defer cancel()
	var seen []string
	end, err := journal.Read(ctx, r.ex, psid, rigJournalDir, runID, 0, true, func(l journal.Line) error {
		seen = append(seen, string(l.Data))
		if len(seen) == 1 {
			// Only a reader that delivered line 1 before line 2 existed can open the gate.
			r.exec(psid, ": >> "+journal.Quote(gate))
		}
		return nil
	}, journal.WithPollInterval(20*time.Millisecond))
	if err != nil || !end.Finished || end.ExitCode != 0 {
		t.Fatalf("follow read: end %+v, err %v (backstopped?)", end, err)
	}
	if strings.Join(seen, "|") != `{"delta":"a"}|{"delta":"b"}` {
		t.Fatalf("lines = %q", seen)
	}
}

func journalJ6(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf-abort")
	r.launch(psid, runID, printDeltas("a")+waitGate("never-"+runID))
	t.Cleanup(func() { _ = journal.KillAgent(context.Background(), r.ex, psid, rigJournalDir, runID) })
	backstop, stopBackstop := context.WithTimeout(r.ctx, rigWait)
	defer stopBackstop()
	ctx, stop := context.WithCancel(backstop)
	var seen []string
	_, err := journal.Read(ctx, r.ex, psid, rigJournalDir, runID, 0, true, func(l journal.Line) error {
		seen = append(seen, string(l.Data))
		stop() // never a refusal from fn: only the context may end the read
		return nil
	}, journal.WithPollInterval(20*time.Millisecond))
	if backstop.Err() != nil {
		t.Fatal("the read ran into the backstop: it ignored its context")
	}
	if !errors.Is(err, context.Canceled) || strings.Join(seen, "|") != `{"delta":"a"}` {
		t.Fatalf("read = %q, err %v; want one line and context.Canceled", seen, err)
	}
}

func journalJ7(t *testing.T, r *rig) {
	psid, runID := r.sandbox(), r.id("conf-kill")
	// The real work is a grandchild of the wrapper: a background loop ticking a file.
	r.launch(psid, runID, `( i=0; while [ ! -f stop ] && [ $i -lt 1200 ]; do printf x >> hb; sleep 0.05; i=$((i+1)); done ) & wait`)
	t.Cleanup(func() { _, _ = r.ex.Exec(context.Background(), psid, ": >> stop") })
	size := func() int {
		n, err := strconv.Atoi(strings.TrimSpace(string(r.exec(psid, "wc -c < hb 2>/dev/null || echo -1").Stdout)))
		if err != nil {
			return -2
		}
		return n
	}
	r.eventually("the heartbeat to tick twice", func() bool { return size() >= 2 })
	if err := journal.KillAgent(r.ctx, r.ex, psid, rigJournalDir, runID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	// A surviving loop ticks every 50 ms: 10 samples 60 ms apart after a settle sample
	// would see it grow; a killed one never does.
	time.Sleep(100 * time.Millisecond)
	base := size()
	grew := 0
	for range 10 {
		time.Sleep(60 * time.Millisecond)
		if size() != base {
			grew++
		}
	}
	if base < 2 || grew > 0 {
		t.Fatalf("heartbeat after kill: base %d, grew in %d of 10 samples", base, grew)
	}
	if r.waitNoSentinel(psid, runID) {
		t.Fatal("the killed wrapper still wrote a sentinel")
	}
}

// waitNoSentinel reports whether runID's journal carries a sentinel right now.
func (r *rig) waitNoSentinel(psid, runID string) bool {
	return journal.Probe(r.ctx, r.ex, psid, rigJournalDir, runID).State == journal.Finished
}
