package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// agentTicks reports its process group (the agent's shell) in its first line, then ticks
// for ever: the test kills the group itself when a server it was left behind by is gone.
const agentTicks = `echo "{\"pid\":$$}"; while true; do echo '{"tick":1}'; sleep 0.1; done`

// killAgentAtEnd kills the process group the first event line of p names when the test
// ends (a killed dev server cannot stop the agents it launched).
func killAgentAtEnd(t *testing.T, p *clitest.Proc) {
	t.Helper()
	first := completeLines(t, p.WaitLines(t, 1)[0]+"\n")
	pid := numbered(t, first[:1], "pid")[0]
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// requestRE is how an error line names its problem: the code, the status, the request id.
func problemRE(code string, status int) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(code) + ` \(` + strconv.Itoa(status) + `\): .*\[request [^\]\s]+\]`)
}

// TestVanishedRunEndsCommands: `sandkeep dev` (memory) is killed under a `run`, an
// `attach` and a `tail --follow`, and a new one starts on the same address knowing none
// of their runs. Each command meets unknown-run (a refusal no retry heals) and exits 1
// naming the code and the request id, instead of retrying for ever.
func TestVanishedRunEndsCommands(t *testing.T) {
	t.Parallel()
	dev := clitest.StartDev(t, nil)
	c := devClient(t, dev)
	ctx := clitest.Context(t)

	host := skStart(t, dev, "run", "--thread", "th-v", "--run", "run-v", "--", agentTicks)
	killAgentAtEnd(t, host)
	st, err := c.Start(ctx, wire.StartRequest{RunID: "run-w", ThreadID: "th-w", Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Agent(ctx, "run-w", wire.AgentRequest{Cursor: st.Cursor, Command: agentTicks}); err != nil {
		t.Fatal(err)
	}
	att := skStart(t, dev, "attach", "run-w")
	killAgentAtEnd(t, att)
	tail := skStart(t, dev, "tail", "run-v", "--follow")
	tail.WaitLines(t, 1)

	dev.Signal(t, syscall.SIGKILL)
	dev.Wait(t)
	dev2 := clitest.StartDev(t, nil, "--addr", strings.TrimPrefix(dev.URL, "http://"))
	if dev2.URL != dev.URL {
		t.Fatalf("the new server listens on %s, want %s", dev2.URL, dev.URL)
	}
	back := time.Now()
	for name, p := range map[string]*clitest.Proc{"run": host, "attach": att, "tail --follow": tail} {
		code := p.Wait(t)
		t.Logf("%s exited %v after the new server listened (load %s)", name, time.Since(back).Round(time.Millisecond), loadavg())
		if code != exitFailure || !problemRE(wire.CodeUnknownRun, 404).MatchString(p.Stderr.String()) {
			t.Errorf("%s after its run vanished: exit %d, want 1 naming unknown-run and the request id\n%s", name, code, p.Stderr)
		}
	}
}

// flakyFront is a proxy in front of a dev server that can answer reads of the event log
// 503 (a transient failure, problem+json with a request id) and hold detaches unanswered.
// It refuses the push upgrade (404), so the commands behind it read by long polls.
type flakyFront struct {
	next         http.Handler
	failReads    atomic.Bool             // 503 unavailable, a transient failure
	readsRefused atomic.Pointer[refusal] // this answer instead, when set
	holdAll      atomic.Bool             // every request waits until its client gives up
	held         chan struct{}
	stop         chan struct{}
	n            atomic.Int64
}

func newFlakyFront(t *testing.T, devURL string) (*flakyFront, string) {
	t.Helper()
	u, err := url.Parse(devURL)
	if err != nil {
		t.Fatal(err)
	}
	f := &flakyFront{next: httputil.NewSingleHostReverseProxy(u), held: make(chan struct{}, 100), stop: make(chan struct{})}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(f.stop) }) // before Close: no held request outlives the test
	return f, srv.URL
}

func (f *flakyFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.holdAll.Load() {
		// Read the body first: only then does the server notice a client that hangs up.
		_, _ = io.Copy(io.Discard, r.Body)
		f.held <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-f.stop:
		}
		return
	}
	if r.URL.Path == wire.SubscribePath {
		// This front serves no push: its clients read through the long polls it breaks.
		http.NotFound(w, r)
		return
	}
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/events") {
		a := f.readsRefused.Load()
		if a == nil && f.failReads.Load() {
			a = &refusal{http.StatusServiceUnavailable, wire.CodeUnavailable}
		}
		if a != nil {
			id := fmt.Sprintf("flaky-%d", f.n.Add(1))
			w.Header().Set("Content-Type", wire.ProblemContentType)
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(a.status)
			fmt.Fprintf(w, `{"type":"urn:sandkeep:problem:%s","title":"t","status":%d,"detail":"d","code":%q,"requestId":%q}`, a.code, a.status, a.code, id)
			return
		}
	}
	r.Host = "" // the dev server answers only its own loopback Host
	f.next.ServeHTTP(w, r)
}

// TestTransientFailuresEnd: reads of the log that keep failing transiently (503) are
// retried, then end run and tail --follow with exit 1 naming the code and request id once
// they have lasted --retry-for.
func TestTransientFailuresEnd(t *testing.T) {
	t.Parallel()
	dev := clitest.StartDev(t, nil)
	f, front := newFlakyFront(t, dev.URL)
	f.failReads.Store(true)
	env := clitest.HostEnv(front)
	bin := clitest.Binary(t)

	host := clitest.Start(t, env, bin, "run", "--thread", "th-f", "--run", "run-f", "--retry-for", "2s", "--", `echo '{"n":1}'`)
	host.WaitFor(t, "stderr", regexp.MustCompile(`run run-f on thread`))
	tail := clitest.Start(t, env, bin, "tail", "run-f", "--follow", "--retry-for", "2s")
	for name, p := range map[string]*clitest.Proc{"run": host, "tail --follow": tail} {
		code := p.Wait(t)
		errOut := p.Stderr.String()
		if code != exitFailure || !problemRE(wire.CodeUnavailable, 503).MatchString(errOut) || !strings.Contains(errOut, "(retrying)") ||
			!strings.Contains(errOut, "--retry-for") {
			t.Errorf("%s with every read failing: exit %d, want 1 after retries naming unavailable and the request id\n%s", name, code, errOut)
		}
	}
	if n := f.n.Load(); n < 4 {
		t.Errorf("%d failed reads in all: the failures were not retried", n)
	}
}

// refusal is an answer the flaky front gives instead of the dev server's.
type refusal struct {
	status int
	code   string
}

// TestRefusalsEndFollowing: a read refused with a code no retry heals ends tail --follow
// at once with exit 1 naming the code and the request id, after a single read.
func TestRefusalsEndFollowing(t *testing.T) {
	t.Parallel()
	dev := clitest.StartDev(t, nil)
	f, front := newFlakyFront(t, dev.URL)
	c := devClient(t, dev)
	if _, err := c.Start(clitest.Context(t), wire.StartRequest{RunID: "run-x", ThreadID: "th-x",
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []refusal{
		{http.StatusNotFound, wire.CodeUnknownRun},
		{http.StatusUnauthorized, wire.CodeUnauthenticated},
		{http.StatusForbidden, wire.CodeForbiddenHost},
		{http.StatusForbidden, wire.CodeUntrustedPrincipal},
		{http.StatusBadRequest, wire.CodeInvalid},
	} {
		f.readsRefused.Store(&a)
		before := f.n.Load()
		code, _, errOut := clitest.Run(t, clitest.HostEnv(front), clitest.Binary(t), "tail", "run-x", "--follow")
		if code != exitFailure || !problemRE(a.code, a.status).MatchString(errOut) || f.n.Load() != before+1 {
			t.Errorf("tail --follow with reads refused %d %s: exit %d after %d reads, want 1 after one read naming the code\n%s",
				a.status, a.code, code, f.n.Load()-before, errOut)
		}
	}
}

// TestSignalEndsPrinting: the drive completed the run but its events cannot be read
// (503 on every read, within the default --retry-for): the first SIGINT ends the command
// (exit 3), saying how to print the rest. The run is driven by its host (--no-ship): what
// is proved is the host's ending.
func TestSignalEndsPrinting(t *testing.T) {
	t.Parallel()
	dev := clitest.StartDev(t, nil, "--no-ship")
	f, front := newFlakyFront(t, dev.URL)
	f.failReads.Store(true)
	host := clitest.Start(t, clitest.HostEnv(front), clitest.Binary(t), "run", "--thread", "th-g", "--run", "run-g", "--", `echo '{"n":1}'`)
	host.WaitFor(t, "stderr", regexp.MustCompile(`\(retrying\)`))
	waitStatus(t, devClient(t, dev), "run-g", "completed")
	host.Signal(t, syscall.SIGINT)
	if code := host.Wait(t); code != exitDetached || !strings.Contains(host.Stderr.String(), "sandkeep tail run-g --after 0 --follow") {
		t.Fatalf("run after SIGINT: exit %d, want %d saying how to go on\n%s", code, exitDetached, host.Stderr)
	}
}

// TestSecondSignalExitsAtOnce: the first SIGINT detaches a run; while the detach waits
// for an API that does not answer, a second SIGINT ends the process at once (a host's
// detach: --no-ship).
func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	dev := clitest.StartDev(t, nil, "--no-ship")
	f, front := newFlakyFront(t, dev.URL)
	host := clitest.Start(t, clitest.HostEnv(front), clitest.Binary(t), "run", "--thread", "th-s", "--run", "run-s", "--", agentTicks)
	killAgentAtEnd(t, host)
	f.holdAll.Store(true)
	host.Signal(t, syscall.SIGINT)
	host.WaitFor(t, "stderr", regexp.MustCompile(`detaching from run run-s \(a second Ctrl-C exits at once\)`))
	<-f.held // the detach (or a read) is waiting for an answer
	host.Signal(t, syscall.SIGINT)
	if code := host.Wait(t); code != -1 {
		t.Fatalf("exit %d after a second SIGINT, want death by the signal\n%s", code, host.Stderr)
	}
}

// TestStaleCursorAfterRestart: `sandkeep dev` on dynalite is restarted (a new random cursor
// key, the same table) under a running `sandkeep run`. The run's cursor is refused as
// stale-cursor, the command exits 1 saying so with the exact attach command, and that
// command continues the output exactly: lines 1..20 once each across the two outputs. The
// run is driven by its host (--no-ship): a shipped run's watcher holds no cursor.
func TestStaleCursorAfterRestart(t *testing.T) {
	t.Parallel()
	dbArgs := append(backends[1].args(t), "--no-ship")
	dev := clitest.StartDev(t, nil, dbArgs...)
	gate := filepath.Join(t.TempDir(), "gate")
	agent := fmt.Sprintf(`i=1; while [ $i -le 20 ]; do echo "{\"n\":$i}"; if [ $i -eq 10 ]; then while [ ! -e %s ]; do sleep 0.05; done; fi; i=$((i+1)); done`, gate)
	host := skStart(t, dev, "run", "--thread", "th-r", "--run", "run-r", "--", agent)
	host.WaitLines(t, 10)
	dev.Stop(t)
	dev2 := clitest.StartDev(t, nil, append(dbArgs, "--addr", strings.TrimPrefix(dev.URL, "http://"), "--sandbox-dir", dev.SandboxDir)...)
	if dev2.URL != dev.URL {
		t.Fatalf("the new server listens on %s, want %s", dev2.URL, dev.URL)
	}
	code := host.Wait(t)
	errOut := host.Stderr.String()
	m := attachHintRE.FindStringSubmatch(errOut)
	if code != exitFailure || !problemRE(wire.CodeStaleCursor, 409).MatchString(errOut) || m == nil || m[1] != "run-r" {
		t.Fatalf("run after the restart: exit %d, want 1 naming stale-cursor with the attach command\n%s", code, errOut)
	}
	first := parseEvents(t, host.Stdout.String())
	if m[2] != strconv.FormatInt(first[len(first)-1].Offset, 10) {
		t.Fatalf("the hint says --after %s, the last offset printed is %d", m[2], first[len(first)-1].Offset)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := sk(t, dev2, "attach", "run-r", "--after", m[2])
	if code != 0 {
		t.Fatalf("%s: exit %d\n%s", m[0], code, errOut)
	}
	checkOneToN(t, "run + attach output", append(numbers(t, first), numbers(t, parseEvents(t, out))...), 20)
}

// TestHelp: help, -h and --help print the usage on stdout and exit 0.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"help", "-h", "--help"} {
		var out, errOut strings.Builder
		if code := run(context.Background(), []string{arg}, streams{out: &out, err: &errOut}); code != 0 || !strings.HasPrefix(out.String(), "usage:") {
			t.Errorf("sandkeep %s: exit %d, stdout %q, stderr %q", arg, code, out.String(), errOut.String())
		}
	}
	code, out, errOut := clitest.Run(t, nil, clitest.Binary(t), "--help")
	if code != 0 || !strings.Contains(out, "sandkeep attach RUN") || errOut != "" {
		t.Fatalf("sandkeep --help: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
