package daytona_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/testkit/idlerace"
)

// archive asks the stand-in to archive sandbox id (Daytona's own rule does it; sandkeep
// never asks) and waits until it reads archived.
func archive(t *testing.T, f *fakeDaytona, id string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxFor(t), http.MethodPost, f.URL()+"/sandbox/"+id+"/archive", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("archive %s: %s", id, resp.Status)
	}
	if errs := f.val.takeErrs(); len(errs) != 0 {
		t.Fatalf("the archive exchange broke the documents: %v", errs)
	}
}

// TestIdleSweepReportsArchived: a thread's sandbox that Daytona stopped and archived by
// its own rules while its row still says running is probed by the reaper's idle-stop
// sweep, which asks no stop and reports it archived: the sweep's lifecycle counts it
// (archived, not stopped nor running idle), and the run view says archived since the
// sweep. The sweep after lists it no more; the thread's next start resumes the same
// sandbox and the view says running again — on both backends.
func TestIdleSweepReportsArchived(t *testing.T) {
	t.Parallel()
	for name, nb := range idlerace.Backends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, testKey)
			prov, _ := newProvider(t, f)
			var clock atomic.Int64
			clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
			k, err := keeper.New(keeper.Config{Backend: nb(t), Providers: []contract.Provider{prov},
				Now: func() time.Time { return time.UnixMilli(clock.Load()) }})
			if err != nil {
				t.Fatal(err)
			}
			rp, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: time.Hour, QuietReport: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx := contract.WithTenant(ctxFor(t), "acme")
			setup := keeper.Setup{ID: "agent", Provider: prov.Name()}
			first, err := k.Start(ctx, keeper.StartInput{RunID: "run-1", ThreadID: "thread-1", Sandbox: setup})
			if err != nil {
				t.Fatal(err)
			}
			id := first.Sandbox.ProviderSandboxID
			if _, err := k.Finish(ctx, "run-1", first.Driver.Cursor, keeper.FinishInput{Status: contract.StatusCompleted}); err != nil {
				t.Fatal(err)
			}
			// Daytona's own rules: stopped, then archived, with sandkeep's row running.
			if err := prov.Stop(ctx, id); err != nil {
				t.Fatal(err)
			}
			archive(t, f, id)
			stops := f.Count("POST", "/sandbox/"+id+"/stop")
			clock.Add(time.Hour.Milliseconds())
			sweptAt := clock.Load()
			rep, err := rp.Sweep(ctx)
			if err != nil {
				t.Fatal(err)
			}
			lc := rep.Lifecycle
			t.Logf("lifecycle %+v", lc)
			if lc.Archived != 1 || lc.Stopped != 0 || lc.IdleRunning != 0 || lc.Failed != 0 {
				t.Fatalf("lifecycle %+v: want 1 archived, nothing stopped or running idle", lc)
			}
			if n := f.Count("POST", "/sandbox/"+id+"/stop"); n != stops {
				t.Fatalf("the sweep asked %d stops of an archived sandbox", n-stops)
			}
			if got := f.state(id); got != "archived" {
				t.Fatalf("state after the sweep: %s, want archived", got)
			}
			view := func(runID string) keeper.ViewSandbox {
				t.Helper()
				v, err := k.View(ctx, runID)
				if err != nil || v.Sandbox == nil {
					t.Fatalf("view %s: %+v %v", runID, v, err)
				}
				return *v.Sandbox
			}
			if sb := view("run-1"); sb.Lifecycle != keeper.LifecycleArchived || sb.LifecycleSince != sweptAt {
				t.Fatalf("run view after the sweep: %+v, want archived since %d", sb, sweptAt)
			}
			clock.Add(time.Hour.Milliseconds())
			if rep, err := rp.Sweep(ctx); err != nil || rep.Lifecycle.Archived != 0 || rep.Lifecycle.Stopped != 0 {
				t.Fatalf("the next sweep: %+v %v, want the archived sandbox no longer listed", rep.Lifecycle, err)
			}
			second, err := k.Start(context.WithoutCancel(ctx), keeper.StartInput{RunID: "run-2", ThreadID: "thread-1", Sandbox: setup})
			if err != nil {
				t.Fatal(err)
			}
			if second.Outcome != keeper.OutcomeResumed || second.Sandbox.ProviderSandboxID != id || f.state(id) != "started" {
				t.Fatalf("the next start: %s %s (state %s), want the archived sandbox %s resumed", second.Outcome, second.Sandbox.ProviderSandboxID, f.state(id), id)
			}
			if sb := view("run-2"); sb.Lifecycle != keeper.LifecycleRunning || sb.LifecycleSince != clock.Load() {
				t.Fatalf("run view after the resume: %+v, want running since %d", sb, clock.Load())
			}
		})
	}
}
