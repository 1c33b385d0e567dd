package main

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// forwarder is one address in front of several dev servers, as a deployment's URL is in
// front of its functions: each TCP connection goes to the first backend that accepts it
// (so once one is killed, its successor takes every new connection).
type forwarder struct {
	ln       net.Listener
	mu       sync.Mutex
	backends []string       // host:port, in order of preference
	conns    map[string]int // backend → connections forwarded to it
}

func newForwarder(t *testing.T) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, conns: map[string]int{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				f.forward(c)
			}()
		}
	}()
	return f
}

func (f *forwarder) URL() string { return "http://" + f.ln.Addr().String() }

func (f *forwarder) set(backends ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.backends = backends
}

func (f *forwarder) count(backend string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns[backend]
}

func (f *forwarder) forward(c net.Conn) {
	defer c.Close()
	f.mu.Lock()
	backends := append([]string(nil), f.backends...)
	f.mu.Unlock()
	for _, b := range backends {
		up, err := net.DialTimeout("tcp", b, 2*time.Second)
		if err != nil {
			continue
		}
		f.mu.Lock()
		f.conns[b]++
		f.mu.Unlock()
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
		<-done
		_ = up.Close()
		_ = c.Close()
		<-done
		return
	}
}

// TestShipServerThatLaunchedItDies: two `sandkeep dev` processes on one dynalite table with
// one cursor key (SANDKEEP_CURSOR_KEY) behind one address (the forwarder, both servers'
// --public-url), the reaper off. The run is started and its agent launched through server
// A, whose shipper reaches A through the forwarder; A is killed (SIGKILL) mid-run; the
// shipper's requests then reach B, and a reader on B sees 1..N exactly once, in order, and
// the run end completed with no host. Dynalite only: the in-memory backend lives in one
// process's memory, so two servers cannot share it.
func TestShipServerThatLaunchedItDies(t *testing.T) {
	t.Parallel()
	const runID, n = "run-2srv", 10
	fwd := newForwarder(t)
	boxes, gates := t.TempDir(), t.TempDir()
	args := append(backends[1].args(t), "--public-url", fwd.URL(), "--reap-every", "1h", "--sandbox-dir", boxes)
	a := clitest.StartDev(t, shipKeyEnv(), args...)
	b := clitest.StartDev(t, shipKeyEnv(), args...)
	hostA, hostB := a.URL[len("http://"):], b.URL[len("http://"):]
	fwd.set(hostA, hostB)

	if got := startShipped(t, a.URL, runID, gatedAgent(gates, n, 5)); got != "sandbox" {
		t.Fatalf("shipping %q, want sandbox", got)
	}
	killGroupsAtEnd(t, boxes, runID)
	readEvents(t, b.URL, runID, 5, 20*time.Second)
	if fwd.count(hostA) == 0 {
		t.Fatal("the shipper never reached server A")
	}

	if err := a.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if code := a.Wait(t); code != -1 {
		t.Fatalf("server A exit %d, want killed", code)
	}
	beforeB := fwd.count(hostB)
	openGate(t, gates, 5)
	got, closed := readEvents(t, b.URL, runID, 0, 30*time.Second)
	if !closed {
		t.Fatal("the log is not closed")
	}
	wantNumbers(t, got, n)
	if s := runStatus(t, b.URL, runID); s != "completed" {
		t.Fatalf("run %s, want completed", s)
	}
	if fwd.count(hostB) == beforeB {
		t.Fatal("the shipper never reached server B after A died")
	}
	st, m := plain(t, b.URL, http.MethodGet, "/v1/runs/"+runID, "")
	t.Logf("run on B: %d %v", st, m["run"])
}
