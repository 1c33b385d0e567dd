package journal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// standIn is a small ship route (docs/design.md §6) the shipper is tested against: it
// stores complete lines from the bytes at or past its stored position, answers ship-gap
// for a src past it, reports exited once the sentinel is stored, and ends the run once.
// The hooks let a test lose answers, cancel, supersede.
type standIn struct {
	t      *testing.T
	runID  string
	token  string
	mu     sync.Mutex
	pos    int64    // stored position: past the last stored line
	lines  []string // stored lines, in order
	exited bool
	code   int // the sentinel's
	ended  bool
	endQ   string // the end's code parameter
	endErr string // the end's body (stderr tail)
	cancel bool
	reqs   int // ship requests (not the probe)
	data   int // of them, with bytes
	// before runs first under the lock; a non-zero status answers the request as is.
	before func(r *http.Request, body []byte) int
	// lose stores the request and then answers 503 (a lost answer), when it returns true.
	lose     func(src int64) bool
	endSeen  chan struct{}
	endClose sync.Once
}

func newStandIn(t *testing.T, runID string) *standIn {
	return &standIn{t: t, runID: runID, token: "tok-" + strconv.FormatInt(time.Now().UnixNano(), 36), endSeen: make(chan struct{})}
}

func (s *standIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/ship" && r.Method == http.MethodGet {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); !ok || !strings.HasPrefix(s.token, tok) || len(tok) < len(s.token)-8 {
		problem(w, 401, "invalid-token") // a token older than 8 renewals has expired
		return
	}
	s.token += "x" // renewed by every answer: the shipper must keep the newest
	if s.before != nil {
		if st := s.before(r, body); st != 0 {
			problem(w, st, "refused")
			return
		}
	}
	route := "/v1/runs/" + url.PathEscape(s.runID) + "/ship"
	switch r.URL.EscapedPath() {
	case route + "/end":
		if !s.exited {
			problem(w, 409, "not-exited")
			return
		}
		s.ended, s.endQ, s.endErr = true, r.URL.Query().Get("code"), string(body)
		s.endClose.Do(func() { close(s.endSeen) })
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{"state":"ended"}`))
		return
	case route:
	default:
		problem(w, 404, "not-found")
		return
	}
	s.reqs++
	if len(body) > 0 {
		s.data++
	}
	src, err := strconv.ParseInt(r.URL.Query().Get("src"), 10, 64)
	if err != nil || len(body) > ShipMaxBatch {
		problem(w, 400, "invalid")
		return
	}
	if src > s.from() && len(body) > 0 {
		w.Header().Set(HeaderShipNext, strconv.FormatInt(s.from(), 10))
		problem(w, 409, "ship-gap")
		return
	}
	// Skip what is stored; store whole lines up to the sentinel.
	at := src
	rest := body
	if skip := s.pos - src; skip > 0 {
		if skip > int64(len(rest)) {
			skip = int64(len(rest))
		}
		rest, at = rest[skip:], at+skip
	}
	for !s.exited {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 || at != s.pos {
			break
		}
		line := string(rest[:i])
		if code, ok := parseSentinel([]byte(line), ExitNonce(s.runID)); ok {
			s.exited, s.code = true, code
		} else {
			s.lines = append(s.lines, line)
		}
		rest, at = rest[i+1:], at+int64(i)+1
		s.pos = at
	}
	if s.lose != nil && s.lose(src) {
		problem(w, 503, "unavailable")
		return
	}
	state := "running"
	switch {
	case s.exited:
		state = "exited"
	case s.cancel:
		state = "cancel"
	}
	w.Header().Set(HeaderShipNext, strconv.FormatInt(s.from(), 10))
	w.Header().Set(HeaderShipState, state)
	w.Header().Set(HeaderShipToken, s.token)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"next":%d,"state":%q,"token":%q}`, s.from(), state, s.token)
}

// from is where the shipper sends from: one byte before the stored position, as the ship
// route answers (httpapi.ShipFrom), so the bytes show whether the position starts a line.
func (s *standIn) from() int64 { return max(s.pos-1, 0) }

func problem(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"status":%d,"code":%q}`, status, code)
}

func (s *standIn) tok() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.token
}

func (s *standIn) snapshot() (lines []string, reqs, data int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...), s.reqs, s.data
}

// shipRig runs a launcher and a shipper as real sh processes in a temporary directory.
type shipRig struct {
	t      *testing.T
	dir    string
	tenant string
	runID  string
	p      Paths
	srv    *httptest.Server
	si     *standIn
}

func newShipRig(t *testing.T) *shipRig {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("curl is required")
		}
		t.Skip("no curl")
	}
	r := &shipRig{t: t, dir: t.TempDir(), tenant: "acme", runID: "run/1 'x'"}
	p, err := PathsFor(filepath.Join(r.dir, "j"), r.tenant, r.runID)
	if err != nil {
		t.Fatal(err)
	}
	r.p = p
	r.si = newStandIn(t, r.runID)
	r.srv = httptest.NewServer(r.si)
	t.Cleanup(r.srv.Close)
	return r
}

type proc struct {
	*exec.Cmd
	done chan struct{} // closed once it exited
}

// start runs script with sh as a process group leader; the group is killed at the end.
func (r *shipRig) start(script string, env ...string) proc {
	r.t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-done
	})
	return proc{cmd, done}
}

func (r *shipRig) launch(agent string) int {
	r.t.Helper()
	cmd := r.start(Command(r.p.Dir, r.tenant, r.runID, agent))
	r.waitFile(r.p.PID)
	return cmd.Process.Pid
}

func (r *shipRig) ship(o ShipOptions) proc {
	r.t.Helper()
	return r.start(ShipCommand(r.p.Dir, r.tenant, r.runID, o), EnvShipURL+"="+r.srv.URL+"/", EnvShipToken+"="+r.si.tok())
}

func (r *shipRig) waitFile(path string) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s never appeared", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *shipRig) waitEnd() {
	r.t.Helper()
	select {
	case <-r.si.endSeen:
	case <-time.After(20 * time.Second):
		lines, reqs, _ := r.si.snapshot()
		r.t.Fatalf("the run was never ended (%d lines stored, %d requests)", len(lines), reqs)
	}
}

func (r *shipRig) wantLines(n int) {
	r.t.Helper()
	lines, _, _ := r.si.snapshot()
	if len(lines) != n {
		r.t.Fatalf("stored %d lines, want %d: %q", len(lines), n, lines)
	}
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			r.t.Fatalf("line %d is %q, want %d (every line once, in order)", i, l, i+1)
		}
	}
}

// waitGone waits for the shipper's exit (its files removed after the end).
func (r *shipRig) waitFilesGone() {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left, _ := filepath.Glob(filepath.Join(r.p.Dir, "*"))
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the run's files were not removed after its end: %v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestShipperShipsEveryLineOnce: a chatty agent's lines arrive once each, in order, in
// batches; the run ends with its code and stderr tail; the shipper removes the files. The
// token reaches neither the agent's environment nor any process's command line.
func TestShipperShipsEveryLineOnce(t *testing.T) {
	r := newShipRig(t)
	const n = 300
	r.launch(`env >agent-env; i=1; while [ $i -le 300 ]; do echo $i; i=$((i+1)); [ $((i % 50)) -ne 0 ] || sleep 0.05; done; echo oops >&2; exit 3`)
	r.ship(ShipOptions{})
	r.waitFile(r.p.ShipPID)
	tok := r.si.tok()
	r.waitEnd()
	r.wantLines(n)
	if r.si.endQ != "3" || r.si.endErr != "oops\n" {
		t.Fatalf("end code %q stderr %q, want 3 and the agent's stderr", r.si.endQ, r.si.endErr)
	}
	_, reqs, data := r.si.snapshot()
	if data > 40 {
		t.Fatalf("%d data requests for %d lines: not batched", data, n)
	}
	t.Logf("%d lines in %d requests (%d with data)", n, reqs, data)
	env, err := os.ReadFile(filepath.Join(r.dir, "agent-env"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(env, []byte("SANDKEEP_SHIP")) || bytes.Contains(env, []byte(tok)) {
		t.Fatal("the agent's environment holds the ship token or URL")
	}
	r.waitFilesGone()
}

// TestShipperTokenNotOnCommandLine: while the shipper runs, no process's command line
// holds its token.
func TestShipperTokenNotOnCommandLine(t *testing.T) {
	r := newShipRig(t)
	r.launch(`i=1; while [ $i -le 60 ]; do echo $i; i=$((i+1)); sleep 0.01; done`)
	r.ship(ShipOptions{})
	r.waitFile(r.p.ShipPID)
	prefix := r.si.tok()[:10]
	for !isClosed(r.si.endSeen) {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(prefix)) {
				t.Fatalf("%s holds the token: %q", p, b)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.wantLines(60)
}

// TestShipperScratchIsItsOwn: a shipper's answer, body and batch files carry its pid, so a
// replacement running beside its fenced-out predecessor never reads the other's answer or
// sends the other's batch; they are gone once it exits.
func TestShipperScratchIsItsOwn(t *testing.T) {
	r := newShipRig(t)
	goFile := filepath.Join(r.dir, "go")
	r.launch(`echo 1; while [ ! -e ` + Quote(goFile) + ` ]; do sleep 0.02; done; echo 2`)
	r.ship(ShipOptions{})
	r.waitFile(r.p.ShipPID)
	b, err := os.ReadFile(r.p.ShipPID)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	own := r.p.ShipHeaders + "." + pid
	r.waitFile(own) // the first answer's headers
	if _, err := os.Stat(r.p.ShipHeaders); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the shared name %s exists (%v): scratch files are not per process", r.p.ShipHeaders, err)
	}
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitEnd()
	r.wantLines(2)
	r.waitFilesGone()
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestShipperLostAnswers: answers lost after their bytes were stored are retried from the
// same position and store nothing twice. Its negative control, a server that stores a
// retried batch again, shows the count would catch a resend.
func TestShipperLostAnswers(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignoresSrc=%v", broken), func(t *testing.T) {
			r := newShipRig(t)
			r.si.mu.Lock()
			lost := 0
			r.si.lose = func(src int64) bool {
				if lost < 3 && src > 0 {
					lost++
					if broken {
						r.si.pos = src // stores a retried batch again: a route that ignores src
					}
					return true
				}
				return false
			}
			r.si.mu.Unlock()
			r.launch(`i=1; while [ $i -le 100 ]; do echo $i; i=$((i+1)); sleep 0.005; done`)
			r.ship(ShipOptions{})
			r.waitEnd()
			r.si.mu.Lock()
			lostN := lost
			r.si.mu.Unlock()
			if lostN == 0 {
				t.Fatal("no answer was lost")
			}
			lines, _, _ := r.si.snapshot()
			ok := len(lines) == 100
			for i := 0; ok && i < len(lines); i++ {
				ok = lines[i] == strconv.Itoa(i+1)
			}
			if ok == broken {
				t.Fatalf("broken=%v: exactly once %v over %d lines", broken, ok, len(lines))
			}
			t.Logf("broken=%v: %d answers lost, %d lines stored, exactly once %v", broken, lostN, len(lines), ok)
		})
	}
}

// TestShipperCancel: a cancel in an answer kills the agent's group; the shipper seals the
// journal (the launcher died with the group) and ends the run.
func TestShipperCancel(t *testing.T) {
	r := newShipRig(t)
	pg := r.launch(`echo 1; sleep 30 & wait; echo never`)
	r.ship(ShipOptions{Beat: time.Second})
	r.waitFile(r.p.ShipPID)
	deadline := time.Now().Add(10 * time.Second)
	for lines, _, _ := r.si.snapshot(); len(lines) < 1; lines, _, _ = r.si.snapshot() {
		if time.Now().After(deadline) {
			t.Fatal("the first line never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.si.mu.Lock()
	r.si.cancel = true
	r.si.mu.Unlock()
	r.waitEnd()
	r.wantLines(1)
	if r.si.endQ != strconv.Itoa(ShipSealCode) {
		t.Fatalf("end code %q, want %d", r.si.endQ, ShipSealCode)
	}
	waitGroupGone(t, pg)
}

// TestShipperSealsKilledAgent: an agent group killed from outside (KillShipped's shell)
// gets a sentinel from the shipper, and its run ends.
func TestShipperSealsKilledAgent(t *testing.T) {
	r := newShipRig(t)
	pg := r.launch(`printf 'partial'; sleep 30`)
	r.ship(ShipOptions{})
	r.waitFile(r.p.ShipPID)
	if err := syscall.Kill(-pg, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r.waitEnd()
	lines, _, _ := r.si.snapshot()
	if len(lines) != 1 || lines[0] != "partial" || r.si.endQ != "137" {
		t.Fatalf("lines %q end %q: want the partial line and code 137", lines, r.si.endQ)
	}
	waitGroupGone(t, pg)
}

// TestShipperSealsKilledAgentAfterLines: the cancel route's kill (KillShipped) of an agent
// whose journal ends with a whole stored line: the shipper must see the journal fully
// stored (the answer's next is one byte before the stored position), seal it and end the
// run. It used to resend that last newline forever and never seal (a cancelled run stayed
// running).
func TestShipperSealsKilledAgentAfterLines(t *testing.T) {
	r := newShipRig(t)
	pg := r.launch(`echo 1; echo 2; sleep 30`)
	r.ship(ShipOptions{})
	r.waitFile(r.p.ShipPID)
	deadline := time.Now().Add(10 * time.Second)
	for lines, _, _ := r.si.snapshot(); len(lines) < 2; lines, _, _ = r.si.snapshot() {
		if time.Now().After(deadline) {
			t.Fatal("the lines never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := syscall.Kill(-pg, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r.waitEnd()
	r.wantLines(2)
	if r.si.endQ != strconv.Itoa(ShipSealCode) {
		t.Fatalf("end code %q, want %d", r.si.endQ, ShipSealCode)
	}
	waitGroupGone(t, pg)
}

func waitGroupGone(t *testing.T, pg int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for groupHasLive(pg) {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still has live processes", pg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupHasLive reports whether a process of group pg is alive (zombies are not).
func groupHasLive(pg int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 3 && f[0] != "Z" && f[2] == strconv.Itoa(pg) {
			return true
		}
	}
	return false
}

// TestShipperTruncatedJournal: an agent that truncates and rewrites its journal never
// makes the shipper resend old bytes or spin: it sends from the server's position, and a
// shrunken file waits for growth past it.
func TestShipperTruncatedJournal(t *testing.T) {
	r := newShipRig(t)
	j := Quote(r.p.Journal)
	// The agent truncates only once the test has seen "1","2" stored (the go file), so a
	// loaded machine cannot let the truncation overtake the first batch.
	goFile := filepath.Join(r.dir, "go")
	r.launch(`echo 1; echo 2; while [ ! -e ` + Quote(goFile) + ` ]; do sleep 0.02; done; : >` + j +
		`; sleep 0.5; echo 3; echo 4; echo 5; echo 6`)
	r.ship(ShipOptions{})
	deadline := time.Now().Add(10 * time.Second)
	for lines, _, _ := r.si.snapshot(); len(lines) < 2; lines, _, _ = r.si.snapshot() {
		if time.Now().After(deadline) {
			t.Fatal("lines 1 and 2 never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.waitEnd()
	lines, reqs, _ := r.si.snapshot()
	// "1\n2\n" is 4 bytes: after the truncation, the rewrite's bytes past position 4 are
	// "5\n6\n" (the server's position decides, whatever the agent did).
	if strings.Join(lines, ",") != "1,2,5,6" {
		t.Fatalf("stored %q", lines)
	}
	if reqs > 10 {
		t.Fatalf("%d requests: the shipper spun on a shrunken journal", reqs)
	}
}

// TestShipperGapRewinds: a server whose stored position is behind the shipper's answers
// ship-gap; the shipper rewinds and every line arrives once.
func TestShipperGapRewinds(t *testing.T) {
	r := newShipRig(t)
	r.si.mu.Lock()
	gaps := 0
	r.si.before = func(req *http.Request, body []byte) int {
		// Once, pretend the first batch's lines were lost: rewind the stored position.
		if gaps == 0 && len(r.si.lines) >= 3 {
			gaps++
			r.si.lines, r.si.pos = nil, 0
		}
		return 0
	}
	r.si.mu.Unlock()
	r.launch(`i=1; while [ $i -le 50 ]; do echo $i; i=$((i+1)); sleep 0.01; done`)
	r.ship(ShipOptions{})
	r.waitEnd()
	r.si.mu.Lock()
	g := gaps
	r.si.mu.Unlock()
	if g == 0 {
		t.Fatal("no gap was made")
	}
	r.wantLines(50)
}

// TestShipperExits: superseded, terminal and refused tokens end the shipper, which stores
// nothing more and leaves the journal for whoever continues.
func TestShipperExits(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
	}{{409, "superseded"}, {410, "terminal-run"}, {401, "invalid-token"}, {403, "token-scope"}} {
		t.Run(tc.code, func(t *testing.T) {
			r := newShipRig(t)
			refuse := false
			r.si.mu.Lock()
			defer r.si.mu.Unlock()
			r.si.before = func(req *http.Request, body []byte) int {
				if refuse {
					return tc.status
				}
				refuse = len(r.si.lines) >= 2
				return 0
			}
			r.si.mu.Unlock()
			r.launch(`i=1; while [ $i -le 1000 ]; do echo $i; i=$((i+1)); sleep 0.01; done`)
			sh := r.ship(ShipOptions{})
			select {
			case <-sh.done:
			case <-time.After(15 * time.Second):
				t.Fatal("the shipper did not exit")
			}
			r.si.mu.Lock()
			if _, err := os.Stat(r.p.Journal); err != nil {
				t.Fatalf("the journal was removed by a refused shipper: %v", err)
			}
		})
	}
}

// TestShipperSilentRun: a silent agent costs heartbeats only, at most one per Beat.
func TestShipperSilentRun(t *testing.T) {
	r := newShipRig(t)
	r.launch(`sleep 30`)
	r.ship(ShipOptions{Beat: time.Second})
	r.waitFile(r.p.ShipPID)
	start := time.Now()
	deadline := start.Add(20 * time.Second)
	for _, reqs, _ := r.si.snapshot(); reqs < 4; _, reqs, _ = r.si.snapshot() {
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests in 20 s: no heartbeat", reqs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(start)
	_, reqs, data := r.si.snapshot()
	if data != 0 {
		t.Fatalf("%d data requests from a silent agent", data)
	}
	// The first request, then one per Beat: never more.
	if limit := 1 + int(elapsed/time.Second) + 1; reqs > limit {
		t.Fatalf("%d requests in %s with a 1 s beat (limit %d)", reqs, elapsed, limit)
	}
}

// TestShipperProbe: no reachable API or no curl: the shipper exits before its pid file.
func TestShipperProbe(t *testing.T) {
	r := newShipRig(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	_ = ln.Close()
	for name, env := range map[string][]string{
		"unreachable": {EnvShipURL + "=" + closed, EnvShipToken + "=t"},
		"no curl":     {EnvShipURL + "=" + r.srv.URL, EnvShipToken + "=t", "PATH=" + t.TempDir()},
	} {
		cmd := exec.Command("/bin/sh", "-c", ShipCommand(r.p.Dir, r.tenant, r.runID, ShipOptions{}))
		cmd.Env = env
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || (ee.ExitCode() != 90 && ee.ExitCode() != 91) {
			t.Fatalf("%s: %v, want exit 90 or 91", name, err)
		}
		if _, err := os.Stat(r.p.ShipPID); err == nil {
			t.Fatalf("%s: a pid file was written", name)
		}
	}
}

// TestShipperPauses: the quiet shipper's pause doubles from Tick up to Idle and stays
// there, and every pacing yields a script sh accepts.
func TestShipperPauses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tick, idle time.Duration
		want       string
	}{
		{20 * time.Millisecond, 100 * time.Millisecond, "0.020) nap=0.040 ;; 0.040) nap=0.080 ;; 0.080) nap=0.100 ;; "},
		{50 * time.Millisecond, 50 * time.Millisecond, ""},
		{10 * time.Millisecond, 40 * time.Millisecond, "0.010) nap=0.020 ;; 0.020) nap=0.040 ;; "},
	} {
		if got := slower(tc.tick, tc.idle); got != tc.want {
			t.Errorf("slower(%s, %s) = %q, want %q", tc.tick, tc.idle, got, tc.want)
		}
		script := ShipCommand(t.TempDir(), "acme", "run-1", ShipOptions{Tick: tc.tick, Idle: tc.idle})
		if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("tick %s idle %s: sh -n: %v: %s", tc.tick, tc.idle, err, out)
		}
	}
	if o := (ShipOptions{Tick: time.Second}).withDefaults(); o.Idle != time.Second {
		t.Errorf("an Idle below Tick became %s, want Tick", o.Idle)
	}
}
