package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// The process proofs of a shipper that dies or is superseded (docs/design.md §8.3): real
// `sandkeep dev` servers, real shippers and agents (local-process), plain HTTP calls and
// the CLI as a user makes them.

// shipKey is the cursor and ship-token key of the dev servers these proofs start
// (SANDKEEP_CURSOR_KEY), so a test can read a token's epoch and two servers act as one.
const shipKey = "ship-proofs-cursor-key-0123456789abcdef"

func shipKeyEnv() []string { return []string{envCursorKey + "=" + shipKey} }

// eachShipBackend is eachBackend with the shared cursor key in the dev server's environment.
func eachShipBackend(t *testing.T, fn func(t *testing.T, dev *clitest.Dev), devArgs ...string) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, clitest.StartDev(t, shipKeyEnv(), append(b.args(t), devArgs...)...))
		})
	}
}

// gatedAgent prints 1..n, one line each, and after each of stops waits until the test
// opens that gate (openGate(dir, stop)).
func gatedAgent(dir string, n int, stops ...int) string {
	var s []string
	for _, k := range stops {
		s = append(s, strconv.Itoa(k))
	}
	s = append(s, strconv.Itoa(n))
	return fmt.Sprintf(`i=1; for s in %s; do while [ $i -le $s ]; do echo $i; i=$((i+1)); done; [ $s -eq %d ] || while [ ! -e '%s/gate-'$s ]; do sleep 0.02; done; done`,
		strings.Join(s, " "), n, dir)
}

func openGate(t *testing.T, dir string, stop int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "gate-"+strconv.Itoa(stop)), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// runFile finds the run's journal file with extension ext (journal.Ext*) under a dev
// server's sandboxes.
func runFile(dir, runID, ext string) string {
	var found string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if _, id, e, ok := journal.SplitName(d.Name()); ok && id == runID && e == ext {
				found = p
			}
		}
		return nil
	})
	return found
}

// pidIn polls (bounded) for the run's pid file with extension ext and answers the pid it
// names; a shipper and an agent each lead their own process group.
func pidIn(t *testing.T, dir, runID, ext string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if p := runFile(dir, runID, ext); p != "" {
			if b, err := os.ReadFile(p); err == nil {
				if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 1 {
					return n
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s file of %s under %s", ext, runID, dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killGroupsAtEnd kills the run's agent group and its shippers' when the test ends (a
// server killed or left on a table does not stop the processes it launched).
func killGroupsAtEnd(t *testing.T, dir, runID string) {
	t.Helper()
	agent, shipper := pidIn(t, dir, runID, journal.ExtPID), pidIn(t, dir, runID, journal.ExtShipPID)
	t.Cleanup(func() {
		groups := []int{agent, shipper}
		if p := runFile(dir, runID, journal.ExtShipPID); p != "" { // a replacement's
			if b, err := os.ReadFile(p); err == nil {
				if pg, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pg > 1 {
					groups = append(groups, pg)
				}
			}
		}
		for _, pg := range groups {
			// Only a group still led from this test's sandboxes: the pid may be reused.
			if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pg)); err == nil && strings.HasPrefix(cwd, dir) {
				_ = syscall.Kill(-pg, syscall.SIGKILL)
			}
		}
	})
}

// killShipper kills the run's shipper (its whole process group; the agent is not in it)
// and waits until it is gone; it answers the shipper's pid.
func killShipper(t *testing.T, dir, runID string) int {
	t.Helper()
	pid := pidIn(t, dir, runID, journal.ExtShipPID)
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the shipper %d: %v", pid, err)
	}
	waitGroupGone(t, pid, "the killed shipper")
	return pid
}

func waitGroupGone(t *testing.T, pg int, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !groupGone(pg) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (process group %d) is still alive", what, pg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// onceInOrderErr reports whether got is 1..n exactly once, in order.
func onceInOrderErr(got []string, n int) error {
	if len(got) != n {
		return fmt.Errorf("%d events, want 1..%d exactly once: %q", len(got), n, got)
	}
	for i, g := range got {
		if g != strconv.Itoa(i+1) {
			return fmt.Errorf("event %d is %q, want %d: %q", i, g, i+1, got)
		}
	}
	return nil
}

// TestShipperKilledThenAttach: a shipper killed (its process group, not the agent) while
// its agent runs and writes on; then `sandkeep attach`, as a user runs it, finds it dead,
// takes the run over and starts a new shipper (it only follows: "shipped from its
// sandbox"), and prints 1..N exactly once in order; the run ends completed, its log 1..N.
func TestShipperKilledThenAttach(t *testing.T) {
	t.Parallel()
	eachShipBackend(t, func(t *testing.T, dev *clitest.Dev) {
		const runID, n = "run-kill", 15
		gates := t.TempDir()
		if got := startShipped(t, dev.URL, runID, gatedAgent(gates, n, 5, 10)); got != "sandbox" {
			t.Fatalf("shipping %q, want sandbox", got)
		}
		killGroupsAtEnd(t, dev.SandboxDir, runID)
		readEvents(t, dev.URL, runID, 5, 20*time.Second)
		old := killShipper(t, dev.SandboxDir, runID)
		openGate(t, gates, 5) // lines 6..10 reach the journal with no shipper alive

		at := skStart(t, dev, "attach", runID)
		at.WaitLines(t, 10)
		if now := pidIn(t, dev.SandboxDir, runID, journal.ExtShipPID); now == old || groupGone(now) {
			t.Fatalf("shipper after attach: pid %d (killed %d), gone %v", now, old, groupGone(now))
		}
		openGate(t, gates, 10)
		if code := at.Wait(t); code != 0 {
			t.Fatalf("attach: exit %d\nstdout:\n%s\nstderr:\n%s", code, at.Stdout, at.Stderr)
		}
		if !strings.Contains(at.Stderr.String(), "is shipped from its sandbox") {
			t.Fatalf("attach drove the run itself instead of starting a new shipper:\n%s", at.Stderr)
		}
		var printed []string
		for _, e := range parseEvents(t, at.Stdout.String()) {
			printed = append(printed, string(e.Data))
		}
		if err := onceInOrderErr(printed, n); err != nil {
			t.Fatalf("attach printed: %v", err)
		}
		got, closed := readEvents(t, dev.URL, runID, 0, 20*time.Second)
		if !closed {
			t.Fatal("the log is not closed")
		}
		wantNumbers(t, got, n)
		if s := runStatus(t, dev.URL, runID); s != "completed" {
			t.Fatalf("run %s", s)
		}
	}, "--reap-every", "1h")
}

// TestShipperReplacedByTheReaper: a shipper killed while its agent runs (silent, waiting);
// the driver lease (3 s) lapses and a reaper sweep (every 250 ms) starts a new shipper
// (outcome reshipped); the agent writes on and exits, and with no host at all the run ends
// completed with 1..N exactly once in order.
func TestShipperReplacedByTheReaper(t *testing.T) {
	t.Parallel()
	eachShipBackend(t, func(t *testing.T, dev *clitest.Dev) {
		const runID, n = "run-reap", 10
		gates := t.TempDir()
		if got := startShipped(t, dev.URL, runID, gatedAgent(gates, n, 5)); got != "sandbox" {
			t.Fatalf("shipping %q, want sandbox", got)
		}
		killGroupsAtEnd(t, dev.SandboxDir, runID)
		readEvents(t, dev.URL, runID, 5, 20*time.Second)
		old := killShipper(t, dev.SandboxDir, runID)

		deadline := time.Now().Add(30 * time.Second)
		for !reshipped(t, dev, runID) {
			if time.Now().After(deadline) {
				raw, _ := sweepsAs(t, dev, "local")
				t.Fatalf("no sweep reshipped %s:\n%s", runID, raw)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if now := pidIn(t, dev.SandboxDir, runID, journal.ExtShipPID); now == old || groupGone(now) {
			t.Fatalf("shipper after the sweep: pid %d (killed %d), gone %v", now, old, groupGone(now))
		}
		openGate(t, gates, 5)
		waitPlainStatus(t, dev.URL, runID, "completed", 20*time.Second)
		got, closed := readEvents(t, dev.URL, runID, 0, 20*time.Second)
		if !closed {
			t.Fatal("the log is not closed")
		}
		wantNumbers(t, got, n)
	}, "--reap-every", "250ms", "--driver-lease", "3s")
}

// reshipped reports whether a kept sweep of dev reshipped runID.
func reshipped(t *testing.T, dev *clitest.Dev, runID string) bool {
	t.Helper()
	_, sweeps := sweepsAs(t, dev, "local")
	for _, s := range sweeps {
		for _, r := range s.Report.Runs {
			if r.RunID == runID && r.Outcome == "reshipped" {
				return true
			}
		}
	}
	return false
}
