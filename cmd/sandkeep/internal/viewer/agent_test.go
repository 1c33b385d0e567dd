package viewer_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// agentScript prints {"n":1}, {"n":2}, the hostile payload, {"n":4}, … one line every
// 150 ms, for ever: only a cancel (or the reaper) ends it.
const agentScript = `i=1; while :; do if [ "$i" = 3 ]; then echo '` + xssPayload + `'; else echo "{\"n\":$i}"; fi; i=$((i+1)); sleep 0.15; done`

// startAgent runs the agent through `sandkeep run` against the dev server. On a server the
// sandbox can reach (the default) the sandbox's shipper drives the run and the CLI only
// watches; on hostDev's the CLI is the host (pump, heartbeats, cancel, finish).
func startAgent(t *testing.T, dev *clitest.Dev, runID, thread string) *clitest.Proc {
	t.Helper()
	p := clitest.Start(t, nil, clitest.Binary(t), "run", "--api", dev.URL, "--thread", thread, "--run", runID, "--", agentScript)
	p.WaitLines(t, 1) // the first event reached the log (run prints events as it reads them)
	return p
}

// hostDev starts a dev server whose --public-url no sandbox reaches (a closed port): its
// agent route answers shipping host, so `sandkeep run` drives (docs/design.md §8.2).
func hostDev(t *testing.T, args ...string) *clitest.Dev {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	_ = ln.Close()
	return clitest.StartDev(t, nil, append([]string{"--public-url", closed}, args...)...)
}

// abandonRun runs an agent through `sandkeep run` on a host-driven server (hostDev) and
// interrupts the CLI (Ctrl-C detaches: exit 3): the agent keeps going in its sandbox and
// nobody comes back, so the reaper expires the run once the detached TTL has passed.
func abandonRun(t *testing.T, dev *clitest.Dev, runID, thread string) {
	t.Helper()
	p := startAgent(t, dev, runID, thread)
	if !strings.Contains(p.Stderr.String(), "Ctrl-C detaches") {
		t.Fatalf("the run is not host-driven:\n%s", p.Stderr)
	}
	p.Signal(t, syscall.SIGINT)
	if code := p.Wait(t); code != 3 {
		t.Fatalf("sandkeep run after Ctrl-C: exit %d, want 3 (detached)\nstderr:\n%s", code, p.Stderr)
	}
	res, err := http.Get(dev.URL + "/v1/runs/" + runID)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got struct{ Run struct{ DetachedSince int64 } }
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil || got.Run.DetachedSince == 0 {
		t.Fatalf("the interrupted run is not detached: %+v %v", got, err)
	}
}

// stopWatching runs an agent through `sandkeep run` on a server its sandbox reaches and
// interrupts the CLI: it only watched (exit 3), and the run goes on, driven by its
// sandbox's shipper, not detached.
func stopWatching(t *testing.T, dev *clitest.Dev, runID, thread string) {
	t.Helper()
	p := startAgent(t, dev, runID, thread)
	p.Signal(t, syscall.SIGINT)
	if code := p.Wait(t); code != 3 || !strings.Contains(p.Stderr.String(), "its sandbox ships its output") {
		t.Fatalf("sandkeep run after Ctrl-C: exit %d, want 3 (stopped watching a shipped run)\nstderr:\n%s", code, p.Stderr)
	}
	res, err := http.Get(dev.URL + "/v1/runs/" + runID)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got struct {
		Run struct {
			Status        string
			DetachedSince int64
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil || got.Run.DetachedSince != 0 || got.Run.Status != "running" {
		t.Fatalf("the watched run after Ctrl-C: %+v %v", got, err)
	}
}
