package testkit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// NewProvider returns a fresh sandbox provider for one case of the journal, takeover and
// reaper suites. Its sandboxes must run a real POSIX shell: it must implement
// contract.Executor and contract.StatusReader (the local-process provider does).
type NewProvider func(t *testing.T) contract.Provider

// rigJournalDir is the journal directory of the suites: relative, so it lives inside each
// sandbox and goes with it (never the shared default).
const rigJournalDir = "sandkeep-journal"

// rigTenant is the tenant of every rig's context.
const rigTenant = "acme"

// rigWait bounds every wait of these suites; a wait is never the assertion.
const rigWait = 60 * time.Second

// rig is one case's world: a backend, a provider with a shell, and a keeper over them.
type rig struct {
	t    *testing.T
	ctx  context.Context
	b    contract.Backend
	prov contract.Provider
	ex   contract.Executor
	k    *keeper.Keeper
	seq  atomic.Int64
}

// newRig builds a case's world; b may be nil for suites that need no backend.
func newRig(t *testing.T, b contract.Backend, prov contract.Provider) *rig {
	t.Helper()
	ex, ok := prov.(contract.Executor)
	if !ok {
		t.Fatalf("provider %s does not implement sandbox.Executor (required by this suite)", prov.Name())
	}
	if _, ok := prov.(contract.StatusReader); !ok {
		t.Fatalf("provider %s does not implement sandbox.StatusReader (required by this suite)", prov.Name())
	}
	r := &rig{t: t, ctx: contract.WithTenant(t.Context(), rigTenant), b: b, prov: prov, ex: ex}
	if b != nil {
		k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{prov}})
		if err != nil {
			t.Fatal(err)
		}
		r.k = k
	}
	return r
}

// id returns a unique id with a prefix.
func (r *rig) id(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, r.seq.Add(1))
}

// sandbox creates a bare sandbox and destroys it when the case ends.
func (r *rig) sandbox() string {
	r.t.Helper()
	id, err := r.prov.Create(r.ctx, contract.CreateInput{Name: r.id("sk_bare")})
	if err != nil {
		r.t.Fatalf("create sandbox: %v", err)
	}
	r.t.Cleanup(func() { _ = r.prov.Destroy(context.Background(), id) })
	return id
}

// start starts runID on thread through the keeper (epoch 1) and registers the sandbox for
// destruction when the case ends.
func (r *rig) start(runID, thread string) keeper.StartResult {
	r.t.Helper()
	return r.startReuse(runID, thread, keeper.ReuseThread)
}

// startReuse is start with the setup's reuse mode (keeper.ReuseNone gives the
// run a sandbox of its own, destroyed once it ended).
func (r *rig) startReuse(runID, thread string, reuse keeper.Reuse) keeper.StartResult {
	r.t.Helper()
	res, err := r.k.Start(r.ctx, keeper.StartInput{RunID: runID, ThreadID: thread,
		Sandbox: keeper.Setup{ID: "agent", Provider: r.prov.Name(), Reuse: reuse}})
	if err != nil {
		r.t.Fatalf("start %s: %v", runID, err)
	}
	psid := res.Sandbox.ProviderSandboxID
	r.t.Cleanup(func() { _ = r.prov.Destroy(context.Background(), psid) })
	return res
}

// launch starts agent journaled for runID in psid.
func (r *rig) launch(psid, runID, agent string) {
	r.t.Helper()
	if _, err := journal.Launch(r.ctx, r.ex, psid, rigJournalDir, runID, agent); err != nil {
		r.t.Fatalf("launch %s: %v", runID, err)
	}
}

// exec runs a command in psid and fails the case on a transport error.
func (r *rig) exec(psid, cmd string) contract.ExecResult {
	r.t.Helper()
	res, err := r.ex.Exec(r.ctx, psid, cmd)
	if err != nil {
		r.t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

// exists reports whether path exists in psid (test -f through the shell).
func (r *rig) exists(psid, path string) bool {
	return r.exec(psid, "test -f "+journal.Quote(path)).ExitCode == 0
}

// paths returns runID's journal paths.
func (r *rig) paths(runID string) journal.Paths {
	p, err := journal.PathsFor(rigJournalDir, rigTenant, runID)
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

// eventually polls cond every 20 ms until it holds, failing the case after rigWait.
func (r *rig) eventually(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(rigWait)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out after %v waiting for %s", rigWait, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFinished waits until runID's journal carries its sentinel.
func (r *rig) waitFinished(psid, runID string) int {
	r.t.Helper()
	var code int
	r.eventually("the sentinel of "+runID, func() bool {
		pr := journal.Probe(r.ctx, r.ex, psid, rigJournalDir, runID)
		code = pr.ExitCode
		return pr.State == journal.Finished
	})
	return code
}

// waitLine waits until runID's journal holds at least one complete line.
func (r *rig) waitLine(psid, runID string, want string) {
	r.t.Helper()
	p := r.paths(runID)
	r.eventually("a line in the journal of "+runID, func() bool {
		return strings.Contains(string(r.exec(psid, "cat -- "+journal.Quote(p.Journal)+" 2>/dev/null").Stdout), want+"\n")
	})
}

// events reads runID's whole log.
func (r *rig) events(runID string) []contract.Event {
	r.t.Helper()
	var out []contract.Event
	after := int64(0)
	for {
		res, err := r.k.Read(r.ctx, runID, after, 1000, 0)
		if err != nil {
			r.t.Fatalf("read log of %s: %v", runID, err)
		}
		out = append(out, res.Events...)
		if len(res.Events) == 0 || res.Next == after {
			return out
		}
		after = res.Next
	}
}

// deltas returns the "d" members of {"delta":d} events, in log order.
func deltas(t *testing.T, evs []contract.Event) []string {
	t.Helper()
	out := []string{}
	for _, e := range evs {
		var m struct {
			Delta *string `json:"delta"`
		}
		if err := json.Unmarshal(e.Data, &m); err != nil || m.Delta == nil {
			out = append(out, "?"+string(e.Data))
			continue
		}
		out = append(out, *m.Delta)
	}
	return out
}

// state reads runID's record with its driver attributes.
func (r *rig) state(runID string) contract.RunState {
	r.t.Helper()
	st, err := r.b.Runs().State(r.ctx, runID)
	if err != nil || st == nil {
		r.t.Fatalf("state of %s: %v %v", runID, st, err)
	}
	return *st
}

// printDeltas is shell text printing one {"delta":"d"} line per d.
func printDeltas(ds ...string) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "printf '%%s\\n' '{\"delta\":\"%s\"}'\n", d)
	}
	return b.String()
}

// waitGate is shell text waiting (bounded, 120 s) until file gate exists in the sandbox.
func waitGate(gate string) string {
	return fmt.Sprintf("i=0; while [ ! -f %s ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n", journal.Quote(gate))
}

// countingExecutor counts Exec calls (the preflight's probes).
type countingExecutor struct {
	contract.Executor
	n atomic.Int64
}

func (c *countingExecutor) Exec(ctx context.Context, id, cmd string) (contract.ExecResult, error) {
	c.n.Add(1)
	return c.Executor.Exec(ctx, id, cmd)
}
