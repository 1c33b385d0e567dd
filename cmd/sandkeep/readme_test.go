package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
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
	t.Parallel()
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
	followRE := regexp.MustCompile(`^\./sandkeep tail demo-1 --follow --after (\d+)$`)
	shown := commandLineRE.FindAllString(w, -1)
	want := []string{devCmd, buildCmd, runCmd, "follow", tailCmd, getCmd, run2Cmd, cancelCmd}
	if len(shown) != len(want) {
		t.Fatalf("the walkthrough shows %d commands, this test runs %d:\n%s", len(shown), len(want), strings.Join(shown, "\n"))
	}
	for i, c := range shown {
		if want[i] == "follow" {
			if !followRE.MatchString(c) {
				t.Fatalf("command %d is %q, want ./sandkeep tail demo-1 --follow --after N", i, c)
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

	// Terminal 2: run, Ctrl-C after a few lines: it stops watching, with the tail command;
	// the run goes on in its sandbox.
	host := shell(runCmd)
	host.WaitLines(t, 5)
	host.Signal(t, syscall.SIGINT)
	if code := host.Wait(t); code != exitDetached {
		t.Fatalf("run after Ctrl-C: exit %d\n%s", code, host.Stderr)
	}
	m := followHintRE.FindStringSubmatch(host.Stderr.String())
	if m == nil || m[1] != "demo-1" {
		t.Fatalf("no tail --follow hint:\n%s", host.Stderr)
	}
	first := numbered(t, parseEvents(t, host.Stdout.String()), "step")

	// Terminal 3: tail --follow where terminal 2 stopped; the rest, exactly once; the run
	// completes with no host; exit 0.
	at := shell("./sandkeep tail demo-1 --follow --after " + m[2])
	if code := at.Wait(t); code != 0 || !strings.Contains(at.Stderr.String(), "run demo-1 completed") {
		t.Fatalf("tail --follow --after: exit %d\n%s", code, at.Stderr)
	}
	checkOneToN(t, "run + tail --follow", append(first, numbered(t, parseEvents(t, at.Stdout.String()), "step")...), 40)

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
	waitStatus(t, devClient(t, dev), "demo-2", contract.StatusAborted)

	// What the README prints for each step is what the commands print.
	for _, s := range []string{"its sandbox ships its output. Ctrl-C stops watching (the run goes on).", "it goes on in its sandbox.",
		"sandkeep tail demo-1 --follow --after", `{"offset":1,"data":{"step":1}}`, "run demo-1 completed", "run demo-2 aborted"} {
		if !strings.Contains(w, s) {
			t.Errorf("the walkthrough does not show %q", s)
		}
	}
}

// curlSection is the heading of the README's curl session.
const curlSection = "### A session with curl"

// TestReadmeCurlSession runs the README's curl session — every ```sh block of it, in order,
// as one bash script — against a real `sandkeep dev` on each backend, and checks every
// output line the document shows (its "# " lines; "…" stands for any text and a 13-digit
// number for any timestamp). It covers a run with no host (start, agent, read: the sandbox
// ships and ends it) and, against a second server started with --no-ship, the whole host
// loop over HTTP: start, agent, the pump loop to the agent's exit, the heartbeat, cancel,
// finish, and the refusals a driver stops on. Without sh, curl or jq it skips, except under CI=true.
func TestReadmeCurlSession(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not on PATH: CI must have it", tool)
			}
			t.Skipf("%s not on PATH", tool)
		}
	}
	doc, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), curlSection)
	if i < 0 {
		t.Fatalf("README.md has no %q section", curlSection)
	}
	session := string(doc)[i:]
	if end := strings.Index(session, "\n## "); end >= 0 {
		session = session[:end]
	}
	var script strings.Builder
	var want []*regexp.Regexp
	blockRE := regexp.MustCompile("(?s)```sh\n(.*?)```")
	stamp := regexp.MustCompile(`\d{13}`)
	for _, m := range blockRE.FindAllStringSubmatch(session, -1) {
		for _, line := range strings.Split(m[1], "\n") {
			if exp, ok := strings.CutPrefix(line, "# "); ok {
				pat := regexp.QuoteMeta(exp)
				pat = strings.ReplaceAll(pat, "…", ".*")
				pat = stamp.ReplaceAllString(pat, `\d{13}`)
				want = append(want, regexp.MustCompile("^"+pat+"$"))
				continue
			}
			script.WriteString(line + "\n")
		}
	}
	// The host loop is part of what is run: a session without it fails here, not silently.
	for _, call := range []string{"/agent", "/pump", "/heartbeat", "/cancel", "/finish", `"code":"terminal-run"`, `"code":"superseded"`} {
		if !strings.Contains(session, call) {
			t.Errorf("the curl session does not show %s", call)
		}
	}
	if len(want) < 20 {
		t.Fatalf("found only %d expected outputs in the curl session", len(want))
	}
	// The session talks to a server that ships (the no-host run), then to one started with
	// --no-ship (the host loop), on the same backend.
	const base, hostBase = "B=http://127.0.0.1:8080", "B=http://127.0.0.1:8081"
	if !strings.Contains(script.String(), base) || !strings.Contains(script.String(), hostBase) {
		t.Fatalf("the session does not set %s and then %s", base, hostBase)
	}
	if !strings.Contains(session, `"shipping":"sandbox"`) || !strings.Contains(session, "dev --no-ship --addr 127.0.0.1:8081") {
		t.Errorf("the curl session does not show a shipped run and the --no-ship server")
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			args := b.args(t)
			dev := clitest.StartDev(t, nil, args...)
			hostDev := clitest.StartDev(t, nil, append(args, "--no-ship")...)
			text := strings.Replace(script.String(), base, "B="+dev.URL, 1)
			text = strings.Replace(text, hostBase, "B="+hostDev.URL, 1)
			// The whole session is bounded, not each step: at a load of 20 it took over 90 s.
			ctx, cancel := context.WithTimeout(t.Context(), 4*clitest.Deadline)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-c", "set -eu\n"+text)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the curl session failed: %v\n%s", err, out)
			}
			got := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(got) != len(want) {
				t.Fatalf("the session printed %d lines, the document shows %d:\n%s", len(got), len(want), out)
			}
			for i := range want {
				if !want[i].MatchString(got[i]) {
					t.Errorf("session line %d = %q, the document shows %s", i+1, got[i], want[i])
				}
			}
		})
	}
}
