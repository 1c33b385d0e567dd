package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/clitest"
	"github.com/sandkeep/sandkeep/shared/apiclient"
	"github.com/sandkeep/sandkeep/shared/wire"
)

// TestCancelledRunSandboxDestroyed is the early cancel as a user meets it: a real `sandkeep
// dev --reap-every 1s`, a run started and detached, cancelled one second after its start.
// Its sandbox must be destroyed within a few sweeps (its own start's touch of the instance
// row used to keep it until the idle sweep, a day later). The figure (seconds from the
// cancel to the sandbox directory gone) is logged; the deadline only bounds the polling.
func TestCancelledRunSandboxDestroyed(t *testing.T) {
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
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
		deadline := cancelled.Add(60 * time.Second) // before the fix: kept for the 24 h idle sweep
		for {
			_, err := os.Stat(dir)
			if errors.Is(err, fs.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cancelled run's sandbox still exists 60 s after the cancel (stat: %v)\ndev stderr:\n%s", err, dev.Stderr)
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(cancelled)
		run, err := c.GetRun(ctx, "run-early")
		if err != nil || run.Status != "aborted" {
			t.Fatalf("run after the reaper: %+v %v", run, err)
		}
		t.Logf("cancel → sandbox destroyed: %.1f s (reaper every 1 s)", took.Seconds())
	}, "--reap-every", "1s")
}
