package viewer_test

import (
	"encoding/json"
	"net/http"
	"syscall"
	"testing"

	"github.com/sandkeep/sandkeep/internal/clitest"
)

// agentScript prints {"n":1}, {"n":2}, the hostile payload, {"n":4}, … one line every
// 150 ms, for ever: only a cancel (or the reaper) ends it.
const agentScript = `i=1; while :; do if [ "$i" = 3 ]; then echo '` + xssPayload + `'; else echo "{\"n\":$i}"; fi; i=$((i+1)); sleep 0.15; done`

// startAgent runs the agent through `sandkeep run` against the dev server: the CLI is the
// host (start, /agent, /pump, heartbeats, honours cancel, finishes).
func startAgent(t *testing.T, dev *clitest.Dev, runID, thread string) *clitest.Proc {
	t.Helper()
	p := clitest.Start(t, nil, clitest.Binary(t), "run", "--api", dev.URL, "--thread", thread, "--run", runID, "--", agentScript)
	p.WaitLines(t, 1) // the first event reached the log (run prints events as it reads them)
	return p
}

// abandonRun runs an agent through `sandkeep run` and interrupts the CLI (Ctrl-C
// detaches: exit 3): the agent keeps going in its sandbox and nobody comes back, so the
// reaper expires the run once the detached TTL has passed.
func abandonRun(t *testing.T, dev *clitest.Dev, runID, thread string) {
	t.Helper()
	p := startAgent(t, dev, runID, thread)
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
