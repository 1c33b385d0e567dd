package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
	"github.com/sandkeep/sandkeep/shared/testkit/proctest"
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
	proctest.WaitGroupGone(t, pid, clitest.Deadline, "the killed shipper")
	return pid
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
		if now := pidIn(t, dev.SandboxDir, runID, journal.ExtShipPID); now == old || !proctest.GroupLive(now) {
			t.Fatalf("shipper after attach: pid %d (killed %d), gone %v", now, old, !proctest.GroupLive(now))
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
		if now := pidIn(t, dev.SandboxDir, runID, journal.ExtShipPID); now == old || !proctest.GroupLive(now) {
			t.Fatalf("shipper after the sweep: pid %d (killed %d), gone %v", now, old, !proctest.GroupLive(now))
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

// logUntilClosed reads the run's whole log until it is closed (bounded), without failing:
// a negative control reads a broken variant's log with it.
func logUntilClosed(t *testing.T, base, runID string, within time.Duration) ([]string, bool) {
	t.Helper()
	var got []string
	after := int64(0)
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		evs, next, closed := readPage(t, base, runID, after)
		got, after = append(got, evs...), next
		if closed {
			return got, true
		}
	}
	return got, false
}

// readPage is one long-polled read of the run's log after offset after.
func readPage(t *testing.T, base, runID string, after int64) ([]string, int64, bool) {
	t.Helper()
	st, m := plain(t, base, http.MethodGet, fmt.Sprintf("/v1/runs/%s/events?after=%d&waitMs=1000", runID, after), "")
	if st != http.StatusOK {
		t.Fatalf("read: %d %v", st, m)
	}
	var got []string
	for _, e := range m["events"].([]any) {
		got = append(got, fmt.Sprint(e.(map[string]any)["data"]))
	}
	return got, int64(m["next"].(float64)), m["closed"] == true
}

// shipFront stands between shippers and a dev server (the server's --public-url): it
// reads each ship request's epoch from its token, can hold one epoch's requests (that
// shipper is cut off, its batch in flight) and lose the answer of another epoch's first
// batch (the batch landed, the shipper never learns it), and records every answer. With
// ignoreSrc it is the negative control, the ship route of TestShipNegativeControl
// (shared/httpapi) built in front of the server: a batch sent from before the position
// stored is taken as new lines from where its bytes start, appended at the log's end (the
// front sends it with the epoch's latest token, its position set to the bytes' start), so
// a batch sent again after a lost answer stores its lines again.
type shipFront struct {
	t         *testing.T
	srv       *httptest.Server
	ignoreSrc bool

	mu       sync.Mutex
	target   string
	holdUpTo int64         // requests of epochs <= holdUpTo wait for release
	release  chan struct{} // closed: held requests go on
	held     chan int64    // each held request's epoch
	loseOf   int64         // the first batch of this epoch: forwarded, its answer lost
	lost     bool
	next     map[string]int64 // run → the last position answered
	tokens   map[int64]string // epoch → the last token answered
	answers  map[int64][]int  // epoch → statuses answered to its requests
}

func newShipFront(t *testing.T, ignoreSrc bool) *shipFront {
	f := &shipFront{t: t, ignoreSrc: ignoreSrc, release: make(chan struct{}), held: make(chan int64, 64),
		next: map[string]int64{}, tokens: map[int64]string{}, answers: map[int64][]int{}}
	f.srv = httptest.NewServer(f)
	t.Cleanup(func() {
		f.releaseHeld()
		f.srv.Close()
	})
	return f
}

func (f *shipFront) releaseHeld() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.release:
	default:
		close(f.release)
	}
}

func (f *shipFront) statuses(epoch int64) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.answers[epoch]...)
}

func (f *shipFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var epoch int64
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		cl, err := shiptoken.Verify([]byte(shipKey), tok, time.Now())
		if err == nil || errors.Is(err, shiptoken.ErrExpired) {
			epoch = cl.Epoch
		}
	}
	runID, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/runs/"), "/")
	batch := strings.HasSuffix(r.URL.Path, "/ship") && len(body) > 0
	f.mu.Lock()
	hold, target := epoch > 0 && epoch <= f.holdUpTo, f.target
	q := r.URL.Query()
	header := r.Header.Clone()
	if src, err := strconv.ParseInt(q.Get("src"), 10, 64); err == nil && batch && f.ignoreSrc && src < f.next[runID] && f.tokens[epoch] != "" {
		// Broken: the bytes' start taken for the position stored, at the log's end.
		cl, err := shiptoken.Verify([]byte(shipKey), f.tokens[epoch], time.Now())
		if err != nil {
			f.t.Errorf("the front's own token: %v", err)
		}
		cl.Src = src + 1
		header.Set("Authorization", "Bearer "+shiptoken.Mint([]byte(shipKey), cl))
	}
	f.mu.Unlock()
	if hold {
		f.held <- epoch
		select {
		case <-f.release:
		case <-r.Context().Done():
			return
		}
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.Path+"?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = header
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	f.mu.Lock()
	f.answers[epoch] = append(f.answers[epoch], res.StatusCode)
	if v, err := strconv.ParseInt(res.Header.Get(journal.HeaderShipNext), 10, 64); err == nil && res.StatusCode == http.StatusOK {
		f.next[runID], f.tokens[epoch] = v, res.Header.Get(journal.HeaderShipToken)
	}
	lose := batch && epoch == f.loseOf && !f.lost && res.StatusCode == http.StatusOK
	f.lost = f.lost || lose
	f.mu.Unlock()
	if lose {
		http.Error(w, "the answer was lost", http.StatusBadGateway)
		return
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(out)
}

// racingShippers plays two shippers racing after a takeover on dev (its --public-url the
// front f): lines 1..5 shipped; the shipper is cut off with its next batch (6..10) in
// flight and the driver lease (6 s: its ship token lives three, ample for a quiet
// shipper's beat under load) lapses; an attach takes the run over (epoch 2) and
// starts a new shipper beside the old one, still running; the new shipper's first batch
// lands but its answer is lost, so it sends it again; then the old shipper's held batch
// reaches the server; the agent writes 11..15 and exits. It answers the log read to its
// close, the run's status and the old shipper's pid; it asserts nothing of the log, so
// the negative control can run it.
func racingShippers(t *testing.T, dev *clitest.Dev, f *shipFront) ([]string, string, int) {
	t.Helper()
	const runID, n = "run-race", 15
	t0 := time.Now()
	mark := func(what string) { t.Logf("%6.2fs %s", time.Since(t0).Seconds(), what) }
	f.mu.Lock()
	f.target, f.loseOf = dev.URL, 2
	f.mu.Unlock()
	gates := t.TempDir()
	if got := startShipped(t, dev.URL, runID, gatedAgent(gates, n, 5, 10)); got != "sandbox" {
		t.Fatalf("shipping %q, want sandbox", got)
	}
	killGroupsAtEnd(t, dev.SandboxDir, runID)
	readEvents(t, dev.URL, runID, 5, 20*time.Second)
	old := pidIn(t, dev.SandboxDir, runID, journal.ExtShipPID)
	f.mu.Lock()
	f.holdUpTo = 1
	f.mu.Unlock()
	openGate(t, gates, 5)
	select {
	case <-f.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the old shipper sent nothing to hold")
	}
	mark("lines 1..5 stored; the old shipper's next batch held")

	// Attach until the lease lapsed: before, the live shipper is followed (epoch 1).
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, m := plain(t, dev.URL, http.MethodPost, "/v1/runs/"+runID+"/attach", "")
		if st != http.StatusOK || m["shipping"] != "sandbox" {
			t.Fatalf("attach: %d %v", st, m)
		}
		if m["driverEpoch"].(float64) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease never lapsed: %v", m)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mark("taken over at epoch 2")
	if !proctest.GroupLive(old) {
		t.Fatal("the old shipper is gone before the race")
	}
	if now := pidIn(t, dev.SandboxDir, runID, journal.ExtShipPID); now == old || !proctest.GroupLive(now) {
		t.Fatalf("no new shipper: pid %d (old %d)", now, old)
	}
	deadline = time.Now().Add(20 * time.Second)
	for after := int64(0); after < 10; {
		evs, next, _ := readPage(t, dev.URL, runID, after)
		if len(evs) > 0 {
			after = next
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new shipper stored up to offset %d, want 10", after)
		}
	}
	mark("lines 6..10 stored by the new shipper")
	f.releaseHeld() // the old shipper's batch reaches the server now
	proctest.WaitGroupGone(t, old, clitest.Deadline, "the superseded shipper")
	mark("the old shipper exited")
	openGate(t, gates, 10)
	got, closed := logUntilClosed(t, dev.URL, runID, 40*time.Second)
	mark("the log closed")
	if !closed {
		t.Logf("the log did not close: %q", got)
	}
	f.mu.Lock()
	lost := f.lost
	f.mu.Unlock()
	if !lost {
		t.Fatal("no answer of the new shipper was lost: the scenario sent nothing again")
	}
	return got, runStatus(t, dev.URL, runID), old
}

// TestShippersRacingAfterATakeover: the old shipper keeps running, cut off with a batch in
// flight, while a takeover starts a new one at a new epoch; the old one's batch is refused
// by the fence (403) and it exits; the log is 1..N exactly once and the run completed.
// The negative control (a ship route that ignores src, built in front of the server) stores
// the re-sent batch twice, and the same proof catches it.
func TestShippersRacingAfterATakeover(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f := newShipFront(t, false)
			dev := clitest.StartDev(t, shipKeyEnv(), append(b.args(t), "--public-url", f.srv.URL, "--driver-lease", "6s", "--reap-every", "1h")...)
			got, status, _ := racingShippers(t, dev, f)
			if err := onceInOrderErr(got, 15); err != nil {
				t.Fatal(err)
			}
			if status != "completed" {
				t.Fatalf("run %s", status)
			}
			old := f.statuses(1)
			if len(old) == 0 || old[len(old)-1] != http.StatusForbidden {
				t.Fatalf("the old epoch's answers %v: want its held batch refused 403 by the fence", old)
			}
		})
	}
	t.Run("negative-control", func(t *testing.T) {
		t.Parallel()
		f := newShipFront(t, true)
		dev := clitest.StartDev(t, shipKeyEnv(), "--public-url", f.srv.URL, "--driver-lease", "6s", "--reap-every", "1h")
		got, _, _ := racingShippers(t, dev, f)
		if err := onceInOrderErr(got, 15); err == nil {
			t.Fatalf("a ship route ignoring src stored %q exactly once: the proof proves nothing", got)
		} else {
			t.Logf("the src-ignoring route is caught: %v", err)
		}
	})
}
