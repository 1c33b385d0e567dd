package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// TestCancelledRunSandboxStopped is the early cancel as a user meets it: a real `sandkeep
// dev --reap-every 1s --idle-stop 1s`, a run started and detached, cancelled one second
// after its start. The run ends aborted and its sandbox is kept for the thread (docs/design.md §5):
// stopped once the idle grace has passed, its directory still there for the thread's
// next run. The figure (seconds from the cancel to stopped) is logged; the deadline only
// bounds the polling. Memory only: the cancelled run's sandbox kept on both backends is
// TestDevRunEndSettlesSandbox's, the stop after the grace TestDevIdleStopEndsProcessesKeepsFiles'.
func TestCancelledRunSandboxStopped(t *testing.T) {
	t.Parallel()
	func(t *testing.T, dev *clitest.Dev) {
		ctx := clitest.Context(t)
		c, err := apiclient.New(apiclient.Config{BaseURL: dev.URL})
		if err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		st, err := c.Start(ctx, wire.StartRequest{RunID: "run-early", ThreadID: "thread-early",
			Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(dev.SandboxDir, st.Sandbox.ProviderSandboxID)
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("premise: the sandbox directory %s: %v", dir, err)
		}
		if _, err := c.Detach(ctx, "run-early", st.Cursor); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(started.Add(time.Second))) // the scenario: cancel 1 s after the start
		if _, err := c.Cancel(ctx, "run-early"); err != nil {
			t.Fatal(err)
		}
		cancelled := time.Now()
		deadline := cancelled.Add(60 * time.Second)
		for {
			v, err := c.ViewRun(ctx, "run-early")
			if err == nil && v.Status == "aborted" && v.Sandbox != nil && v.Sandbox.Lifecycle == "stopped" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cancelled run's sandbox is not stopped 60 s after the cancel: %+v %v\ndev stderr:\n%s", v, err, dev.Stderr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(cancelled)
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("the stopped sandbox's directory is gone (the thread's files must stay): %v", err)
		}
		t.Logf("cancel → sandbox stopped: %.1f s (reaper every 1 s, idle stop after 1 s)", took.Seconds())
	}(t, clitest.StartDev(t, nil, "--reap-every", "1s", "--idle-stop", "1s"))
}
