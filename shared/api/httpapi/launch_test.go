package httpapi

// A run's life around its driver's lease, over real shells on both backends, with the
// keeper's clock in the test's hands (so no wait decides a result): a host that only
// pumps keeps its lease; a run the reaper ended tells its driver why.

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// testClock is the keeper's (and so the reaper's) clock, moved by the test.
type testClock struct{ ms atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ms.Store(time.Now().UnixMilli())
	return c
}

func (c *testClock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// clockEnv is an API over a local-process provider whose keeper runs on clock, and a
// reaper over that keeper.
type clockEnv struct {
	*agentEnv
	k     *keeper.Keeper
	clock *testClock
	r     *reaper.Reaper
}

func newClockEnv(t *testing.T, b contract.Backend, cfg keeper.Config, ttl time.Duration) *clockEnv {
	t.Helper()
	prov := localprocess.New(t.TempDir())
	e := newEnvWith(t, DevAuth{}, b, prov)
	clock := newTestClock()
	cfg.Backend, cfg.Providers, cfg.Now = e.backend, []contract.Provider{prov}, clock.Now
	k, err := keeper.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.h = New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: []byte("test cursor key, 32 bytes long!!"),
		Logger: slog.New(slog.NewJSONHandler(e.logs, nil))})
	r, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: ttl, QuietReport: true})
	if err != nil {
		t.Fatal(err)
	}
	return &clockEnv{agentEnv: &agentEnv{env: e, prov: prov}, k: k, clock: clock, r: r}
}

// sweep runs one reaper sweep and returns what it did with runID ("" when nothing).
func (e *clockEnv) sweep(runID string) reaper.Outcome {
	e.t.Helper()
	rep, err := e.r.Sweep(e.t.Context())
	if err != nil {
		e.t.Fatalf("sweep: %v", err)
	}
	for _, r := range rep.Runs {
		if r.RunID == runID {
			return r.Outcome
		}
	}
	return ""
}

func (e *clockEnv) state(runID string) contract.RunState {
	e.t.Helper()
	st, err := e.backend.Runs().State(tctx(e.t, "local"), runID)
	if err != nil || st == nil {
		e.t.Fatalf("state of %s: %v, %v", runID, st, err)
	}
	return *st
}

// TestPumpingHostKeepsItsLease: a host that pumps and never heartbeats streams an agent's
// output for far longer than the driver lease plus the detached TTL (on the keeper's
// clock); its pumps count as its heartbeats, so the reaper never lapses, detaches or
// expires the run, and every line arrives.
func TestPumpingHostKeepsItsLease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newClockEnv(t, nb(t), keeper.Config{DriverLease: 60 * time.Second}, time.Minute)
		s := e.start("", "run-p", "thread-p")
		const rounds = 12 // 12 × 25 s: five leases, past lease + TTL
		agent := ""
		for i := 1; i <= rounds; i++ {
			agent += gate("g"+strconv.Itoa(i)) + numbered(i, i)
		}
		e.agent("run-p", s.Cursor, agent, nil).wantStatus(t, 200)
		cursor := s.Cursor
		for i := 1; i <= rounds; i++ {
			e.clock.Advance(25 * time.Second)
			e.exec(s.Sandbox.ProviderSandboxID, ": > g"+strconv.Itoa(i))
			p := decode[wire.PumpResponse](t, e.pump("run-p", cursor, 2000).wantStatusRaw(t, 200))
			if p.Appended != 1 {
				t.Fatalf("round %d: pump stored %d lines, want 1", i, p.Appended)
			}
			cursor = p.Cursor
			if o := e.sweep("run-p"); o != "" {
				t.Fatalf("round %d (%s of streaming): the reaper acted on the pumping run: %s", i, time.Duration(i)*25*time.Second, o)
			}
			if st := e.state("run-p"); st.Lapsed || st.DetachedSince != nil || st.Status != contract.StatusRunning {
				t.Fatalf("round %d: the pumping run is %s, lapsed %v, detachedSince %v", i, st.Status, st.Lapsed, st.DetachedSince)
			}
		}
		p := e.pumpUntilExited("run-p", cursor)
		e.finish("", "run-p", p.Cursor, "completed").wantStatus(t, 200)
		e.wantOnce("run-p", rounds)
	})
}

// TestReaperEndedRunAnswersItsDriver: a run the reaper expired answers its driver's pump
// and heartbeat 410 terminal-run naming how it ended (aborted, expired), never
// sandbox-gone, even though its sandbox was reclaimed.
func TestReaperEndedRunAnswersItsDriver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newClockEnv(t, nb(t), keeper.Config{}, time.Minute)
		s := e.start("", "run-x", "thread-x")
		e.agent("run-x", s.Cursor, `while true; do printf '{"n":1}\n'; sleep 0.05; done`, nil).wantStatus(t, 200)
		p := decode[wire.PumpResponse](t, e.pump("run-x", s.Cursor, 2000).wantStatusRaw(t, 200))
		e.do(req{method: post, path: "/v1/runs/run-x/detach", body: map[string]any{"cursor": p.Cursor}}).wantStatus(t, 200)
		e.clock.Advance(10 * time.Minute)
		if o := e.sweep("run-x"); o != reaper.Expired {
			t.Fatalf("sweep outcome %q, want expired", o)
		}
		for _, r := range []req{
			{method: post, path: "/v1/runs/run-x/pump", body: map[string]any{"cursor": p.Cursor, "waitMs": 0}},
			{method: post, path: "/v1/runs/run-x/heartbeat", body: map[string]any{"cursor": p.Cursor}},
		} {
			pr := e.do(r).wantProblem(t, http.StatusGone, CodeTerminalRun)
			if !strings.Contains(pr.Detail, "aborted (expired)") {
				t.Fatalf("%s: detail %q does not say the run was expired", r.path, pr.Detail)
			}
		}
	})
}

// runError reads the run and returns its status and error code.
func (e *clockEnv) ended(runID string) (contract.RunStatus, string) {
	e.t.Helper()
	st := e.state(runID)
	if st.Error == nil {
		return st.Status, ""
	}
	return st.Status, st.Error.Code
}

// wantNotLaunched checks a 410 naming agent-not-launched and the run failed so.
func (e *clockEnv) wantNotLaunched(r resp, runID string) {
	e.t.Helper()
	p := r.wantProblem(e.t, http.StatusGone, CodeTerminalRun)
	if !strings.Contains(p.Detail, keeper.CodeAgentNotLaunched) {
		e.t.Fatalf("detail %q does not name %s", p.Detail, keeper.CodeAgentNotLaunched)
	}
	if st, code := e.ended(runID); st != contract.StatusFailed || code != keeper.CodeAgentNotLaunched {
		e.t.Fatalf("run %s is %s (%s), want failed (%s)", runID, st, code, keeper.CodeAgentNotLaunched)
	}
}

// TestLaunchDeadline: a run whose agent never launched is ended failed
// (agent-not-launched) once its launch deadline passed, by whichever of pump, attach, the
// agent route or the reaper meets it first; pumps and heartbeats before never extend it.
// Runs with an agent (launched, or a host appending its own events) are left alone.
func TestLaunchDeadline(t *testing.T) {
	const deadline = 2 * time.Minute
	cfg := keeper.Config{LaunchDeadline: deadline}
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		t.Run("pump", func(t *testing.T) {
			e := newClockEnv(t, nb(t), cfg, time.Hour)
			s := e.start("", "run-1", "thread-1")
			cursor := s.Cursor
			for range 3 { // pumping and heartbeating before the deadline: the run lives on
				e.clock.Advance(deadline / 4)
				cursor = decode[wire.PumpResponse](t, e.pump("run-1", cursor, 0).wantStatusRaw(t, 200)).Cursor
				e.do(req{method: post, path: "/v1/runs/run-1/heartbeat", body: map[string]any{"cursor": cursor}}).wantStatus(t, 200)
			}
			e.clock.Advance(deadline / 4)
			e.wantNotLaunched(e.pump("run-1", cursor, 0), "run-1")
		})
		t.Run("attach", func(t *testing.T) {
			e := newClockEnv(t, nb(t), cfg, time.Hour)
			e.start("", "run-2", "thread-2")
			e.clock.Advance(deadline)
			e.wantNotLaunched(e.do(req{method: post, path: "/v1/runs/run-2/attach"}), "run-2")
		})
		t.Run("agent route too late", func(t *testing.T) {
			e := newClockEnv(t, nb(t), cfg, time.Hour)
			s := e.start("", "run-3", "thread-3")
			e.clock.Advance(deadline + time.Second)
			e.wantNotLaunched(e.agent("run-3", s.Cursor, "echo ran > ran", nil), "run-3")
			if got := e.exec(s.Sandbox.ProviderSandboxID, "cat ran 2>/dev/null; true"); got != "" {
				t.Fatalf("a launch past the deadline ran: %q", got)
			}
		})
		t.Run("reaper, heartbeating host", func(t *testing.T) {
			e := newClockEnv(t, nb(t), cfg, time.Hour)
			s := e.start("", "run-4", "thread-4")
			hb := func() resp {
				return e.do(req{method: post, path: "/v1/runs/run-4/heartbeat", body: map[string]any{"cursor": s.Cursor}})
			}
			for range 3 {
				e.clock.Advance(deadline / 2)
				hb().wantStatus(t, 200) // a live lease, but no agent
			}
			if o := e.sweep("run-4"); o != reaper.Expired {
				t.Fatalf("sweep outcome %q, want expired", o)
			}
			if st, code := e.ended("run-4"); st != contract.StatusFailed || code != keeper.CodeAgentNotLaunched {
				t.Fatalf("run is %s (%s)", st, code)
			}
			hb().wantProblem(t, http.StatusGone, CodeTerminalRun)
		})
		t.Run("agents are left alone", func(t *testing.T) {
			e := newClockEnv(t, nb(t), cfg, time.Hour)
			a := e.start("", "run-a", "thread-a")
			e.agent("run-a", a.Cursor, gate("go")+`printf '{"n":1}\n'`, nil).wantStatus(t, 200)
			// Open the gate when the test ends, or the agent outlives its deleted sandbox; then
			// wait (bounded, 10 s) for its process group to end, so it is not still writing its
			// journal while the sandbox's directory is removed.
			t.Cleanup(func() {
				_, _ = e.prov.Exec(context.Background(), a.Sandbox.ProviderSandboxID, `touch go; for f in .sandkeep/journal/*.pid; do
	p=$(cat "$f" 2>/dev/null) || continue; i=0
	while [ -n "$p" ] && { kill -0 -- "-$p" || kill -0 "$p"; } 2>/dev/null && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
done`)
			})
			ev := e.start("", "run-e", "thread-e")
			c := decode[wire.AppendResponse](t, e.appendEvents("", "run-e", ev.Cursor, "step 1").wantStatusRaw(t, 200)).Cursor
			for range 4 {
				e.clock.Advance(deadline / 2)
				e.do(req{method: post, path: "/v1/runs/run-a/heartbeat", body: map[string]any{"cursor": a.Cursor}}).wantStatus(t, 200)
				c = decode[wire.AppendResponse](t, e.appendEvents("", "run-e", c, "step").wantStatusRaw(t, 200)).Cursor
				e.do(req{method: post, path: "/v1/runs/run-e/heartbeat", body: map[string]any{"cursor": c}}).wantStatus(t, 200)
				for _, id := range []string{"run-a", "run-e"} {
					if o := e.sweep(id); o != "" {
						t.Fatalf("the reaper acted on %s, which has an agent: %s", id, o)
					}
				}
			}
			decode[wire.PumpResponse](t, e.pump("run-a", a.Cursor, 0).wantStatusRaw(t, 200))
			e.do(req{method: post, path: "/v1/runs/run-e/attach"}).wantStatus(t, 200)
			for _, id := range []string{"run-a", "run-e"} {
				if st := e.state(id); st.Status != contract.StatusRunning || st.LaunchBy != 0 {
					t.Fatalf("%s: %s, launchBy %d; want running with no launch deadline left", id, st.Status, st.LaunchBy)
				}
			}
		})
	})
}
