package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
	"github.com/sandkeep/sandkeep/shared/testkit/proctest"
)

// serverSecrets are variables of the dev server's own environment that no agent may see:
// cloud credentials, sandkeep's settings and keys, and an unrelated canary.
var serverSecrets = []string{
	"AWS_ACCESS_KEY_ID=AKIAI18CANARYKEY",
	"AWS_SECRET_ACCESS_KEY=i18-canary-secret-access-key",
	"AWS_SESSION_TOKEN=i18-canary-session-token",
	"SANDKEEP_E2B_API_KEY=e2b_i18_canary_key",
	"SANDKEEP_CURSOR_KEY=i18-canary-cursor-key",
	"I18_CANARY=the-server-only",
}

// agentOutput starts run runID on dev with agent command and env, pumps it to its exit and
// returns the agent's output lines (the events' string data).
func agentOutput(t *testing.T, ctx context.Context, dev *clitest.Dev, runID, command string, env map[string]string) []string {
	t.Helper()
	c, err := apiclient.New(apiclient.Config{BaseURL: dev.URL})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
		Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Agent(ctx, runID, wire.AgentRequest{Cursor: st.Cursor, Command: command, Env: env}); err != nil {
		t.Fatal(err)
	}
	// Pumped to its exit; the dev server's shipper may end the run first (its pump then
	// answers terminal-run), and the agent's lines are stored either way.
	cursor, wait := st.Cursor, int64(2000)
	for {
		res, err := c.Pump(ctx, runID, wire.PumpRequest{Cursor: cursor, WaitMs: &wait})
		if errors.Is(err, contract.ErrTerminalRun) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		cursor = res.Cursor
		if res.Exited {
			break
		}
	}
	page, err := c.ReadEvents(ctx, runID, apiclient.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range page.Events {
		var s string
		if json.Unmarshal(e.Data, &s) == nil {
			lines = append(lines, s)
		}
	}
	return lines
}

// TestDevAgentEnvironmentIsMinimal (docs/design.md §2.5): a dev server started with cloud
// credentials, sandkeep keys and a canary in its environment launches an agent that runs
// `env`: the agent sees PATH, HOME, LANG and TMPDIR of the server, its run's own env, and
// none of the server's other variables — on both backends.
func TestDevAgentEnvironmentIsMinimal(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			env := append(slices.Clone(serverSecrets), "LANG=C.UTF-8", "TMPDIR="+t.TempDir())
			dev := clitest.StartDev(t, env, b.args(t)...)
			lines := agentOutput(t, clitest.Context(t), dev, "run-env", "env", map[string]string{"RUN_OWN": "from-the-run"})
			got := map[string]string{}
			for _, l := range lines {
				if k, v, ok := strings.Cut(l, "="); ok {
					got[k] = v
				}
			}
			if got["RUN_OWN"] != "from-the-run" || got["PATH"] == "" || got["LANG"] != "C.UTF-8" {
				t.Fatalf("the agent's env lacks its run's variable, PATH or LANG: %q", lines)
			}
			for _, kv := range serverSecrets {
				k, v, _ := strings.Cut(kv, "=")
				if _, seen := got[k]; seen || strings.Contains(strings.Join(lines, "\n"), v) {
					t.Errorf("the agent saw the server's %s", k)
				}
			}
			for k := range got {
				if strings.HasPrefix(k, "AWS_") || strings.HasPrefix(k, "SANDKEEP_") {
					t.Errorf("the agent saw the server's %s", k)
				}
			}
		})
	}
}

var stoppedAgentsRE = regexp.MustCompile(`stopped (\d+) agent\(s\) launched by this server`)

// TestDevMemoryStopsItsAgentsOnExit (docs/design.md §9): a dev server on the in-memory
// backend launches two agents that never end, each writing its process group id to a
// file; on SIGTERM it says it stopped 2 agents and exits, and no process of either group
// survives it. On the DynamoDB backend the runs outlive the server, so their agents are
// left for a successor to take over.
func TestDevMemoryStopsItsAgentsOnExit(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			dev := clitest.StartDev(t, nil, b.args(t)...)
			ctx := clitest.Context(t)
			c, err := apiclient.New(apiclient.Config{BaseURL: dev.URL})
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			var pgids []int
			for i := range 2 {
				runID := fmt.Sprintf("run-forever-%d", i)
				pidFile := filepath.Join(dir, runID+".pid")
				st, err := c.Start(ctx, wire.StartRequest{RunID: runID, ThreadID: "thread-" + runID,
					Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
				if err != nil {
					t.Fatal(err)
				}
				// A background grandchild too: the whole group must go, not only its leader.
				agent := fmt.Sprintf(`(while true; do sleep 0.2; done) & echo $$ > %s.tmp && mv %s.tmp %s; while true; do sleep 0.2; done`,
					pidFile, pidFile, pidFile)
				if _, err := c.Agent(ctx, runID, wire.AgentRequest{Cursor: st.Cursor, Command: agent}); err != nil {
					t.Fatal(err)
				}
				pgids = append(pgids, waitPID(t, pidFile))
			}
			for _, g := range pgids {
				if !proctest.GroupLive(g) {
					t.Fatalf("premise: agent group %d is not running", g)
				}
			}
			t.Cleanup(func() {
				for _, g := range pgids {
					_ = syscall.Kill(-g, syscall.SIGKILL)
				}
			})
			dev.Signal(t, syscall.SIGTERM)
			if code := dev.Wait(t); code != 0 {
				t.Fatalf("exit %d after SIGTERM\nstderr:\n%s", code, dev.Stderr)
			}
			m := stoppedAgentsRE.FindStringSubmatch(dev.Stdout.String())
			if b.name == "dynalite" {
				if m != nil {
					t.Fatalf("the DynamoDB-backed server stopped agents whose runs outlive it: %q", m[0])
				}
				for _, g := range pgids {
					if !proctest.GroupLive(g) {
						t.Errorf("agent group %d of a durable run died with the server", g)
					}
				}
				return
			}
			deadline := time.Now().Add(clitest.Deadline)
			for _, g := range pgids {
				for proctest.GroupLive(g) {
					if time.Now().After(deadline) {
						t.Fatalf("agent group %d survived the server's exit", g)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			if m == nil || m[1] != "2" {
				t.Fatalf("the server did not say it stopped its 2 agents:\n%s", dev.Stdout)
			}
		})
	}
}

// waitPID polls for the pid file an agent writes (atomically, by rename).
func waitPID(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(clitest.Deadline)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			n, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || n <= 1 {
				t.Fatalf("pid file %s: %q", path, b)
			}
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the agent wrote no pid file %s within %v", path, clitest.Deadline)
	return 0
}
