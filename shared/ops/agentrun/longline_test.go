package agentrun_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

// fetchCounter counts provider calls and the journal bytes the reader's fetches returned.
type fetchCounter struct {
	contract.Executor
	calls, fetched atomic.Int64
}

func (c *fetchCounter) Exec(ctx context.Context, psid, command string) (contract.ExecResult, error) {
	c.calls.Add(1)
	res, err := c.Executor.Exec(ctx, psid, command)
	if strings.HasPrefix(command, "tail -c +") {
		c.fetched.Add(int64(len(res.Stdout)))
	}
	return res, err
}

// longLineMiB is the size of TestStepLongUnterminatedLine's line: 12 MiB, or
// $SANDKEEP_LONG_LINE_MIB (e.g. 128 for a figure at scale).
func longLineMiB(t *testing.T) int {
	if v := os.Getenv("SANDKEEP_LONG_LINE_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("SANDKEEP_LONG_LINE_MIB=%q", v)
		}
		return n
	}
	return 12
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// TestStepLongUnterminatedLine (docs/design.md §6, long lines): an agent writes a long
// line with no newline and waits. Pumps store it as marked pieces; no pump fetches a byte
// another fetched (only the one byte before a resume position that says whether it is
// mid-line); each pump's provider calls are bounded by the bytes it reads (MaxPumpBytes
// per pump); a pump with nothing new is one call, and a waiting one fetches nothing again.
// When the line ends the log carries it whole, exactly once — on both backends. Counted,
// never timed; the times are logged as figures.
func TestStepLongUnterminatedLine(t *testing.T) {
	backends(t, func(t *testing.T, nb func() contract.Backend) {
		e := newEnvOn(t, 0, nb())
		size := int64(longLineMiB(t)) << 20
		res := e.Start("r-long", "head -c "+strconv.FormatInt(size, 10)+" /dev/zero | tr '\\0' x; "+gateOn("g")+"printf 'end\\n'")
		psid := res.Sandbox.ProviderSandboxID
		p, err := journal.PathsIn(e.Ctx, e.Prov, dir, "r-long")
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(120 * time.Second)
		for {
			r, _ := e.Prov.Exec(e.Ctx, psid, "wc -c < "+journal.Quote(p.Journal))
			if n, _ := strconv.ParseInt(strings.TrimSpace(string(r.Stdout)), 10, 64); n >= size {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the agent never wrote its line")
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("load average before: %s", loadavg())
		fc := &fetchCounter{Executor: e.Prov}
		at := res.Driver.Cursor
		maxCalls := int64(agentrun.MaxPumpBytes/journal.DefaultChunkBytes + 2)
		var (
			pumps    int
			took     time.Duration
			maxCall  int64
			maxTook  time.Duration
			startSrc = at.Src
		)
		for at.Src < size {
			calls, fetched := fc.calls.Load(), fc.fetched.Load()
			t0 := time.Now()
			r, err := agentrun.Step(e.Ctx, agentrun.StepInput{Log: e.K, Executor: fc, SandboxID: psid, Dir: dir, RunID: "r-long", At: at})
			d := time.Since(t0)
			if err != nil {
				t.Fatal(err)
			}
			pumps++
			took += d
			maxTook = max(maxTook, d)
			c := fc.calls.Load() - calls
			maxCall = max(maxCall, c)
			if r.Appended == 0 || r.Cursor.Src <= at.Src {
				t.Fatalf("pump %d stored nothing at src %d (%d calls, %d bytes fetched)", pumps, at.Src, c, fc.fetched.Load()-fetched)
			}
			if c > maxCalls || fc.fetched.Load()-fetched > agentrun.MaxPumpBytes+1 {
				t.Fatalf("pump %d: %d provider calls, %d bytes fetched; bound %d calls, %d bytes", pumps, c, fc.fetched.Load()-fetched, maxCalls, agentrun.MaxPumpBytes+1)
			}
			at = r.Cursor
		}
		t.Logf("%d MiB with no newline: %d pumps, %v in all (longest %v, mean %v), %d provider calls (at most %d a pump), %d bytes fetched; load average after: %s",
			size>>20, pumps, took.Round(time.Millisecond), maxTook.Round(time.Millisecond), (took / time.Duration(pumps)).Round(time.Millisecond),
			fc.calls.Load(), maxCall, fc.fetched.Load(), loadavg())
		if fetched, want := fc.fetched.Load(), at.Src-startSrc+int64(pumps-1); fetched != want {
			t.Fatalf("fetched %d bytes to store %d (and %d resume probes): some bytes were read twice", fetched, at.Src-startSrc, pumps-1)
		}
		// Nothing new: one call; a waiting pump fetches nothing it fetched before.
		calls, fetched := fc.calls.Load(), fc.fetched.Load()
		r, err := agentrun.Step(e.Ctx, agentrun.StepInput{Log: e.K, Executor: fc, SandboxID: psid, Dir: dir, RunID: "r-long", At: at})
		if err != nil || r.Appended != 0 || fc.calls.Load()-calls != 1 || fc.fetched.Load()-fetched != 1 {
			t.Fatalf("idle pump: %+v, %v, %d calls, %d bytes", r, err, fc.calls.Load()-calls, fc.fetched.Load()-fetched)
		}
		calls, fetched = fc.calls.Load(), fc.fetched.Load()
		r, err = agentrun.Step(e.Ctx, agentrun.StepInput{Log: e.K, Executor: fc, SandboxID: psid, Dir: dir, RunID: "r-long", At: at,
			Wait: time.Second, PollMin: 10 * time.Millisecond, PollMax: 20 * time.Millisecond})
		if err != nil || r.Appended != 0 || fc.calls.Load()-calls < 2 || fc.fetched.Load()-fetched != 1 {
			t.Fatalf("waiting pump: %+v, %v, %d calls fetched %d bytes; want several calls fetching only the resume probe",
				r, err, fc.calls.Load()-calls, fc.fetched.Load()-fetched)
		}
		if _, err := e.Prov.Exec(e.Ctx, psid, ": > g"); err != nil {
			t.Fatal(err)
		}
		e.waitFinished(res, "r-long")
		if r := e.stepUntilExited(res, "r-long", at, nil, 0); r.ExitCode != 0 {
			t.Fatalf("exit %d", r.ExitCode)
		}
		var (
			text  strings.Builder
			after int64
			prev  int64
			open  bool
		)
		for {
			rr, err := e.K.Read(e.Ctx, "r-long", after, 1000, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range rr.Events {
				var pc struct {
					Cont *bool   `json:"__cont"`
					More *bool   `json:"__more"`
					Line *string `json:"__line"`
				}
				if err := json.Unmarshal(ev.Data, &pc); err != nil || pc.Line == nil || pc.Cont == nil || pc.More == nil || *pc.Cont != open || ev.Src <= prev {
					t.Fatalf("event %d (src %d after %d) is no piece continuing the open line: %.80s", ev.Offset, ev.Src, prev, ev.Data)
				}
				text.WriteString(*pc.Line)
				open, prev = *pc.More, ev.Src
			}
			if len(rr.Events) == 0 {
				break
			}
			after = rr.Next
		}
		if open || int64(text.Len()) != size+3 || text.String() != strings.Repeat("x", int(size))+"end" || prev != size+4 {
			t.Fatalf("the log carries %d bytes (line open: %v, last src %d); want the %d-byte line exactly once", text.Len(), open, prev, size+3)
		}
	})
}
