package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// agent200 prints 200 numbered JSON lines over about 4 s.
const agent200 = `i=1; while [ $i -le 200 ]; do echo "{\"n\":$i}"; i=$((i+1)); sleep 0.02; done`

// numbers returns the "n" of each event line, failing on any other line.
func numbers(t *testing.T, evs []eventLine) []int {
	t.Helper()
	return numbered(t, evs, "n")
}

// numbered returns member key (a number) of each event line, failing on any other line.
func numbered(t *testing.T, evs []eventLine, key string) []int {
	t.Helper()
	out := make([]int, 0, len(evs))
	for _, e := range evs {
		var v map[string]int
		err := json.Unmarshal(e.Data, &v)
		n, ok := v[key]
		if err != nil || !ok {
			t.Fatalf("event %d is not a numbered line: %s", e.Offset, e.Data)
		}
		out = append(out, n)
	}
	return out
}

// checkOneToN fails unless ns is exactly 1..n in order.
func checkOneToN(t *testing.T, what string, ns []int, n int) {
	t.Helper()
	if len(ns) != n {
		t.Fatalf("%s: %d lines, want %d: %v", what, len(ns), n, ns)
	}
	for i, v := range ns {
		if v != i+1 {
			t.Fatalf("%s: line %d is %d, want %d (lines %v)", what, i, v, i+1, ns)
		}
	}
}

// completeLines is the events of the complete lines of out (a killed process may leave
// half a line).
func completeLines(t *testing.T, out string) []eventLine {
	t.Helper()
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		return parseEvents(t, out[:i+1])
	}
	return nil
}

// storedLog reads run's whole log through the API; it fails unless the log is closed.
func storedLog(t *testing.T, c *apiclient.Client, runID string) []eventLine {
	t.Helper()
	ctx := clitest.Context(t)
	var out []eventLine
	var after int64
	for {
		page, err := c.ReadEvents(ctx, runID, apiclient.ReadOptions{After: after, Limit: wire.MaxReadLimit})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			out = append(out, eventLine{Offset: e.Offset, Data: e.Data})
		}
		after = page.Next
		if page.Closed {
			return out
		}
		if len(page.Events) == 0 {
			t.Fatalf("the log of %s is not closed (after %d events)", runID, len(out))
		}
	}
}

func devClient(t *testing.T, dev *clitest.Dev) *apiclient.Client {
	t.Helper()
	c, err := apiclient.New(apiclient.Config{BaseURL: dev.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitStatus polls (bounded) until the run has status want.
func waitStatus(t *testing.T, c *apiclient.Client, runID string, want contract.RunStatus) contract.RunRecord {
	t.Helper()
	ctx := clitest.Context(t)
	deadline := time.Now().Add(clitest.Deadline)
	for {
		run, err := c.GetRun(ctx, runID)
		if err == nil && run.Status == want {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: %+v (%v), want %s", runID, run, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestProofHostCrashTakeover: `sandkeep run` is SIGKILLed after printing ≥ 20 lines;
// `sandkeep attach --after <last offset printed>` in a new process drives the run to its
// end. Together the two outputs hold lines 1..200 exactly once, in order; the run ends
// completed with its log closed.
func TestProofHostCrashTakeover(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		host := skStart(t, dev, "run", "--thread", "th-crash", "--run", "run-crash", "--", agent200)
		host.WaitLines(t, 20)
		host.Signal(t, syscall.SIGKILL)
		if code := host.Wait(t); code != -1 {
			t.Fatalf("host exit %d, want killed", code)
		}
		first := completeLines(t, host.Stdout.String())
		last := first[len(first)-1].Offset

		code, out, errOut := sk(t, dev, "attach", "run-crash", "--after", strconv.FormatInt(last, 10))
		if code != 0 {
			t.Fatalf("attach: exit %d\n%s", code, errOut)
		}
		second := parseEvents(t, out)
		t.Logf("host printed %d lines before SIGKILL, attach printed %d", len(first), len(second))
		checkOneToN(t, "host + attach output", append(numbers(t, first), numbers(t, second)...), 200)
		c := devClient(t, dev)
		if run := waitStatus(t, c, "run-crash", contract.StatusCompleted); run.Epoch() < 2 {
			t.Fatalf("completed at epoch %d, want a takeover", run.Epoch())
		}
		checkOneToN(t, "stored log", numbers(t, storedLog(t, c, "run-crash")), 200)
	}, "--no-ship") // a host-side proof: the run is driven by its host
}

var attachHintRE = regexp.MustCompile(`sandkeep attach (\S+) --after (\d+)`)

// followHintRE is how `run` says to watch a shipped run again after Ctrl-C.
var followHintRE = regexp.MustCompile(`sandkeep tail (\S+) --follow --after (\d+)`)

// TestProofNobodyComesBack: Ctrl-C on `run` of a shipped run stops the watching (exit 3,
// `sandkeep tail RUN --follow --after N` on stderr, N the last offset printed) and
// detaches nothing; the sandbox ships the rest and ends the run completed with no host
// and no reaper sweep (--reap-every 1h), all 200 lines in the log exactly once; `tail
// --follow --after N` prints exactly the rest.
func TestProofNobodyComesBack(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		host := skStart(t, dev, "run", "--thread", "th-gone", "--run", "run-gone", "--", agent200)
		host.WaitLines(t, 20)
		host.Signal(t, syscall.SIGINT)
		if code := host.Wait(t); code != exitDetached {
			t.Fatalf("run exit %d after SIGINT, want %d\n%s", code, exitDetached, host.Stderr)
		}
		m := followHintRE.FindStringSubmatch(host.Stderr.String())
		if m == nil || m[1] != "run-gone" || !strings.Contains(host.Stderr.String(), "it goes on in its sandbox") {
			t.Fatalf("stderr does not say how to watch again:\n%s", host.Stderr)
		}
		printed := parseEvents(t, host.Stdout.String())
		if n, _ := strconv.ParseInt(m[2], 10, 64); n != printed[len(printed)-1].Offset {
			t.Fatalf("hint --after %s, last printed offset %d", m[2], printed[len(printed)-1].Offset)
		}
		c := devClient(t, dev)
		if run, err := c.GetRun(clitest.Context(t), "run-gone"); err != nil || run.DetachedSince != nil {
			t.Fatalf("after Ctrl-C the run must not be detached: %+v %v", run, err)
		}
		code, out, errOut := sk(t, dev, "tail", "run-gone", "--follow", "--after", m[2])
		if code != 0 || !strings.Contains(errOut, "run run-gone completed") {
			t.Fatalf("tail --follow --after %s: exit %d\n%s", m[2], code, errOut)
		}
		checkOneToN(t, "run + tail output", append(numbers(t, printed), numbers(t, parseEvents(t, out))...), 200)
		run := waitStatus(t, c, "run-gone", contract.StatusCompleted)
		checkOneToN(t, "stored log", numbers(t, storedLog(t, c, "run-gone")), 200)
		t.Logf("completed in its sandbox at epoch %d", run.Epoch())
	}, "--reap-every", "1h")
}

// runSandboxRE is the sandbox line `sandkeep run` writes on stderr once its run started:
// the provider, its sandbox id and the start's outcome (created or resumed).
var runSandboxRE = regexp.MustCompile(`sandkeep: run \S+ on thread \S+ \((\S+) sandbox (\S+), (\w+)\)`)

// TestProofNobodyComesBackToAHost: on the host fallback (--no-ship) the host detaches
// (SIGINT, exit 3, the attach command on stderr); the agent finishes on its own; a reaper
// sweep finalizes the run completed with all 200 lines in the log exactly once. The
// reaper leaves the thread's sandbox to the idle stop (docs/design.md §5): the thread's
// next start resumes the same sandbox, the file the first run wrote still in it.
func TestProofNobodyComesBackToAHost(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		host := skStart(t, dev, "run", "--thread", "th-gone", "--run", "run-gone", "--", "echo kept > kept.txt; "+agent200)
		host.WaitLines(t, 20)
		host.Signal(t, syscall.SIGINT)
		if code := host.Wait(t); code != exitDetached {
			t.Fatalf("host exit %d after SIGINT, want %d\n%s", code, exitDetached, host.Stderr)
		}
		m := attachHintRE.FindStringSubmatch(host.Stderr.String())
		if m == nil || m[1] != "run-gone" {
			t.Fatalf("stderr does not say how to attach:\n%s", host.Stderr)
		}
		printed := parseEvents(t, host.Stdout.String())
		if n, _ := strconv.ParseInt(m[2], 10, 64); n != printed[len(printed)-1].Offset {
			t.Fatalf("attach hint --after %s, last printed offset %d", m[2], printed[len(printed)-1].Offset)
		}
		c := devClient(t, dev)
		if run, err := c.GetRun(clitest.Context(t), "run-gone"); err != nil || run.DetachedSince == nil {
			t.Fatalf("after the detach: %+v %v", run, err)
		}
		run := waitStatus(t, c, "run-gone", contract.StatusCompleted)
		checkOneToN(t, "stored log", numbers(t, storedLog(t, c, "run-gone")), 200)
		t.Logf("finalized by the reaper at epoch %d", run.Epoch())
		first := runSandboxRE.FindStringSubmatch(host.Stderr.String())
		if first == nil || first[3] != "created" {
			t.Fatalf("the first run's sandbox line: %q\n%s", first, host.Stderr)
		}
		// The thread's next start, through the API client (no further process): the same
		// sandbox resumed, the first run's file in it.
		ctx := clitest.Context(t)
		next, err := c.Start(ctx, wire.StartRequest{RunID: "run-gone-next", ThreadID: "th-gone",
			Sandbox: &wire.SetupRequest{ID: "default", Provider: first[1]}}) // sandkeep run's defaults
		if err != nil || next.Outcome != "resumed" || next.Sandbox.ProviderSandboxID != first[2] {
			t.Fatalf("the thread's next start: %+v %s (%v); want %s resumed", next.Sandbox, next.Outcome, err, first[2])
		}
		if b, err := os.ReadFile(filepath.Join(dev.SandboxDir, first[2], "kept.txt")); err != nil || string(b) != "kept\n" {
			t.Fatalf("the first run's kept.txt in the resumed sandbox: %q %v", b, err)
		}
		if _, err := c.Finish(ctx, "run-gone-next", wire.FinishRequest{Cursor: next.Cursor, Status: "completed"}); err != nil {
			t.Fatal(err)
		}
	}, "--reap-every", "300ms", "--no-ship")
}

// agentPIDs is an agent that reports its shell's pid and a child's, then ticks forever.
const agentPIDs = `sleep 600 & echo "{\"pid\":$$,\"child\":$!}"; while true; do echo '{"tick":1}'; sleep 0.05; done`

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// TestProofStopFromElsewhere: `sandkeep cancel` from a third process while a run is
// driven: the host exits 130, the run ends aborted, no process of the agent is left, the
// log is closed.
func TestProofStopFromElsewhere(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		host := skStart(t, dev, "run", "--thread", "th-stop", "--run", "run-stop", "--", agentPIDs)
		lines := host.WaitLines(t, 3)
		var pids struct{ PID, Child int }
		if err := json.Unmarshal(parseEvents(t, lines[0]+"\n")[0].Data, &pids); err != nil || pids.PID == 0 || !alive(pids.PID) || !alive(pids.Child) {
			t.Fatalf("agent pids %+v (%v) from %q", pids, err, lines[0])
		}
		t0 := time.Now()
		if code, _, errOut := sk(t, dev, "cancel", "run-stop"); code != 0 {
			t.Fatalf("cancel: exit %d %s", code, errOut)
		}
		if code := host.Wait(t); code != exitAborted {
			t.Fatalf("host exit %d after cancel, want %d\n%s", code, exitAborted, host.Stderr)
		}
		took := time.Since(t0)
		c := devClient(t, dev)
		run := waitStatus(t, c, "run-stop", contract.StatusAborted)
		t.Logf("cancel to host exit: %v (run %s, error %+v)", took, run.Status, run.Error)
		storedLog(t, c, "run-stop")
		deadline := time.Now().Add(10 * time.Second)
		for alive(pids.PID) || alive(pids.Child) {
			if time.Now().After(deadline) {
				t.Fatalf("agent processes left after abort: shell %d alive %v, child %d alive %v", pids.PID, alive(pids.PID), pids.Child, alive(pids.Child))
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// TestProofTwoHostsRace: two `attach` processes at once: one drives the run to its end,
// the other exits 4 saying another driver took over; the log holds no line twice.
func TestProofTwoHostsRace(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		host := skStart(t, dev, "run", "--thread", "th-race", "--run", "run-race", "--", agent200)
		host.WaitLines(t, 20)
		host.Signal(t, syscall.SIGKILL)
		host.Wait(t)
		first := completeLines(t, host.Stdout.String())
		after := strconv.FormatInt(first[len(first)-1].Offset, 10)

		a := skStart(t, dev, "attach", "run-race", "--after", after)
		b := skStart(t, dev, "attach", "run-race", "--after", after)
		ca, cb := a.Wait(t), b.Wait(t)
		winner, loser := a, b
		if ca != 0 {
			winner, loser, ca, cb = b, a, cb, ca
		}
		if ca != 0 || cb != exitSuperseded {
			t.Fatalf("attach exits %d and %d, want 0 and %d\nA: %s\nB: %s", ca, cb, exitSuperseded, a.Stderr, b.Stderr)
		}
		if !strings.Contains(loser.Stderr.String(), "taken over by another driver") {
			t.Fatalf("the loser's message: %s", loser.Stderr)
		}
		checkOneToN(t, "host + winner output", append(numbers(t, first), numbers(t, parseEvents(t, winner.Stdout.String()))...), 200)
		c := devClient(t, dev)
		waitStatus(t, c, "run-race", contract.StatusCompleted)
		checkOneToN(t, "stored log", numbers(t, storedLog(t, c, "run-race")), 200)
	}, "--no-ship") // a host-side proof: the run is driven by its host
}
