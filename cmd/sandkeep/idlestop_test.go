package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// post sends body as JSON to the dev server and decodes a 200 answer into out.
func post(t *testing.T, dev *clitest.Dev, path string, body, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	res, err := http.Post(dev.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, res.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("POST %s: %v: %s", path, err, raw)
		}
	}
}

// procsIn lists the processes whose working directory is inside dir (from /proc).
func procsIn(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue // a zombie is dead, only not yet reaped
			}
		}
		out = append(out, e.Name())
	}
	return out
}

// TestDevIdleStopEndsProcessesKeepsFiles: the idle stop through a real `sandkeep dev
// --idle-stop 1s` on local-process, on both backends (one dev process each, its two
// scenarios in parallel): a thread's sandbox whose run ended (idleAfterEnd) and one whose
// run was cancelled (idleAfterCancel) are stopped after the grace, their files kept for
// the thread (docs/design.md §5).
func TestDevIdleStopEndsProcessesKeepsFiles(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		t.Run("ended", func(t *testing.T) {
			t.Parallel()
			idleAfterEnd(t, dev)
		})
		t.Run("cancelled", func(t *testing.T) {
			t.Parallel()
			idleAfterCancel(t, dev)
		})
	}, "--idle-stop", "1s", "--reap-every", "200ms")
}

// idleAfterEnd: a thread's sandbox whose run ended is stopped after the idle grace — no
// process of it survives (read from /proc) — and the thread's next run resumes that very
// sandbox and finds its files.
func idleAfterEnd(t *testing.T, dev *clitest.Dev) {
	setup := map[string]any{"id": "default", "provider": "local-process"}
	var first wire.StartResponse
	post(t, dev, "/v1/runs", map[string]any{"runId": "idle-1", "threadId": "thread-idle", "sandbox": setup}, &first)
	psid := first.Sandbox.ProviderSandboxID
	dir := filepath.Join(dev.SandboxDir, psid)
	// The agent leaves a process behind (a background sleep in its group) and a file.
	agent := `echo kept > kept.txt; sleep 300 & echo $! > bg.pid; printf '{"type":"TEXT_MESSAGE_CONTENT","delta":"x"}\n'`
	post(t, dev, "/v1/runs/idle-1/agent", map[string]any{"cursor": first.Cursor, "command": agent}, nil)
	deadline := time.Now().Add(clitest.Deadline)
	var bg []byte
	for bg = nil; len(bytes.TrimSpace(bg)) == 0; bg, _ = os.ReadFile(filepath.Join(dir, "bg.pid")) {
		if time.Now().After(deadline) {
			t.Fatal("the agent never wrote bg.pid")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(procsIn(t, dir)) == 0 {
		t.Fatal("premise: no process of the sandbox is running")
	}
	post(t, dev, "/v1/runs/idle-1/finish", map[string]any{"cursor": first.Cursor, "status": "completed"}, nil)

	var view wire.RunView
	var raw []byte
	for view.Sandbox == nil || view.Sandbox.Lifecycle != "stopped" {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox was not stopped: %s", raw)
		}
		time.Sleep(50 * time.Millisecond)
		res, err := http.Get(dev.URL + "/v1/runs/idle-1/view")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ = io.ReadAll(res.Body)
		res.Body.Close()
		var vr wire.RunViewResponse
		_ = json.Unmarshal(raw, &vr)
		view = vr.Run
	}
	if view.Sandbox.LifecycleSince <= 0 {
		t.Fatalf("view %+v: no since", view.Sandbox)
	}
	// The stop's SIGKILL has been sent when the row says stopped; a killed process still
	// needs the CPU to exit, so its end is polled for (bounded), never assumed.
	for left := procsIn(t, dir); len(left) != 0; left = procsIn(t, dir) {
		if time.Now().After(deadline) {
			t.Fatalf("processes of the stopped sandbox survive: %v (bg pid %s)", left, bytes.TrimSpace(bg))
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, out, stderr := clitest.Run(t, []string{"SANDKEEP_API=" + dev.URL}, clitest.Binary(t), "runs", "get", "idle-1", "--api", dev.URL)
	if code != 0 || !strings.Contains(out, `"lifecycle": "stopped"`) {
		t.Fatalf("runs get exited %d: %s %s", code, out, stderr)
	}

	var second wire.StartResponse
	post(t, dev, "/v1/runs", map[string]any{"runId": "idle-2", "threadId": "thread-idle", "sandbox": setup}, &second)
	if second.Sandbox.ProviderSandboxID != psid || second.Outcome != "resumed" {
		t.Fatalf("the next run got %+v (%s); want %s resumed", second.Sandbox, second.Outcome, psid)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "kept.txt")); err != nil || string(b) != "kept\n" {
		t.Fatalf("kept.txt after the resume: %q, %v", b, err)
	}
	post(t, dev, "/v1/runs/idle-2/finish", map[string]any{"cursor": second.Cursor, "status": "completed"}, nil)
}

// idleAfterCancel is the early cancel as a user meets it: a run started and detached,
// cancelled one second after its start. The run ends aborted and its sandbox is kept for
// the thread: stopped once the idle grace has passed, its directory still there for the
// thread's next run. The figure (seconds from the cancel to stopped) is logged; the
// deadline only bounds the polling.
func idleAfterCancel(t *testing.T, dev *clitest.Dev) {
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
	t.Logf("cancel → sandbox stopped: %.1f s (reaper every 200 ms, idle stop after 1 s)", took.Seconds())
}
