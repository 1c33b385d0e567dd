package journal_test

// Real-shell tests against the local-process provider: the intent of the reference's seven
// journal conformance cases (J1–J7), plus launch, hostile ids, probe, read alignment and
// the sweep listing. Waits are bounded polls with deadlines; timing never decides a result.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// tenantCtx is t's context in the empty tenant, chosen explicitly: these journals are
// named for it.
func tenantCtx(t *testing.T) context.Context { return contract.WithTenant(t.Context(), "") }

type box struct {
	t    *testing.T
	p    *localprocess.Provider
	id   string // provider sandbox id
	root string // the sandbox directory
	dir  string // the journal directory, inside the sandbox
}

func newBox(t *testing.T) *box {
	t.Helper()
	p := localprocess.New(filepath.Join(t.TempDir(), "sandboxes"))
	id, err := p.Create(tenantCtx(t), contract.CreateInput{Name: "sk_journal"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), id) })
	root, _ := p.Path(id)
	return &box{t: t, p: p, id: id, root: root, dir: filepath.Join(root, "runs")}
}

// sh runs a command in the sandbox and fails the test on an infrastructure error.
func (b *box) sh(cmd string) contract.ExecResult {
	b.t.Helper()
	res, err := b.p.Exec(tenantCtx(b.t), b.id, cmd)
	if err != nil {
		b.t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

// runAgent runs agent journaled in the foreground, so the sentinel is there on return.
func (b *box) runAgent(runID, agent string) {
	b.t.Helper()
	if res := b.sh(journal.Command(b.dir, "", runID, agent)); res.ExitCode != 0 {
		b.t.Fatalf("journaled %q exited %d: %s", agent, res.ExitCode, res.Stderr)
	}
}

func (b *box) paths(runID string) journal.Paths {
	b.t.Helper()
	p, err := journal.PathsFor(b.dir, "", runID)
	if err != nil {
		b.t.Fatal(err)
	}
	return p
}

// cat reads a file through the sandbox shell.
func (b *box) cat(path string) string {
	b.t.Helper()
	return string(b.sh("cat -- " + journal.Quote(path) + " 2>/dev/null").Stdout)
}

func (b *box) exists(path string) bool {
	b.t.Helper()
	return b.sh("test -e "+journal.Quote(path)).ExitCode == 0
}

// readAll reads runID's journal from `from` without following.
func (b *box) readAll(runID string, from int64, opts ...journal.ReadOption) ([]journal.Line, journal.End) {
	b.t.Helper()
	var lines []journal.Line
	end, err := journal.Read(tenantCtx(b.t), b.p, b.id, b.dir, runID, from, false, func(l journal.Line) error {
		lines = append(lines, l)
		return nil
	}, opts...)
	if err != nil {
		b.t.Fatalf("read %s from %d: %v", runID, from, err)
	}
	return lines, end
}

func texts(lines []journal.Line) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = string(l.Data)
	}
	return out
}

// eventually polls cond every 10 ms until it holds or 20 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processGone reports whether pid no longer runs (absent, or a zombie).
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// J1: a command's stdout lands in the journal, then exactly one sentinel line.
func TestJ1StdoutAndSentinel(t *testing.T) {
	b := newBox(t)
	run := "conf-1"
	b.runAgent(run, `printf '{"a":1}\n{"b":2}\n'`)
	want := "{\"a\":1}\n{\"b\":2}\n" + journal.SentinelLine(run, 0) + "\n"
	if got := b.cat(b.paths(run).Journal); got != want {
		t.Fatalf("journal %q, want %q", got, want)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(b.cat(b.paths(run).PID)))
	if err != nil || pid <= 1 {
		t.Fatalf("pid file %q: %v", b.cat(b.paths(run).PID), err)
	}
}

// J2: `exit 7` ends only the subshell; the sentinel records 7.
func TestJ2NonZeroExitRecorded(t *testing.T) {
	b := newBox(t)
	run := "conf-exit"
	b.runAgent(run, "exit 7")
	if got, want := b.cat(b.paths(run).Journal), journal.SentinelLine(run, 7)+"\n"; got != want {
		t.Fatalf("journal %q, want %q", got, want)
	}
}

// J3: stderr goes to the sidecar, never into the journal.
func TestJ3StderrKeptOut(t *testing.T) {
	b := newBox(t)
	run := "conf-err"
	b.runAgent(run, `echo '{"a":1}'; echo 'a warning' >&2`)
	j := b.cat(b.paths(run).Journal)
	if want := "{\"a\":1}\n" + journal.SentinelLine(run, 0) + "\n"; j != want || strings.Contains(j, "warning") {
		t.Fatalf("journal %q, want %q", j, want)
	}
	if got := b.cat(b.paths(run).Stderr); got != "a warning\n" {
		t.Fatalf("stderr sidecar %q", got)
	}
	tail, err := journal.StderrTail(tenantCtx(t), b.p, b.id, b.dir, run, 4)
	if err != nil || string(tail) != "ing\n" {
		t.Fatalf("stderr tail %q %v", tail, err)
	}
}

// J4: reads resume from absolute byte positions, whatever the chunk size.
func TestJ4ReadFromOffset(t *testing.T) {
	b := newBox(t)
	run := "conf-seek"
	b.runAgent(run, `printf '{"a":1}\n{"b":2}\n'`)
	for _, chunk := range []int{5, 16, journal.DefaultChunkBytes} {
		first, end := b.readAll(run, 0, journal.WithChunkBytes(chunk))
		if got := texts(first); len(got) != 2 || got[0] != `{"a":1}` || got[1] != `{"b":2}` {
			t.Fatalf("chunk %d: lines %q", chunk, got)
		}
		if first[0].Src != 8 || first[1].Src != 16 {
			t.Fatalf("chunk %d: srcs %d %d, want 8 16", chunk, first[0].Src, first[1].Src)
		}
		wantEnd := journal.End{Pos: 16 + int64(len(journal.SentinelLine(run, 0))) + 1, Finished: true}
		if end != wantEnd {
			t.Fatalf("chunk %d: end %+v, want %+v", chunk, end, wantEnd)
		}
		resumed, end2 := b.readAll(run, first[0].Src, journal.WithChunkBytes(chunk))
		if len(resumed) != 1 || string(resumed[0].Data) != `{"b":2}` || resumed[0].Src != first[1].Src || end2 != end {
			t.Fatalf("chunk %d: resumed %q %+v", chunk, texts(resumed), end2)
		}
	}
}

// J5: follow delivers each line before the next is produced: the agent prints line 2 only
// after the reader, having received line 1, creates the gate. A buffering reader would
// never see line 2 (the agent gives up and prints {"gate":"never"}).
func TestJ5FollowIncremental(t *testing.T) {
	b := newBox(t)
	run := "conf-follow"
	gate := filepath.Join(b.root, "gate")
	agent := `printf '{"a":1}\n'; i=0; while [ ! -e gate ] && [ $i -lt 1000 ]; do sleep 0.02; i=$((i+1)); done; ` +
		`[ -e gate ] || printf '{"gate":"never"}\n'; printf '{"b":2}\n'`
	if _, err := journal.Launch(tenantCtx(t), b.p, b.id, b.dir, run, agent); err != nil {
		t.Fatal(err)
	}
	if b.exists(gate) {
		t.Fatal("premise: gate exists before the read")
	}
	ctx, cancel := context.WithTimeout(tenantCtx(t), 60*time.Second) // backstop, never the assertion
	defer cancel()
	var lines []string
	end, err := journal.Read(ctx, b.p, b.id, b.dir, run, 0, true, func(l journal.Line) error {
		lines = append(lines, string(l.Data))
		if len(lines) == 1 {
			b.sh(": >> gate")
		}
		return nil
	}, journal.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatalf("follow read: %v (backstopped: %v)", err, ctx.Err() != nil)
	}
	if strings.Join(lines, "|") != `{"a":1}|{"b":2}` || !end.Finished || end.ExitCode != 0 {
		t.Fatalf("lines %q end %+v", lines, end)
	}
}

// J6: a follow read stops when its ctx is cancelled, without any consumer break.
func TestJ6FollowStopsOnCancel(t *testing.T) {
	b := newBox(t)
	run := "conf-abort"
	if _, err := journal.Launch(tenantCtx(t), b.p, b.id, b.dir, run, `printf '{"a":1}\n'; sleep 300`); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(tenantCtx(t))
	backstop, cancelBackstop := context.WithTimeout(ctx, 60*time.Second)
	defer cancelBackstop()
	var seen []string
	end, err := journal.Read(backstop, b.p, b.id, b.dir, run, 0, true, func(l journal.Line) error {
		seen = append(seen, string(l.Data))
		stop()
		return nil
	}, journal.WithPollInterval(10*time.Millisecond))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("read ended with %v, want the cancellation", err)
	}
	if strings.Join(seen, "|") != `{"a":1}` || end.Finished || end.Pos != 8 {
		t.Fatalf("seen %q end %+v", seen, end)
	}
	if err := journal.KillAgent(tenantCtx(t), b.p, b.id, b.dir, run); err != nil {
		t.Fatal(err)
	}
}

// J7: killing the agent kills the sandbox-side work, a grandchild of the launcher, not just
// the host's view of it; the journal then has no sentinel.
func TestJ7KillReachesGrandchild(t *testing.T) {
	b := newBox(t)
	run := "conf-kill"
	agent := `( while [ ! -e stop ]; do printf . >> hb; sleep 0.05; done ) & echo $! > hb.pid; wait`
	pgid, err := journal.Launch(tenantCtx(t), b.p, b.id, b.dir, run, agent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(filepath.Join(b.root, "stop"), nil, 0o644) })
	eventually(t, "two heartbeats", func() bool {
		n, _ := strconv.Atoi(strings.TrimSpace(string(b.sh("wc -c < hb 2>/dev/null").Stdout)))
		return n >= 2
	})
	hb, err := strconv.Atoi(strings.TrimSpace(b.cat(filepath.Join(b.root, "hb.pid"))))
	if err != nil {
		t.Fatal(err)
	}
	if got, found, err := journal.PID(tenantCtx(t), b.p, b.id, b.dir, run); err != nil || !found || got != pgid {
		t.Fatalf("pid file = %d %v %v, want the launch's group %d", got, found, err, pgid)
	}
	if processGone(hb) {
		t.Fatal("premise: heartbeat not running")
	}
	if err := journal.KillAgent(tenantCtx(t), b.p, b.id, b.dir, run); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the heartbeat grandchild to die", func() bool { return processGone(hb) })
	eventually(t, "the launcher to die", func() bool { return processGone(pgid) })
	if r := journal.Probe(tenantCtx(t), b.p, b.id, b.dir, run); r.State != journal.Producing {
		t.Fatalf("probe of a killed agent = %+v, want producing (no sentinel)", r)
	}
	if err := journal.KillAgent(tenantCtx(t), b.p, b.id, b.dir, run); err != nil {
		t.Fatalf("second kill: %v", err)
	}
}

// A retried launch never starts a second agent: sequentially (Launch's check) and under
// concurrency (the script's atomic create).
func TestLaunchNeverTwice(t *testing.T) {
	b := newBox(t)
	ctx := tenantCtx(t)
	run := "launch-once"
	agent := `echo x >> launches; printf '{"n":1}\n'`
	if _, err := journal.Launch(ctx, b.p, b.id, b.dir, run, agent); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sentinel", func() bool { return journal.Probe(ctx, b.p, b.id, b.dir, run).State == journal.Finished })
	if _, err := journal.Launch(ctx, b.p, b.id, b.dir, run, agent); !errors.Is(err, journal.ErrJournalExists) {
		t.Fatalf("second launch: %v, want ErrJournalExists", err)
	}
	// The script alone refuses too (a launcher that skipped the check).
	if res := b.sh(journal.Command(b.dir, "", run, agent)); res.ExitCode != journal.ExitJournalExists {
		t.Fatalf("re-run script exited %d, want %d", res.ExitCode, journal.ExitJournalExists)
	}
	if got := b.cat(filepath.Join(b.root, "launches")); got != "x\n" {
		t.Fatalf("launches %q, want one", got)
	}

	// Concurrent launches of one run: every script races for the journal's creation, and
	// only the O_EXCL create can tell them apart.
	const racers = 8
	race := "launch-race"
	script := journal.Command(b.dir, "", race, `echo x >> race-launches`)
	codes := make([]int, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			res, err := b.p.Exec(ctx, b.id, script)
			if err != nil {
				t.Error(err)
			}
			codes[i] = res.ExitCode
		})
	}
	wg.Wait()
	launched, refused := 0, 0
	for _, c := range codes {
		switch c {
		case 0:
			launched++
		case journal.ExitJournalExists:
			refused++
		}
	}
	t.Logf("concurrent launches: %d, launched: %d, refused: %d", racers, launched, refused)
	if launched != 1 || refused != racers-1 {
		t.Fatalf("exit codes %v: want one launch and %d refusals", codes, racers-1)
	}
	if got := b.cat(filepath.Join(b.root, "race-launches")); got != "x\n" {
		t.Fatalf("%d concurrent launches ran %d agents", racers, strings.Count(got, "x"))
	}
	if j := b.cat(b.paths(race).Journal); strings.Count(j, "__exit") != 1 {
		t.Fatalf("race journal %q: want exactly one sentinel", j)
	}
}

// A shell-hostile run id (and journal dir) goes through launch, follow, probe, stderr,
// list/decode and delete without executing any of it.
func TestHostileRunIDIsInert(t *testing.T) {
	b := newBox(t)
	ctx := tenantCtx(t)
	canaries, err := os.MkdirTemp("", "c") // short: each "/" costs three characters encoded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(canaries) })
	c := func(n string) string { return filepath.Join(canaries, n) }
	ids := []string{
		`x'; touch /tmp/pwned; '$(touch /tmp/pwned2)`,
		"a;touch " + c("1") + ";b c/d",
		"$(touch " + c("2") + ")`touch " + c("3") + "`",
		"-\"'\\\ntouch " + c("4") + "\n",
		// Too long to encode reversibly: capped, so a sweep can never decode (or delete) it.
		strings.Repeat("$(touch "+c("1")+")", 12),
	}
	system := []string{"/tmp/pwned", "/tmp/pwned2"}
	for _, f := range system {
		_ = os.Remove(f) // a leftover from elsewhere would fake a failure
	}
	assertInert := func(step string) {
		t.Helper()
		for _, f := range append(system, c("1"), c("2"), c("3"), c("4"), c("5"), filepath.Join(b.root, "pwned")) {
			if _, err := os.Lstat(f); err == nil {
				t.Fatalf("%s: canary %s exists: hostile input was executed", step, f)
			}
		}
	}
	b.dir = filepath.Join(b.root, "j'$(touch "+c("5")+")")
	for _, run := range ids {
		if _, err := journal.Launch(ctx, b.p, b.id, b.dir, run, `printf '{"delta":"1"}\n'; echo boom >&2`); err != nil {
			t.Fatal(err)
		}
		assertInert("launch")
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		var lines []string
		end, err := journal.Read(rctx, b.p, b.id, b.dir, run, 0, true, func(l journal.Line) error {
			lines = append(lines, string(l.Data))
			return nil
		}, journal.WithPollInterval(10*time.Millisecond))
		cancel()
		if err != nil || !end.Finished || end.ExitCode != 0 || strings.Join(lines, "|") != `{"delta":"1"}` {
			t.Fatalf("follow: %q %+v %v", lines, end, err)
		}
		assertInert("follow")
		if r := journal.Probe(ctx, b.p, b.id, b.dir, run); r.State != journal.Finished || r.ExitCode != 0 {
			t.Fatalf("probe: %+v", r)
		}
		p := b.paths(run)
		if base := filepath.Base(p.Journal); strings.Trim(base, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" ||
			!strings.HasPrefix(p.Journal, b.dir+"/") {
			t.Fatalf("journal path %q escapes or carries unsafe characters", p.Journal)
		}
		if tail, err := journal.StderrTail(ctx, b.p, b.id, b.dir, run, 0); err != nil || string(tail) != "boom\n" {
			t.Fatalf("stderr: %q %v", tail, err)
		}
		assertInert("stderr")
		l, err := journal.List(ctx, b.p, b.id, b.dir)
		if len(journal.Encode(run)) == journal.MaxNameLen {
			if err != nil || len(l.Runs) != 0 || len(l.Undecodable) != 3 {
				t.Fatalf("list of a capped name: %+v %v", l, err)
			}
		} else if err != nil || len(l.Runs) != 1 || l.Runs[0].RunID != run || len(l.Runs[0].Names) != 3 || len(l.Undecodable) != 0 {
			t.Fatalf("list: %+v %v", l, err)
		}
		assertInert("list")
		if err := journal.Delete(ctx, b.p, b.id, b.dir, run); err != nil {
			t.Fatal(err)
		}
		if b.exists(p.Journal) || b.exists(p.Stderr) || b.exists(p.PID) {
			t.Fatal("delete left files")
		}
		assertInert("delete")
	}
}

func TestProbeStates(t *testing.T) {
	b := newBox(t)
	ctx := tenantCtx(t)

	b.runAgent("p-exit", "exit 7")
	if r := journal.Probe(ctx, b.p, b.id, b.dir, "p-exit"); r.State != journal.Finished || r.ExitCode != 7 {
		t.Fatalf("exit 7: %+v", r)
	}
	// Over 4 KiB of output before the sentinel, and late output after it.
	b.runAgent("p-big", `i=0; while [ $i -lt 200 ]; do printf '{"pad":"%040d"}\n' $i; i=$((i+1)); done`)
	b.sh("printf '{\"late\":1}\\n' >> " + journal.Quote(b.paths("p-big").Journal))
	if r := journal.Probe(ctx, b.p, b.id, b.dir, "p-big"); r.State != journal.Finished || r.ExitCode != 0 {
		t.Fatalf("big journal: %+v", r)
	}

	// Producing: forged sentinels (no nonce, another run's) are not this run's exit.
	run := "p-live"
	agent := fmt.Sprintf(`printf '%%s\n' '{"__exit":0}' '%s'; while [ ! -e release ]; do sleep 0.02; done`, journal.SentinelLine("other", 0))
	if _, err := journal.Launch(ctx, b.p, b.id, b.dir, run, agent); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the forged lines", func() bool { lines, _ := b.readAll(run, 0); return len(lines) == 2 })
	if r := journal.Probe(ctx, b.p, b.id, b.dir, run); r.State != journal.Producing {
		t.Fatalf("live agent: %+v, want producing", r)
	}
	b.sh(": > release")
	eventually(t, "the agent to finish", func() bool {
		r := journal.Probe(ctx, b.p, b.id, b.dir, run)
		return r.State == journal.Finished && r.ExitCode == 0
	})

	if r := journal.Probe(ctx, b.p, b.id, b.dir, "never-launched"); r.State != journal.Unknown || !errors.Is(r.Err, journal.ErrNoJournal) {
		t.Fatalf("missing journal: %+v", r)
	}
	// A stopped sandbox answers unknown and is not started by the probe.
	if err := b.p.Stop(ctx, b.id); err != nil {
		t.Fatal(err)
	}
	if r := journal.Probe(ctx, b.p, b.id, b.dir, "p-exit"); r.State != journal.Unknown || !errors.Is(r.Err, localprocess.ErrStopped) {
		t.Fatalf("stopped sandbox: %+v", r)
	}
	if st, _ := b.p.Status(ctx, b.id); st != contract.SandboxStopped {
		t.Fatalf("the probe started the sandbox: %v", st)
	}
	if err := b.p.Destroy(ctx, b.id); err != nil {
		t.Fatal(err)
	}
	if r := journal.Probe(ctx, b.p, b.id, b.dir, "p-exit"); r.State != journal.Unknown || !errors.Is(r.Err, contract.ErrSandboxGone) {
		t.Fatalf("gone sandbox: %+v", r)
	}
}

// joined is what lines carry of the journal: each piece's bytes, a newline after each
// line's last piece.
func joined(lines []journal.Line) string {
	var b strings.Builder
	for _, l := range lines {
		b.Write(l.Data)
		if !l.More {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Translating a read gives one event per line with Src = the position after the line, and
// a line longer than MaxLineBytes as marked pieces that carry all of it; a successor
// resuming at any line's or piece's Src — mid-line included — reads exactly the rest, once.
func TestReadTranslateResumeExactlyOnce(t *testing.T) {
	b := newBox(t)
	run := "align"
	long := journal.MaxLineBytes + 1000
	agent := fmt.Sprintf(`printf '{"a":1}\nplain text\n'; head -c %d /dev/zero | tr '\0' q; printf '\n\n%s\n{"z":[1,2]}\n'`,
		long, journal.SentinelLine("other", 3))
	b.runAgent(run, agent)
	journalBytes := b.cat(b.paths(run).Journal)
	own := journal.SentinelLine(run, 0) + "\n"
	if !strings.HasSuffix(journalBytes, own) {
		t.Fatalf("premise: the journal ends with %q", journalBytes[max(0, len(journalBytes)-100):])
	}
	lines, end := b.readAll(run, 0, journal.WithChunkBytes(64<<10))
	if got := joined(lines); got != strings.TrimSuffix(journalBytes, own) {
		t.Fatalf("the read carries %d bytes of the journal's %d (before its sentinel)", len(got), len(journalBytes)-len(own))
	}
	pieces := 0
	for i, l := range lines {
		if len(l.Data) > journal.MaxLineBytes || (i > 0 && l.Src <= lines[i-1].Src) {
			t.Fatalf("line %d: %d bytes, src %d", i, len(l.Data), l.Src)
		}
		if !l.Whole() {
			pieces++
		}
	}
	if pieces < 2 {
		t.Fatalf("the %d-byte line came in %d pieces", long, pieces)
	}
	if !end.Finished || end.ExitCode != 0 || end.Pos != int64(len(journalBytes)) {
		t.Fatalf("end %+v, journal %d bytes", end, len(journalBytes))
	}
	tr := journal.NewTranslator(run)
	var evs []string
	var text strings.Builder
	for _, l := range lines {
		for _, ev := range tr.Events(l) {
			var p struct {
				More *bool   `json:"__more"`
				Line *string `json:"__line"`
			}
			if json.Unmarshal(ev.Data, &p) != nil || p.Line == nil {
				evs = append(evs, string(ev.Data))
				continue
			}
			text.WriteString(*p.Line)
			if !*p.More {
				evs = append(evs, fmt.Sprintf("line of %d q: %v", text.Len(), text.String() == strings.Repeat("q", long)))
				text.Reset()
			}
		}
	}
	want := []string{`{"a":1}`, `"plain text"`, fmt.Sprintf("line of %d q: true", long), `""`, journal.SentinelLine("other", 3), `{"z":[1,2]}`}
	if strings.Join(evs, "|") != strings.Join(want, "|") {
		t.Fatalf("events %q, want %q", evs, want)
	}
	for k := range lines {
		rest, end2 := b.readAll(run, lines[k].Src, journal.WithChunkBytes(64<<10))
		if joined(rest) != joined(lines[k+1:]) || end2 != end {
			t.Fatalf("resume after line %d (src %d): %d bytes, end %+v", k, lines[k].Src, len(joined(rest)), end2)
		}
		if len(rest) > 0 && rest[0].Cont != lines[k].More {
			t.Fatalf("resume after line %d: continuation %v, want %v", k, rest[0].Cont, lines[k].More)
		}
	}
}

// A partial last line is withheld (the agent is mid-write), and a line the consumer
// refuses is not counted as consumed.
func TestReadWithholdsPartialLineAndRefusedLine(t *testing.T) {
	b := newBox(t)
	run := "partial"
	j := b.paths(run).Journal
	b.sh("mkdir -p " + journal.Quote(b.dir) + " && printf '{\"a\":1}\\n{\"b\":' > " + journal.Quote(j))
	lines, end := b.readAll(run, 0)
	if len(lines) != 1 || end != (journal.End{Pos: 8}) {
		t.Fatalf("lines %q end %+v, want one line and pos 8", texts(lines), end)
	}
	b.sh("printf '2}\\n' >> " + journal.Quote(j))
	lines, end = b.readAll(run, end.Pos)
	if len(lines) != 1 || string(lines[0].Data) != `{"b":2}` || end.Pos != 16 || end.Finished {
		t.Fatalf("after completion: %q %+v", texts(lines), end)
	}
	refuse := errors.New("refused")
	end, err := journal.Read(tenantCtx(t), b.p, b.id, b.dir, run, 0, false, func(l journal.Line) error {
		if l.Src > 8 {
			return refuse
		}
		return nil
	})
	if !errors.Is(err, refuse) || end.Pos != 8 {
		t.Fatalf("refused line: end %+v err %v, want pos 8", end, err)
	}
	if _, err := journal.Read(tenantCtx(t), b.p, b.id, b.dir, run, -1, false, func(journal.Line) error { return nil }); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("negative position: %v", err)
	}
}

// The sweep listing: names decoded to run ids with the newest mtime of each run's files,
// undecodable names apart, dot-files included, ages from real mtimes set with touch -d.
func TestListForSweep(t *testing.T) {
	b := newBox(t)
	ctx := tenantCtx(t)
	if l, err := journal.List(ctx, b.p, b.id, b.dir); err != nil || len(l.Runs)+len(l.Undecodable) != 0 {
		t.Fatalf("missing dir: %+v %v", l, err)
	}
	b.sh("mkdir -p " + journal.Quote(b.dir))
	if l, err := journal.List(ctx, b.p, b.id, b.dir); err != nil || len(l.Runs)+len(l.Undecodable) != 0 {
		t.Fatalf("empty dir: %+v %v", l, err)
	}
	b.runAgent("fresh", "echo hi >&2")
	b.runAgent("old", "true")
	b.runAgent("mixed", "true")
	b.runAgent(".hidden", "true")
	q := journal.Quote
	capped := journal.Encode(strings.Repeat("L", 300)) + journal.ExtJournal
	b.sh("cd " + q(b.dir) + " && : > stray_1.ndjson && : > _41.ndjson && : > notes.txt && : > " + q(capped))
	old, mixed := b.paths("old"), b.paths("mixed")
	b.sh("touch -d '2 hours ago' " + q(old.Journal) + " " + q(old.Stderr) + " " + q(old.PID) + " " + q(mixed.Journal) + " " + q(mixed.PID))

	l, err := journal.List(ctx, b.p, b.id, b.dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]journal.Entry{}
	for _, e := range l.Runs {
		got[e.RunID] = e
	}
	if len(got) != 4 || got[".hidden"].RunID == "" || len(got["old"].Names) != 3 {
		t.Fatalf("runs %+v", l.Runs)
	}
	cutoff := time.Now().Add(-journal.OrphanAge)
	if !got["old"].OlderThan(cutoff) {
		t.Errorf("old run (mtime %v) not older than %v", got["old"].ModTime, cutoff)
	}
	// The newest of a run's files decides: mixed's sidecar is fresh.
	for _, id := range []string{"fresh", "mixed", ".hidden"} {
		if got[id].OlderThan(cutoff) {
			t.Errorf("%s (mtime %v) read as older than %v", id, got[id].ModTime, cutoff)
		}
	}
	wantUndecodable := []string{"_41.ndjson", capped, "notes.txt", "stray_1.ndjson"}
	slices.Sort(wantUndecodable)
	if !slices.Equal(l.Undecodable, wantUndecodable) {
		t.Fatalf("undecodable %v", l.Undecodable)
	}

	// Delete the orphan the way a sweep would; again is fine; the rest survive.
	for range 2 {
		if err := journal.Delete(ctx, b.p, b.id, b.dir, "old"); err != nil {
			t.Fatal(err)
		}
	}
	if b.exists(old.Journal) || b.exists(old.Stderr) || b.exists(old.PID) || !b.exists(b.paths("fresh").Journal) || !b.exists(b.paths("fresh").Stderr) {
		t.Fatal("delete removed the wrong files")
	}
	if r := journal.Probe(ctx, b.p, b.id, b.dir, "old"); !errors.Is(r.Err, journal.ErrNoJournal) {
		t.Fatalf("probe after delete: %+v", r)
	}
}

func TestInvalidInputsLaunchNothing(t *testing.T) {
	b := newBox(t)
	ctx := tenantCtx(t)
	for _, run := range []string{"", "bad\x00id", "\xff"} {
		if _, err := journal.Launch(ctx, b.p, b.id, b.dir, run, "touch launched"); !errors.Is(err, contract.ErrInvalid) {
			t.Errorf("launch %q: %v, want ErrInvalid", run, err)
		}
		if res := b.sh(journal.Command(b.dir, "", run, "touch launched")); res.ExitCode != journal.ExitInvalid {
			t.Errorf("script for %q exited %d, want %d", run, res.ExitCode, journal.ExitInvalid)
		}
	}
	if b.exists(filepath.Join(b.root, "launched")) {
		t.Fatal("an invalid run id launched its agent")
	}
	if p, err := journal.PathsFor("", "t", "r/1"); err != nil || p.Journal != "/tmp/sandkeep-runs/t_2fr_2f1.ndjson" || p.PID != "/tmp/sandkeep-runs/t_2fr_2f1.pid" {
		t.Fatalf("default paths %+v %v", p, err)
	}
	if p, _ := journal.PathsFor("-x//", "t", "r"); p.Journal != "./-x/t_2fr.ndjson" {
		t.Fatalf("dash dir: %q", p.Journal)
	}
	if _, err := journal.Launch(contract.WithTenant(ctx, "no spaces"), b.p, b.id, b.dir, "r", "touch launched"); !errors.Is(err, contract.ErrInvalid) {
		t.Errorf("launch under an invalid tenant: %v, want ErrInvalid", err)
	}
}
