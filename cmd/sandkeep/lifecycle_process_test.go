package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// agentLeavesChild writes a file, leaves a background process in its sandbox, prints both
// pids, then waits for the test's file "go" and exits (the run ends completed).
const agentLeavesChild = `echo kept > kept.txt; sleep 300 >/dev/null 2>&1 & echo "{\"pid\":$$,\"child\":$!}"; while [ ! -f go ]; do sleep 0.05; done`

// lifeRun is one run of TestDevRunEndSettlesSandbox and what it left in its sandbox.
type lifeRun struct {
	id, thread string
	setup      wire.SetupRequest
	cancel     bool // ended by a cancel (aborted), else by its agent's exit (completed)
	destroy    bool // the run's end destroys its sandbox
	st         wire.StartResponse
	dir        string
	pid, child int
}

// launch starts r and its agent (shipped: no host), and reads the agent's pids.
func (r *lifeRun) launch(t *testing.T, dev *clitest.Dev, c *apiclient.Client) {
	t.Helper()
	ctx := clitest.Context(t)
	st, err := c.Start(ctx, wire.StartRequest{RunID: r.id, ThreadID: r.thread, Sandbox: &r.setup})
	if err != nil {
		t.Fatal(err)
	}
	r.st, r.dir = st, filepath.Join(dev.SandboxDir, st.Sandbox.ProviderSandboxID)
	ag, err := c.Agent(ctx, r.id, wire.AgentRequest{Cursor: st.Cursor, Command: agentLeavesChild})
	if err != nil || ag.Shipping != wire.ShippingSandbox {
		t.Fatalf("agent of %s: %+v %v", r.id, ag, err)
	}
	got, _ := readEvents(t, dev.URL, r.id, 1, 20*time.Second)
	var p struct{ PID, Child int }
	if err := json.Unmarshal([]byte(got[0]), &p); err != nil || !alive(p.PID) || !alive(p.Child) {
		t.Fatalf("%s: the agent's first line %q: %v", r.id, got[0], err)
	}
	r.pid, r.child = p.PID, p.Child
}

// instance answers the store route's record of key (nil: no row).
func instance(t *testing.T, dev *clitest.Dev, key string) any {
	t.Helper()
	st, m := plain(t, dev.URL, http.MethodGet, "/v1/store/instances/"+key, "")
	if st != http.StatusOK {
		t.Fatalf("store instance %s: %d %v", key, st, m)
	}
	return m["instance"]
}

// TestDevRunEndSettlesSandbox is the run-end rule of docs/design.md §5 as a user meets it: a real
// `sandkeep dev` (local-process) whose reaper never sweeps (--reap-every 1h), so only the
// run's end can act. A setup with reuse "none" whose agent exits (completed, shipped: no
// host) and a cancelled run whose setup sets destroyOnCancel lose their sandbox at the
// end: no process of it survives (its left-behind child included), its directory is gone,
// the store's instance record is null, and the run view and `sandkeep runs get` show
// lifecycle "gone". A cancelled run without destroyOnCancel keeps its sandbox for the
// thread: directory and files there, the record kept, lifecycle "running", and the
// thread's next start resumes the same sandbox (docs/design.md §5).
func TestDevRunEndSettlesSandbox(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		ctx := clitest.Context(t)
		c := devClient(t, dev)
		none, yes := string(keeper.ReuseNone), true
		keep := &lifeRun{id: "run-cx-keep", thread: "th-keep", setup: wire.SetupRequest{ID: "default", Provider: "local-process"}, cancel: true}
		runs := []*lifeRun{
			{id: "run-none", thread: "th-none", setup: wire.SetupRequest{ID: "one-run", Provider: "local-process", Reuse: &none}, destroy: true},
			{id: "run-cx-doc", thread: "th-doc", setup: wire.SetupRequest{ID: "doc", Provider: "local-process", DestroyOnCancel: &yes}, cancel: true, destroy: true},
			keep,
		}
		started := time.Now()
		for _, r := range runs {
			r.launch(t, dev, c)
		}
		// A row touched within the reclaim margin is destroyed by the next sweep instead
		// (docs/design.md §5); the runs last longer, so their end alone decides.
		time.Sleep(time.Until(started.Add(keeper.DefaultReclaimMargin + 500*time.Millisecond)))
		// The kept one ends first: the destroyed ones' ends are then the last thing the
		// server does, and a wrongly destroyed kept sandbox has had that long to go.
		for _, r := range []*lifeRun{keep, runs[0], runs[1]} {
			want := contract.StatusCompleted
			if r.cancel {
				want = contract.StatusAborted
				if _, err := c.Cancel(ctx, r.id); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(filepath.Join(r.dir, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			waitStatus(t, c, r.id, want)
		}
		for _, r := range runs {
			if !r.destroy {
				continue
			}
			deadline := time.Now().Add(clitest.Deadline)
			for {
				_, err := os.Stat(r.dir)
				if os.IsNotExist(err) && !alive(r.pid) && !alive(r.child) && len(procsIn(t, r.dir)) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: the sandbox survives its run's end: dir %v, agent alive %v, child alive %v, processes %v\ndev stderr:\n%s",
						r.id, err, alive(r.pid), alive(r.child), procsIn(t, r.dir), dev.Stderr)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if rec := instance(t, dev, r.st.Sandbox.Key); rec != nil {
				t.Fatalf("%s: the instance record is still there: %v", r.id, rec)
			}
			v, err := c.ViewRun(ctx, r.id)
			if err != nil || v.Sandbox == nil || v.Sandbox.Lifecycle != keeper.LifecycleGone {
				t.Fatalf("%s: the run view %+v (%v), want lifecycle gone", r.id, v.Sandbox, err)
			}
			if code, out, errOut := sk(t, dev, "runs", "get", r.id); code != 0 || !strings.Contains(out, `"lifecycle": "gone"`) {
				t.Fatalf("%s: runs get exit %d: %s %s", r.id, code, out, errOut)
			}
		}
		// The cancel killed the kept sandbox's agent and the child it left (its process
		// group), though the sandbox stays for the thread (docs/design.md §5).
		for deadline := time.Now().Add(clitest.Deadline); alive(keep.pid) || alive(keep.child); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the cancelled run's agent survives its cancel: agent %d alive %v, child %d alive %v",
					keep.pid, alive(keep.pid), keep.child, alive(keep.child))
			}
		}
		if b, err := os.ReadFile(filepath.Join(keep.dir, "kept.txt")); err != nil || string(b) != "kept\n" {
			t.Fatalf("the cancelled run's sandbox without destroyOnCancel lost its files: %q %v", b, err)
		}
		if instance(t, dev, keep.st.Sandbox.Key) == nil {
			t.Fatal("the cancelled run's sandbox without destroyOnCancel lost its instance record")
		}
		if v, err := c.ViewRun(ctx, keep.id); err != nil || v.Sandbox == nil || v.Sandbox.Lifecycle != keeper.LifecycleRunning {
			t.Fatalf("the kept sandbox's view %+v (%v), want lifecycle running", v.Sandbox, err)
		}
		next, err := c.Start(ctx, wire.StartRequest{RunID: "run-keep-next", ThreadID: keep.thread, Sandbox: &keep.setup})
		if err != nil || next.Outcome != "resumed" || next.Sandbox.ProviderSandboxID != keep.st.Sandbox.ProviderSandboxID {
			t.Fatalf("the thread's next start: %+v %s (%v); want %s resumed", next.Sandbox, next.Outcome, err, keep.st.Sandbox.ProviderSandboxID)
		}
		if _, err := c.Finish(ctx, "run-keep-next", wire.FinishRequest{Cursor: next.Cursor, Status: "completed"}); err != nil {
			t.Fatal(err)
		}
	}, "--reap-every", "1h")
}

// agentCounts prints a numbered line every 0.1 s until the test's file "stop" appears.
const agentCounts = `i=0; while [ ! -f stop ]; do i=$((i+1)); echo "{\"n\":$i}"; sleep 0.1; done`

// reapLifecycle sums the lifecycle counts of the reaper's report lines in a dev server's
// stderr (one JSON line per sweep): how many sweeps, stops, and in-use deferrals.
func reapLifecycle(t *testing.T, stderr string) (sweeps, stopped, inUse int) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(stderr))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			Msg    string `json:"msg"`
			Report *struct {
				Lifecycle struct{ Stopped, InUse int }
			} `json:"report"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg != "reap" || l.Report == nil {
			continue
		}
		sweeps++
		stopped += l.Report.Lifecycle.Stopped
		inUse += l.Report.Lifecycle.InUse
	}
	return sweeps, stopped, inUse
}

// TestDevDetachedRunPastGraceNeverStopped: a real `sandkeep dev --idle-stop 1s
// --reap-every 200ms` (local-process). A run is started, its agent shipped (no host), and
// detached; for four graces its agent keeps writing and every long poll brings new lines,
// the view shows its sandbox running throughout, and the reaper's reports count the row
// deferred as in use and no stop (docs/design.md §5: a run within its TTL is live). Then
// the agent ends, and the same reaper stops the sandbox after the grace: the idle stop was
// on all along.
func TestDevDetachedRunPastGraceNeverStopped(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		ctx := clitest.Context(t)
		c := devClient(t, dev)
		st, err := c.Start(ctx, wire.StartRequest{RunID: "run-live", ThreadID: "th-live",
			Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(dev.SandboxDir, st.Sandbox.ProviderSandboxID)
		if ag, err := c.Agent(ctx, "run-live", wire.AgentRequest{Cursor: st.Cursor, Command: agentCounts}); err != nil || ag.Shipping != wire.ShippingSandbox {
			t.Fatalf("agent: %+v %v", ag, err)
		}
		readEvents(t, dev.URL, "run-live", 1, 20*time.Second) // the shipper delivers
		if run, err := c.Detach(ctx, "run-live", st.Cursor); err != nil || run.DetachedSince == nil {
			t.Fatalf("detach: %+v %v", run, err)
		}
		detached := time.Now()
		var after int64
		polls, sweeps, stopped, inUse := 0, 0, 0, 0
		// Four graces, and at least two sweeps that deferred the row past its grace: under
		// load the sweeps come slower than their period, so the count, not the clock, ends it.
		for deadline := detached.Add(clitest.Deadline); time.Since(detached) < 4*time.Second || inUse < 2; {
			if time.Now().After(deadline) {
				break
			}
			page, err := c.ReadEvents(ctx, "run-live", apiclient.ReadOptions{After: after, Wait: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Events) == 0 {
				t.Fatalf("%.1f s after the detach no new line arrived in 10 s (after offset %d)\ndev stderr:\n%s", time.Since(detached).Seconds(), after, dev.Stderr)
			}
			after = page.Events[len(page.Events)-1].Offset
			v, err := c.ViewRun(ctx, "run-live")
			if err != nil || v.Status != "running" || v.DetachedSince == nil || v.Sandbox == nil || v.Sandbox.Lifecycle != keeper.LifecycleRunning {
				t.Fatalf("%.1f s after the detach the view is %+v sandbox %+v (%v); want a detached running run on a running sandbox",
					time.Since(detached).Seconds(), v.RunRecord, v.Sandbox, err)
			}
			polls++
			if sweeps, stopped, inUse = reapLifecycle(t, dev.Stderr.String()); stopped != 0 {
				break
			}
			time.Sleep(100 * time.Millisecond) // a watcher's pace: a few lines per poll
		}
		t.Logf("detached 4 s past a 1 s grace: %d polls, last offset %d; %d sweeps: %d stops, %d in-use deferrals (load %s)",
			polls, after, sweeps, stopped, inUse, loadavg())
		switch {
		case stopped != 0:
			t.Fatalf("the reaper stopped %d sandboxes while the only one served a live run", stopped)
		case inUse < 2:
			t.Fatalf("the reaper's reports count %d in-use deferrals over %d sweeps: the row was not looked at past its grace", inUse, sweeps)
		}
		if err := os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, c, "run-live", contract.StatusCompleted)
		deadline := time.Now().Add(clitest.Deadline)
		for {
			v, err := c.ViewRun(ctx, "run-live")
			if err == nil && v.Sandbox != nil && v.Sandbox.Lifecycle == keeper.LifecycleStopped {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the ended run's sandbox is not stopped: %+v %v", v.Sandbox, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// The sweep that stopped it logs its report when it ends, after the row says so.
		for {
			_, stopped, _ := reapLifecycle(t, dev.Stderr.String())
			if stopped == 1 {
				break
			}
			if stopped > 1 || time.Now().After(deadline) {
				t.Fatalf("the reports count %d stops after the run ended, want 1", stopped)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}, "--idle-stop", "1s", "--reap-every", "200ms")
}
