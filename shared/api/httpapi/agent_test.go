package httpapi

// The agent and pump routes over real shells (the local-process provider), on both
// backends: launch idempotency, the fences (409/410/501), exactly-once pumping across a
// lost answer, a successor and the exit sentinel, and the kill of an aborted run's agent.
// Waits are bounded polls with deadlines; timing never decides a result.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// agentEnv is an API over a local-process provider the test can reach into.
type agentEnv struct {
	*env
	prov *localprocess.Provider
}

func newAgentEnv(t *testing.T, b contract.Backend, hostProviders ...string) *agentEnv {
	t.Helper()
	prov := localprocess.New(t.TempDir())
	e := newEnvWith(t, DevAuth{}, b, prov)
	k, err := keeper.New(keeper.Config{Backend: e.backend, Providers: []contract.Provider{prov}})
	if err != nil {
		t.Fatal(err)
	}
	e.h = New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: []byte("test cursor key, 32 bytes long!!"),
		Logger: slog.New(slog.NewJSONHandler(e.logs, nil)), HostProviders: hostProviders})
	return &agentEnv{env: e, prov: prov}
}

func (e *agentEnv) agent(runID, cursor, command string, env map[string]string) resp {
	e.t.Helper()
	body := map[string]any{"cursor": cursor, "command": command}
	if env != nil {
		body["env"] = env
	}
	return e.do(req{method: post, path: "/v1/runs/" + runID + "/agent", body: body})
}

func (e *agentEnv) pump(runID, cursor string, waitMs int64) resp {
	e.t.Helper()
	return e.do(req{method: post, path: "/v1/runs/" + runID + "/pump", body: map[string]any{"cursor": cursor, "waitMs": waitMs}})
}

// pumpUntilExited pumps from cursor until the answer says exited; it returns the last answer.
func (e *agentEnv) pumpUntilExited(runID, cursor string) wire.PumpResponse {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		p := decode[wire.PumpResponse](e.t, e.pump(runID, cursor, 2000).wantStatusRaw(e.t, 200))
		if p.Exited {
			return p
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the agent of %s never exited: %+v", runID, p)
		}
		cursor = p.Cursor
	}
}

// lines returns the "n" members of the run's events, in log order.
func (e *agentEnv) lines(runID string) []int {
	e.t.Helper()
	rd := decode[wire.ReadResponse](e.t, e.do(req{method: get, path: "/v1/runs/" + runID + "/events?limit=1000"}).wantStatusRaw(e.t, 200))
	var out []int
	var lastSrc int64
	for _, ev := range rd.Events {
		var m struct{ N int }
		if err := json.Unmarshal(ev.Data, &m); err != nil || m.N == 0 {
			e.t.Fatalf("event %s is no numbered line", ev.Data)
		}
		if ev.Src <= lastSrc {
			e.t.Fatalf("src %d after %d", ev.Src, lastSrc)
		}
		lastSrc = ev.Src
		out = append(out, m.N)
	}
	return out
}

// wantOnce asserts the run's log holds lines 1..n exactly once, in order.
func (e *agentEnv) wantOnce(runID string, n int) {
	e.t.Helper()
	got := e.lines(runID)
	if len(got) != n {
		e.t.Fatalf("log holds %d lines, want %d: %v", len(got), n, got)
	}
	for i, v := range got {
		if v != i+1 {
			e.t.Fatalf("log line %d is %d: %v", i, v, got)
		}
	}
}

// exec runs cmd in the run's sandbox.
func (e *agentEnv) exec(psid, cmd string) string {
	e.t.Helper()
	r, err := e.prov.Exec(e.t.Context(), psid, cmd)
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(string(r.Stdout))
}

// numbered prints lines {"n":from}..{"n":to}.
func numbered(from, to int) string {
	return fmt.Sprintf(`i=%d; while [ $i -le %d ]; do printf '{"n":%%d}\n' $i; i=$((i+1)); done; `, from, to)
}

// gate blocks an agent until the file name exists, or until its sandbox's directory is
// deleted, so an agent whose test ended without opening it never outlives the test.
func gate(name string) string {
	return fmt.Sprintf(`while [ ! -e %s ] && [ -e "$PWD" ]; do sleep 0.01; done; `, name)
}

func TestAgentLaunchesOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-a", "thread-a")
		psid := s.Sandbox.ProviderSandboxID
		agent := `echo launched >> launches; ` + numbered(1, 3)
		first := decode[wire.AgentResponse](t, e.agent("run-a", s.Cursor, agent, nil).wantStatusRaw(t, 200))
		// The retry of the same request and a second call: nothing more runs.
		retry := decode[wire.AgentResponse](t, e.agent("run-a", s.Cursor, agent, nil).wantStatusRaw(t, 200))
		other := decode[wire.AgentResponse](t, e.agent("run-a", s.Cursor, `echo other >> launches`, nil).wantStatusRaw(t, 200))
		if !first.Launched || retry.Launched || other.Launched {
			t.Fatalf("launched: first %v, retry %v, second %v; want true, false, false", first.Launched, retry.Launched, other.Launched)
		}
		p := e.pumpUntilExited("run-a", s.Cursor)
		if p.ExitCode == nil || *p.ExitCode != 0 {
			t.Fatalf("pump = %+v", p)
		}
		e.wantOnce("run-a", 3)
		if got := e.exec(psid, "cat launches"); got != "launched" {
			t.Fatalf("the sandbox ran %q; want exactly one launch", got)
		}
		e.do(req{method: post, path: "/v1/runs/run-a/finish", body: map[string]any{"cursor": p.Cursor, "status": "completed"}}).wantStatus(t, 200)
	})
}

// TestAgentRacingLaunches: concurrent launches of one run start exactly one agent, and
// exactly one answer says so.
func TestAgentRacingLaunches(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-r", "thread-r")
		const n = 4
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			launched int
		)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := decode[wire.AgentResponse](t, e.agent("run-r", s.Cursor, `echo launched >> launches; sleep 0.2`, nil).wantStatusRaw(t, 200))
				mu.Lock()
				if a.Launched {
					launched++
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		e.pumpUntilExited("run-r", s.Cursor)
		if got := e.exec(s.Sandbox.ProviderSandboxID, "cat launches"); got != "launched" || launched != 1 {
			t.Fatalf("%d answers said launched; the sandbox ran %q; want exactly one", launched, got)
		}
	})
}

func TestAgentAndPumpRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-f", "thread-f")
		// A successor supersedes the first driver: its agent and pump are 409.
		at := decode[wire.AttachResponse](t, e.do(req{method: post, path: "/v1/runs/run-f/attach"}).wantStatusRaw(t, 200))
		e.agent("run-f", s.Cursor, "true", nil).wantProblem(t, http.StatusConflict, CodeSuperseded)
		e.pump("run-f", s.Cursor, 0).wantProblem(t, http.StatusConflict, CodeSuperseded)
		decode[wire.PumpResponse](t, e.pump("run-f", at.Cursor, 0).wantStatusRaw(t, 200))
		// Terminal: 410.
		e.finish("", "run-f", at.Cursor, "completed").wantStatus(t, 200)
		e.agent("run-f", at.Cursor, "true", nil).wantProblem(t, http.StatusGone, CodeTerminalRun)
		e.pump("run-f", at.Cursor, 0).wantProblem(t, http.StatusGone, CodeTerminalRun)
		// Bad input: 400, naming the field, never echoing an env value.
		s2 := e.start("", "run-g", "thread-g")
		e.do(req{method: post, path: "/v1/runs/run-g/agent", specSays: "invalid",
			body: map[string]any{"cursor": s2.Cursor, "command": ""}}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
		p := e.do(req{method: post, path: "/v1/runs/run-g/agent", specSays: "invalid",
			body: map[string]any{"cursor": s2.Cursor, "command": "true", "env": map[string]any{"1BAD": "s3cret-value"}}}).
			wantProblem(t, http.StatusBadRequest, CodeInvalid)
		if strings.Contains(p.Detail, "s3cret-value") {
			t.Fatalf("the problem echoes an env value: %q", p.Detail)
		}
		e.do(req{method: post, path: "/v1/runs/run-g/pump", specSays: "invalid",
			body: map[string]any{"cursor": s2.Cursor, "waitMs": 10001}}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
		e.agent("nope", s2.Cursor, "true", nil).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
	})
}

// TestAgentUnsupported: 501 from a provider that cannot exec, and from the local-process
// provider where it is a host provider (the Lambdas' configuration).
func TestAgentUnsupported(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnvWith(t, DevAuth{}, nb(t), counting.New("noexec"))
		r := e.do(req{method: post, path: "/v1/runs", body: map[string]any{"runId": "run-n", "threadId": "th",
			"sandbox": map[string]any{"id": "s", "provider": "noexec"}}})
		s := decode[wire.StartResponse](t, r.wantStatusRaw(t, 200))
		e.do(req{method: post, path: "/v1/runs/run-n/agent", body: map[string]any{"cursor": s.Cursor, "command": "true"}}).
			wantProblem(t, http.StatusNotImplemented, CodeUnsupported)
		e.do(req{method: post, path: "/v1/runs/run-n/pump", body: map[string]any{"cursor": s.Cursor}}).
			wantProblem(t, http.StatusNotImplemented, CodeUnsupported)

		h := newAgentEnv(t, nb(t), "local-process")
		s2 := h.start("", "run-h", "thread-h")
		h.agent("run-h", s2.Cursor, "echo ran >> ran", nil).wantProblem(t, http.StatusNotImplemented, CodeUnsupported)
		if got := h.exec(s2.Sandbox.ProviderSandboxID, "cat ran 2>/dev/null; true"); got != "" {
			t.Fatalf("a refused launch ran the command: %q", got)
		}
	})
}

// TestAgentEnvNeverStoredOrLogged: env reaches the agent; its value appears in no log
// line and in no stored record, and not in the agent's command line.
func TestAgentEnvNeverStoredOrLogged(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-e", "thread-e")
		const secret = "v4lue-0f-the-secret"
		e.agent("run-e", s.Cursor, `ps -o args= -p $$ > args; printf '%s' "$TOKEN" > seen; printf '{"n":1}\n'`,
			map[string]string{"TOKEN": secret}).wantStatus(t, 200)
		p := e.pumpUntilExited("run-e", s.Cursor)
		if got := e.exec(s.Sandbox.ProviderSandboxID, "cat seen"); got != secret {
			t.Fatalf("the agent saw TOKEN=%q", got)
		}
		fin := e.do(req{method: post, path: "/v1/runs/run-e/finish", body: map[string]any{"cursor": p.Cursor, "status": "completed"}})
		fin.wantStatus(t, 200)
		run := e.do(req{method: get, path: "/v1/runs/run-e"})
		if strings.Contains(e.logs.String(), secret) || strings.Contains(string(run.Body), secret) || strings.Contains(string(fin.Body), secret) {
			t.Fatal("the env value was logged or stored")
		}
		if args := e.exec(s.Sandbox.ProviderSandboxID, "cat args"); strings.Contains(args, secret) || args == "" {
			t.Fatalf("the agent's command line %q shows the value (or was not read)", args)
		}
	})
}

// TestPumpExactlyOnceAcrossALostAnswer: a pump whose answer never arrived is retried with
// the same cursor after the journal grew: the lines it stored are not stored again, and
// the new ones are; a successor's pump after takeover resumes with no line twice or lost.
func TestPumpExactlyOnceAcrossALostAnswer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-l", "thread-l")
		psid := s.Sandbox.ProviderSandboxID
		e.agent("run-l", s.Cursor, numbered(1, 3)+gate("g1")+numbered(4, 6)+gate("g2")+numbered(7, 9), nil).wantStatus(t, 200)
		deadline := time.Now().Add(30 * time.Second)
		var lost wire.PumpResponse
		for lost.Appended < 3 {
			lost = decode[wire.PumpResponse](t, e.pump("run-l", s.Cursor, 1000).wantStatusRaw(t, 200))
			if time.Now().After(deadline) {
				t.Fatalf("lines 1..3 never pumped: %+v", lost)
			}
		}
		// That answer is lost: the host retries with the cursor it had, after more output.
		e.exec(psid, ": > g1")
		retried := s.Cursor
		for {
			p := decode[wire.PumpResponse](t, e.pump("run-l", retried, 1000).wantStatusRaw(t, 200))
			if p.Src > lost.Src {
				retried = p.Cursor
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("lines 4..6 never pumped: %+v", p)
			}
		}
		e.wantOnce("run-l", len(e.lines("run-l")))
		if got := e.lines("run-l"); len(got) < 4 {
			t.Fatalf("after the retry the log holds %v", got)
		}
		// The host dies; a successor takes over and pumps the rest.
		at := decode[wire.AttachResponse](t, e.do(req{method: post, path: "/v1/runs/run-l/attach"}).wantStatusRaw(t, 200))
		e.exec(psid, ": > g2")
		e.pump("run-l", retried, 0).wantProblem(t, http.StatusConflict, CodeSuperseded)
		p := e.pumpUntilExited("run-l", at.Cursor)
		e.wantOnce("run-l", 9)
		if p.Src != at.Src && p.Appended == 0 && len(e.lines("run-l")) != 9 {
			t.Fatalf("pump = %+v", p)
		}
	})
}

// TestPumpExitedOnlyAfterEveryLine: exited comes only in an answer after which every line
// before the sentinel is stored, also when the journal ends in a burst.
func TestPumpExitedOnlyAfterEveryLine(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-x", "thread-x")
		e.agent("run-x", s.Cursor, numbered(1, 600)+"exit 7", nil).wantStatus(t, 200)
		cur := s.Cursor
		deadline := time.Now().Add(60 * time.Second)
		for {
			p := decode[wire.PumpResponse](t, e.pump("run-x", cur, 500).wantStatusRaw(t, 200))
			if p.Exited {
				if p.ExitCode == nil || *p.ExitCode != 7 {
					t.Fatalf("exit code %v", p.ExitCode)
				}
				e.wantOnce("run-x", 600)
				cur = p.Cursor
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("never exited")
			}
			cur = p.Cursor
		}
		fin := decode[wire.RunResponse](t, e.do(req{method: post, path: "/v1/runs/run-x/finish", body: map[string]any{
			"cursor": cur, "status": "failed", "error": map[string]any{"code": "exit-7", "message": "agent exited with code 7"}}}).wantStatusRaw(t, 200))
		if fin.Run.Error == nil || fin.Run.Error.Code != "exit-7" {
			t.Fatalf("finish = %+v", fin.Run)
		}
	})
}

// TestFinishAbortedKillsTheAgent: an aborted finish kills the agent's whole process group
// (the agent and a child it left in the background); no process of it is left.
func TestFinishAbortedKillsTheAgent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-k", "thread-k")
		psid := s.Sandbox.ProviderSandboxID
		e.agent("run-k", s.Cursor, `sleep 300 & echo $! > child; printf '{"n":1}\n'; while :; do sleep 0.05; done`, nil).wantStatus(t, 200)
		p := decode[wire.PumpResponse](t, e.pump("run-k", s.Cursor, 5000).wantStatusRaw(t, 200))
		if p.Appended != 1 {
			t.Fatalf("pump = %+v", p)
		}
		tctx := contract.WithTenant(t.Context(), "local")
		pgid, found, err := journal.PID(tctx, e.prov, psid, "", "run-k")
		child, cerr := strconv.Atoi(e.exec(psid, "cat child"))
		if err != nil || !found || cerr != nil {
			t.Fatalf("pid file: %d %v %v; child %v", pgid, found, err, cerr)
		}
		if !alive(-pgid) || !alive(child) {
			t.Fatal("the agent is not running before the finish")
		}
		fin := decode[wire.RunResponse](t, e.do(req{method: post, path: "/v1/runs/run-k/finish", body: map[string]any{
			"cursor": p.Cursor, "status": "aborted", "error": map[string]any{"message": "stopped", "code": "cancelled"}}}).wantStatusRaw(t, 200))
		if fin.Run.Status != contract.StatusAborted {
			t.Fatalf("run = %+v", fin.Run)
		}
		deadline := time.Now().Add(10 * time.Second)
		for alive(-pgid) || alive(child) {
			if time.Now().After(deadline) {
				t.Fatalf("the agent's process group %d (child %d) survived the aborted finish", pgid, child)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if e.exec(psid, "ls '"+e.prov.JournalDir()+"' 2>/dev/null | wc -l") != "0" {
			t.Fatal("the aborted run's journal was kept")
		}
	})
}

// alive reports whether a live (non-zombie) process is pid (pid > 0) or belongs to process
// group -pid (pid < 0), from /proc: a zombie still answers kill(2) but runs nothing.
func alive(pid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 3 || fields[0] == "Z" || fields[0] == "X" {
			continue
		}
		own, _ := strconv.Atoi(strings.Fields(s)[0])
		pgrp, _ := strconv.Atoi(fields[2])
		if pid > 0 && own == pid || pid < 0 && pgrp == -pid {
			return true
		}
	}
	return false
}

// TestAgentEnvOverTheExecLimit: one env value past the exec limit on a single variable
// (130 KiB, well under the 256 KiB body bound) is 400 invalid naming the limit, never a
// retryable 503: nothing was launched and the run is as it was, so a corrected call
// launches the agent.
func TestAgentEnvOverTheExecLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newAgentEnv(t, nb(t))
		s := e.start("", "run-big", "thread-big")
		before := e.do(req{method: get, path: "/v1/runs/run-big"}).wantStatus(t, 200)
		big := strings.Repeat("x", 130<<10)
		r := e.do(req{method: post, path: "/v1/runs/run-big/agent", specSays: "invalid",
			body: map[string]any{"cursor": s.Cursor, "command": `echo ran >> ran; printf '{"n":1}\n'`, "env": map[string]any{"BIG": big}}})
		p := r.wantProblem(t, http.StatusBadRequest, CodeInvalid)
		if !strings.Contains(p.Detail, strconv.Itoa(contract.MaxEnvEntryBytes)) || !strings.Contains(p.Detail, "BIG") || strings.Contains(p.Detail, "xxxx") {
			t.Fatalf("detail %q: want the variable and the limit named, never the value", p.Detail)
		}
		if got := r.Header.Get("Retry-After"); got != "" {
			t.Fatalf("Retry-After %q on a request no retry can fix", got)
		}
		after := e.do(req{method: get, path: "/v1/runs/run-big"}).wantStatus(t, 200)
		if fmt.Sprint(before) != fmt.Sprint(after) {
			t.Fatalf("the run changed: %v -> %v", before, after)
		}
		if got := e.exec(s.Sandbox.ProviderSandboxID, "cat ran 2>/dev/null; ls .sandkeep/journal 2>/dev/null; true"); got != "" {
			t.Fatalf("the refused launch left %q in the sandbox", got)
		}
		// The same call within the limit launches (the first launch of the run).
		a := decode[wire.AgentResponse](t, e.agent("run-big", s.Cursor, `printf '{"n":1}\n'`,
			map[string]string{"BIG": big[:contract.MaxEnvEntryBytes-len("BIG=")]}).wantStatusRaw(t, 200))
		if !a.Launched {
			t.Fatal("a launch within the limit did not launch")
		}
		e.pumpUntilExited("run-big", s.Cursor)
		e.wantOnce("run-big", 1)
	})
}
