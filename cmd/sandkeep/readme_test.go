package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/sandkeep/sandkeep/internal/clitest"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// The README's walkthrough (between these markers) shows only commands this test runs.
const (
	walkthroughBegin = "<!-- walkthrough: begin -->"
	walkthroughEnd   = "<!-- walkthrough: end -->"
)

// walkthrough returns the README's walkthrough section.
func walkthrough(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i, j := strings.Index(s, walkthroughBegin), strings.Index(s, walkthroughEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md has no walkthrough between %q and %q", walkthroughBegin, walkthroughEnd)
	}
	return s[i:j]
}

var commandLineRE = regexp.MustCompile(`(?m)^(\./sandkeep .*|go (?:run|build) .*)$`)

// TestReadmeWalkthrough runs every command the README's walkthrough shows, in its order,
// against a real `sandkeep dev`, and checks what the README says each one does. A command
// added to the walkthrough without a step here fails the test.
func TestReadmeWalkthrough(t *testing.T) {
	w := walkthrough(t)
	const (
		devCmd    = "go run ./cmd/sandkeep dev"
		buildCmd  = "go build -o sandkeep ./cmd/sandkeep"
		runCmd    = `./sandkeep run --thread demo --run demo-1 -- 'for i in $(seq 1 40); do echo "{\"step\":$i}"; sleep 0.2; done'`
		tailCmd   = "./sandkeep tail demo-1 --follow"
		getCmd    = "./sandkeep runs get demo-1"
		run2Cmd   = `./sandkeep run --thread demo --run demo-2 -- 'while true; do echo "{\"tick\":1}"; sleep 1; done'`
		cancelCmd = "./sandkeep cancel demo-2"
	)
	attachRE := regexp.MustCompile(`^\./sandkeep attach demo-1 --after (\d+)$`)
	shown := commandLineRE.FindAllString(w, -1)
	want := []string{devCmd, buildCmd, runCmd, "attach", tailCmd, getCmd, run2Cmd, cancelCmd}
	if len(shown) != len(want) {
		t.Fatalf("the walkthrough shows %d commands, this test runs %d:\n%s", len(shown), len(want), strings.Join(shown, "\n"))
	}
	for i, c := range shown {
		if want[i] == "attach" {
			if !attachRE.MatchString(c) {
				t.Fatalf("command %d is %q, want ./sandkeep attach demo-1 --after N", i, c)
			}
			continue
		}
		if c != want[i] {
			t.Fatalf("command %d is\n  %s\nwant\n  %s", i, c, want[i])
		}
	}

	// Terminal 1: the dev server (the test runs the binary clitest built — the README's
	// `go build` — on a free port; the CLI finds it through $SANDKEEP_API instead of the
	// default 127.0.0.1:8080).
	dev := clitest.StartDev(t, nil)
	dir := t.TempDir()
	if err := os.Symlink(clitest.Binary(t), filepath.Join(dir, "sandkeep")); err != nil {
		t.Fatal(err)
	}
	shell := func(cmd string) *clitest.Proc {
		p := clitest.Start(t, []string{envAPI + "=" + dev.URL}, "/bin/sh", "-c", "cd "+dir+" && exec "+cmd)
		return p
	}

	// Terminal 2: run, Ctrl-C after a few lines: detached, with the attach command.
	host := shell(runCmd)
	host.WaitLines(t, 5)
	host.Signal(t, syscall.SIGINT)
	if code := host.Wait(t); code != exitDetached {
		t.Fatalf("run after Ctrl-C: exit %d\n%s", code, host.Stderr)
	}
	m := attachHintRE.FindStringSubmatch(host.Stderr.String())
	if m == nil {
		t.Fatalf("no attach hint:\n%s", host.Stderr)
	}
	first := numbered(t, parseEvents(t, host.Stdout.String()), "step")

	// Terminal 3: attach where terminal 2 stopped; the rest, exactly once; exit 0.
	at := shell("./sandkeep attach demo-1 --after " + m[2])
	if code := at.Wait(t); code != 0 || !strings.Contains(at.Stderr.String(), "run demo-1 completed") {
		t.Fatalf("attach: exit %d\n%s", code, at.Stderr)
	}
	checkOneToN(t, "run + attach", append(first, numbered(t, parseEvents(t, at.Stdout.String()), "step")...), 40)

	// tail --follow of the finished run prints all 40 and exits 0.
	tl := shell(tailCmd)
	if code := tl.Wait(t); code != 0 {
		t.Fatalf("tail: exit %d\n%s", code, tl.Stderr)
	}
	checkOneToN(t, "tail", numbered(t, parseEvents(t, tl.Stdout.String()), "step"), 40)

	g := shell(getCmd)
	if code := g.Wait(t); code != 0 || !strings.Contains(g.Stdout.String(), `"status": "completed"`) {
		t.Fatalf("runs get: exit %d\n%s%s", code, g.Stdout, g.Stderr)
	}

	// A second run on the same thread, cancelled from terminal 3: terminal 2 exits 130.
	host2 := shell(run2Cmd)
	host2.WaitLines(t, 1)
	c := shell(cancelCmd)
	if code := c.Wait(t); code != 0 {
		t.Fatalf("cancel: exit %d\n%s", code, c.Stderr)
	}
	if code := host2.Wait(t); code != exitAborted || !strings.Contains(host2.Stderr.String(), "run demo-2 aborted") {
		t.Fatalf("run demo-2 after cancel: exit %d\n%s", code, host2.Stderr)
	}
	waitStatus(t, devClient(t, dev), "demo-2", sandbox.StatusAborted)

	// What the README prints for each step is what the commands print.
	for _, s := range []string{"the agent keeps running", "sandkeep attach demo-1 --after", `{"offset":1,"data":{"step":1}}`, "run demo-1 completed", "run demo-2 aborted"} {
		if !strings.Contains(w, s) {
			t.Errorf("the walkthrough does not show %q", s)
		}
	}
}
