package driver_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/driver"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/testkit/agenttest"
)

const dir = agenttest.Dir

// env is agenttest's world with this package's helpers.
type env struct{ *agenttest.Env }

func newEnv(t *testing.T, lease time.Duration) *env { return &env{agenttest.New(t, lease)} }

// local is the in-process transport of res's run.
func (e *env) local(res keeper.StartResult, runID string) *driver.Local {
	e.T.Helper()
	svc, err := agentrun.NewService(agentrun.ServiceConfig{Keeper: e.K, Dir: dir, PollMin: 5 * time.Millisecond, PollMax: 10 * time.Millisecond})
	if err != nil {
		e.T.Fatal(err)
	}
	l, err := driver.NewLocal(svc, driver.LocalConfig{RunID: runID, Driver: res.Driver, Executor: e.Prov, SandboxID: res.Sandbox.ProviderSandboxID})
	if err != nil {
		e.T.Fatal(err)
	}
	return l
}

// drive drives res's run over t (default: its in-process transport).
func (e *env) drive(res keeper.StartResult, runID string, t driver.Transport) (driver.Result, error) {
	if t == nil {
		t = e.local(res, runID)
	}
	return driver.Drive(e.Ctx, t, driver.Config{RunID: runID, LeaseMs: res.Driver.LeaseMs, CancelRequested: res.Driver.CancelRequested,
		PumpWait: 100 * time.Millisecond})
}

func TestNonZeroExitFailsWithTheCode(t *testing.T) {
	e := newEnv(t, 0)
	res := e.Start("r-exit", `printf '{"a":1}\n'; echo broken >&2; exit 3`)
	out, err := e.drive(res, "r-exit", nil)
	if err != nil || out.Outcome != driver.Failed || out.ExitCode != 3 || out.Events != 1 {
		t.Fatalf("drive = %+v, %v", out, err)
	}
	rec, _ := e.K.Get(e.Ctx, "r-exit")
	if rec.Status != contract.StatusFailed || rec.Error == nil || rec.Error.Code != "exit-3" || !strings.Contains(rec.Error.Message, "broken") {
		t.Fatalf("record = %+v", rec)
	}
	rr, _ := e.K.Read(e.Ctx, "r-exit", 0, 10, 0)
	if !rr.Closed || len(rr.Events) != 1 || string(rr.Events[0].Data) != `{"a":1}` || rr.Events[0].Src != 8 {
		t.Fatalf("log = %+v", rr)
	}
}

func TestNonJSONAndOversizeLines(t *testing.T) {
	e := newEnv(t, 0)
	res := e.Start("r-text", `echo 'plain text'; head -c 300000 /dev/zero | tr '\0' x; echo`)
	out, err := e.drive(res, "r-text", nil)
	if err != nil || out.Outcome != driver.Completed || out.Events < 3 {
		t.Fatalf("drive = %+v, %v", out, err)
	}
	// The 300000-byte line is longer than one event: it comes whole, in marked pieces.
	rr, _ := e.K.Read(e.Ctx, "r-text", 0, 10, 0)
	if len(rr.Events) != out.Events || string(rr.Events[0].Data) != `"plain text"` || rr.Events[len(rr.Events)-1].Src != 11+300001 {
		t.Fatalf("events = %+v", rr.Events)
	}
	var text strings.Builder
	for i, ev := range rr.Events[1:] {
		var p struct {
			Cont *bool   `json:"__cont"`
			More *bool   `json:"__more"`
			Line *string `json:"__line"`
		}
		if err := json.Unmarshal(ev.Data, &p); err != nil || p.Cont == nil || p.More == nil || p.Line == nil {
			t.Fatalf("event %d is no piece: %.80s", i+1, ev.Data)
		}
		if *p.Cont != (i > 0) || *p.More != (i < len(rr.Events)-2) {
			t.Fatalf("piece %d marked cont %v more %v", i, *p.Cont, *p.More)
		}
		text.WriteString(*p.Line)
	}
	if text.String() != strings.Repeat("x", 300000) {
		t.Fatalf("the pieces carry %d bytes", text.Len())
	}
}

// TestCancelKillsTheAgent: a cancel seen in a heartbeat kills the agent's process group
// and ends the run aborted, keeping everything the agent wrote before.
func TestCancelKillsTheAgent(t *testing.T) {
	e := newEnv(t, 300*time.Millisecond) // heartbeat every 100 ms
	res := e.Start("r-cancel", `printf '{"a":1}\n'; i=0; while [ $i -lt 600 ]; do printf x >> ticks; sleep 0.05; i=$((i+1)); done`)
	var beats atomic.Int64
	ops := &countingBeats{Transport: e.local(res, "r-cancel"), beats: &beats}
	done := make(chan driver.Result, 1)
	go func() {
		out, err := e.drive(res, "r-cancel", ops)
		if err != nil {
			t.Errorf("drive: %v", err)
		}
		done <- out
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rr, _ := e.K.Read(e.Ctx, "r-cancel", 0, 10, 0)
		if len(rr.Events) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := e.K.Cancel(e.Ctx, "r-cancel"); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if out.Outcome != driver.Aborted || beats.Load() == 0 {
		t.Fatalf("drive = %+v after %d heartbeats", out, beats.Load())
	}
	rec, _ := e.K.Get(e.Ctx, "r-cancel")
	if rec.Status != contract.StatusAborted || rec.Error == nil || rec.Error.Code != "cancelled" {
		t.Fatalf("record = %+v", rec)
	}
	size := func() string {
		r, _ := e.Prov.Exec(e.Ctx, res.Sandbox.ProviderSandboxID, "wc -c < ticks")
		return strings.TrimSpace(string(r.Stdout))
	}
	base := size()
	for range 5 {
		time.Sleep(60 * time.Millisecond)
		if s := size(); s != base {
			t.Fatalf("the agent still ticks after the cancel: %s -> %s", base, s)
		}
	}
}

// countingBeats counts the heartbeats of a drive (a seam: the transport).
type countingBeats struct {
	driver.Transport
	beats *atomic.Int64
}

func (c *countingBeats) Heartbeat(ctx context.Context) (keeper.HeartbeatResult, error) {
	c.beats.Add(1)
	return c.Transport.Heartbeat(ctx)
}

// TestHeartbeatKeepsTheLease: a drive outliving several leases keeps its lease renewed.
func TestHeartbeatKeepsTheLease(t *testing.T) {
	e := newEnv(t, 300*time.Millisecond)
	res := e.Start("r-beat", `printf '{"a":1}\n'; sleep 1; printf '{"b":2}\n'`)
	var beats atomic.Int64
	out, err := e.drive(res, "r-beat", &countingBeats{Transport: e.local(res, "r-beat"), beats: &beats})
	if err != nil || out.Outcome != driver.Completed || out.Events != 2 {
		t.Fatalf("drive = %+v, %v", out, err)
	}
	if beats.Load() < 3 {
		t.Fatalf("%d heartbeats over ~1 s with a 300 ms lease; want >= 3", beats.Load())
	}
}
