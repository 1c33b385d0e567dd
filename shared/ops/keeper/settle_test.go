package keeper_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/idlerace"
)

// settleWorld is a keeper on a backend with a local-process provider and a hand-moved clock.
type settleWorld struct {
	t     *testing.T
	ctx   context.Context
	b     contract.Backend
	k     *keeper.Keeper
	prov  *localprocess.Provider
	clock *atomic.Int64
}

func newSettleWorld(t *testing.T, b contract.Backend) *settleWorld {
	t.Helper()
	clock := &atomic.Int64{}
	clock.Store(time.Now().UnixMilli())
	prov := localprocess.New(t.TempDir())
	k := newKeeper(t, keeper.Config{Backend: b, Providers: []contract.Provider{prov},
		Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
	return &settleWorld{t: t, ctx: contract.WithTenant(context.Background(), "acme"), b: b, k: k, prov: prov, clock: clock}
}

func (w *settleWorld) advance(d time.Duration) { w.clock.Add(d.Milliseconds()) }

// run starts runID on thread with setup, lets d pass and ends it with status (aborted:
// cancelled first, as a cancel ends a run), then settles its sandbox as every run end
// does (keeper.SettleEnded). It returns the run's sandbox and what the settle did.
func (w *settleWorld) run(runID, thread string, setup keeper.Setup, d time.Duration, status contract.RunStatus) (keeper.Sandbox, keeper.EndResult) {
	w.t.Helper()
	res, err := w.k.Start(w.ctx, keeper.StartInput{RunID: runID, ThreadID: thread, Sandbox: setup})
	if err != nil {
		w.t.Fatal(err)
	}
	psid := res.Sandbox.ProviderSandboxID
	w.t.Cleanup(func() { _ = w.prov.Destroy(context.Background(), psid) })
	w.advance(d)
	in := keeper.FinishInput{Status: status}
	if status == contract.StatusAborted {
		if _, err := w.k.Cancel(w.ctx, runID); err != nil {
			w.t.Fatal(err)
		}
		in.CancelRequested = true
	}
	rec, err := w.k.Finish(w.ctx, runID, res.Driver.Cursor, in)
	if err != nil {
		w.t.Fatal(err)
	}
	er, err := w.k.SettleEnded(w.ctx, rec)
	if err != nil {
		w.t.Fatal(err)
	}
	return res.Sandbox, er
}

// fate is what became of sb: its row's presence and the provider's status.
func (w *settleWorld) fate(sb keeper.Sandbox) (rowKept bool, st contract.SandboxStatus) {
	w.t.Helper()
	row, err := w.b.Instances().GetRow(w.ctx, sb.Key)
	if err != nil {
		w.t.Fatal(err)
	}
	st, err = w.prov.Status(context.Background(), sb.ProviderSandboxID)
	if err != nil {
		w.t.Fatal(err)
	}
	return row != nil, st
}

// stopAt runs the idle stop as the reaper does at now (the deployment grace 10 minutes):
// listed by the stop index, then StopIdle under the key's lock; "" when not listed.
func (w *settleWorld) stopAt(key string) keeper.StopOutcome {
	w.t.Helper()
	grace := keeper.DefaultIdleStop
	now := w.clock.Load()
	refs, err := w.b.Reaper().StopCandidates(w.ctx, now-grace.Milliseconds(), 100)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, ref := range refs {
		if ref.Key != key {
			continue
		}
		res, err := lockedStopGrace(w.ctx, w.k, w.b, key, now, grace)
		if err != nil {
			w.t.Fatal(err)
		}
		return res.Outcome
	}
	return ""
}

func lockedStopGrace(ctx context.Context, k *keeper.Keeper, b contract.Backend, key string, now int64, grace time.Duration) (keeper.StopResult, error) {
	var res keeper.StopResult
	err := b.Locks().WithLock(ctx, "sandbox:"+key, func(lctx context.Context) (err error) {
		res, err = k.StopIdle(lctx, key, grace, now)
		return err
	})
	return res, err
}

// TestRunEndSettlesSandbox: when a run ends (docs/design.md §5), a reuse "none" sandbox is
// destroyed at once, not at a later sweep, whatever the ending; a cancelled run's sandbox
// is kept for the thread unless its setup asks for destroyOnCancel; a completed run's is
// kept even then — on both backends.
func TestRunEndSettlesSandbox(t *testing.T) {
	for name, nb := range idlerace.Backends() {
		t.Run(name, func(t *testing.T) {
			w := newSettleWorld(t, nb(t))
			thread := keeper.Setup{ID: "agent", Provider: w.prov.Name()}
			none := thread
			none.Reuse = keeper.ReuseNone
			onCancel := thread
			onCancel.ID, onCancel.DestroyOnCancel = "agent-doc", true
			for _, c := range []struct {
				name    string
				setup   keeper.Setup
				status  contract.RunStatus
				destroy bool
			}{
				{"reuse none, completed", none, contract.StatusCompleted, true},
				{"reuse none, failed", none, contract.StatusFailed, true},
				{"reuse none, cancelled", none, contract.StatusAborted, true},
				{"thread, cancelled", thread, contract.StatusAborted, false},
				{"thread, completed", thread, contract.StatusCompleted, false},
				{"thread with destroyOnCancel, cancelled", onCancel, contract.StatusAborted, true},
				{"thread with destroyOnCancel, completed", onCancel, contract.StatusCompleted, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					w.t = t
					sb, er := w.run(sanitize(t.Name()), sanitize(t.Name())+"-thread", c.setup, time.Minute, c.status)
					rowKept, st := w.fate(sb)
					t.Logf("settle %+v; row kept %v; sandbox %s", er, rowKept, st)
					if c.destroy {
						if er.Outcome != keeper.EndDestroyed || rowKept || st != contract.SandboxGone {
							t.Fatalf("want the sandbox destroyed at the run's end; settle %+v, row kept %v, sandbox %s", er, rowKept, st)
						}
						return
					}
					if er.Outcome != keeper.EndKept || !rowKept || st != contract.SandboxAlive {
						t.Fatalf("want the sandbox kept for the thread; settle %+v, row kept %v, sandbox %s", er, rowKept, st)
					}
				})
			}
		})
	}
}

// sanitize makes a subtest name an id.
func sanitize(s string) string {
	out := []byte{}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			out = append(out, c)
		default:
			out = append(out, '-')
		}
	}
	if len(out) > 60 {
		out = out[len(out)-60:]
	}
	return "r" + string(out)
}

// TestSetupIdleGrace: a setup's own idle grace overrides the deployment's (10 minutes),
// shorter or longer: a 2-minute grace stops the sandbox 2 minutes after its run ended
// (listed for the sweep by the run's end), not before; a 20-minute grace keeps it past
// the deployment's 10 and stops it at 20 — on both backends.
func TestSetupIdleGrace(t *testing.T) {
	for name, nb := range idlerace.Backends() {
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				grace       time.Duration
				early, late time.Duration // not stopped at end+early; stopped at end+late
			}{
				{2 * time.Minute, time.Minute + 50*time.Second, 2 * time.Minute},
				{20 * time.Minute, 19 * time.Minute, 20 * time.Minute},
			} {
				t.Run(c.grace.String(), func(t *testing.T) {
					w := newSettleWorld(t, nb(t))
					setup := keeper.Setup{ID: "agent", Provider: w.prov.Name(), IdleStopMs: c.grace.Milliseconds()}
					sb, _ := w.run("run-1", "thread-1", setup, 30*time.Minute, contract.StatusCompleted)
					ended := w.clock.Load()
					// Sweeps every minute up to the early mark: never a stop.
					for at := time.Minute; at <= c.early; at += time.Minute {
						w.clock.Store(ended + at.Milliseconds())
						if got := w.stopAt(sb.Key); got == keeper.StopStopped {
							t.Fatalf("stopped %s after the run's end, before its %s grace", at, c.grace)
						}
					}
					w.clock.Store(ended + c.early.Milliseconds())
					if got := w.stopAt(sb.Key); got == keeper.StopStopped {
						t.Fatalf("stopped %s after the run's end, before its %s grace", c.early, c.grace)
					}
					w.clock.Store(ended + c.late.Milliseconds())
					got := w.stopAt(sb.Key)
					_, st := w.fate(sb)
					t.Logf("grace %s: at end+%s the idle stop says %q; sandbox %s", c.grace, c.late, got, st)
					if got != keeper.StopStopped || st != contract.SandboxStopped {
						t.Fatalf("at end+%s (grace %s): idle stop %q, sandbox %s; want stopped", c.late, c.grace, got, st)
					}
				})
			}
		})
	}
}
