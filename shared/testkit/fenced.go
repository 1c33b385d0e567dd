package testkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// RunFencedRunsConformance proves the fenced run primitives (docs/design.md §2.2): create-claimed, claim
// with its refusals and conditions, update-fenced, record-sandbox, heartbeat, detach, lapse,
// request-cancel, the in-use index, and index-helper maintenance by the plain writes. Every
// conditional write has a lost-response case: the same call repeated after it landed.
func RunFencedRunsConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, fxCases())
}

const (
	fxTenant  = "tenant-a"
	fxStart   = 1000   // startedAt of every fixture run
	fxLease   = 61_000 // leaseUntil of every CreateClaimed fixture
	fxKey     = "sk_a"
	fxSandbox = "sb-1"
)

// fxRuns returns the fenced run store; fresh fails a case whose backend has none.
func fxRuns(t *testing.T, b contract.Backend) contract.FencedRuns {
	t.Helper()
	return b.Runs()
}

// fxInput is the CreateClaimed input of fixture run id in the default shape.
func fxInput(id string) contract.CreateClaimedRun {
	return contract.CreateClaimedRun{
		NewRun:     contract.NewRun{RunID: id, ThreadID: "t", StartedAt: fxStart},
		SandboxKey: fxKey, ProviderSandboxID: fxSandbox, LeaseUntil: fxLease, Token: "create-" + id,
	}
}

// fxFresh is the state CreateClaimed must produce for fxInput(id).
func fxFresh(id string) contract.RunState {
	return contract.RunState{
		RunRecord: contract.RunRecord{RunID: id, ThreadID: "t", Status: contract.StatusRunning, StartedAt: fxStart,
			SandboxKey: cfPtr(fxKey), DriverEpoch: cfPtr[int64](1)},
		ProviderSandboxID: fxSandbox, LeaseUntil: fxLease,
	}
}

// fxCreate creates fixture run id in tenant holding epoch 1.
func fxCreate(t *testing.T, runs contract.FencedRuns, tenant, id string) contract.RunState {
	t.Helper()
	rec, created, err := runs.CreateClaimed(ctxFor(t, tenant), fxInput(id))
	cfNoErr(t, err, "CreateClaimed "+id)
	if !created || rec.Epoch() != 1 {
		t.Fatalf("CreateClaimed %s = (%s, created=%v), want epoch 1 and created", id, cfJSON(rec), created)
	}
	return rec
}

// fxEqual reports whether two states are deep-equal (usage compared as decoded JSON).
func fxEqual(a, b contract.RunState) bool {
	a.RunRecord, b.RunRecord = rsNorm(a.RunRecord), rsNorm(b.RunRecord)
	return reflect.DeepEqual(a, b)
}

// fxState reads the state of run id in tenant.
func fxState(t *testing.T, runs contract.FencedRuns, tenant, id string) *contract.RunState {
	t.Helper()
	got, err := runs.State(ctxFor(t, tenant), id)
	cfNoErr(t, err, "State "+id)
	return got
}

// fxWant fails unless the state of run id is exactly want (nil = absent).
func fxWant(t *testing.T, runs contract.FencedRuns, tenant, id string, want *contract.RunState, what string) {
	t.Helper()
	cfWantRead(t, "State", id, fxState(t, runs, tenant, id), want, fxEqual, what)
}

// fxReturned fails unless a primitive's returned state equals the stored state (the
// contracts return the record after the write).
func fxReturned(t *testing.T, runs contract.FencedRuns, tenant string, got contract.RunState, what string) {
	t.Helper()
	fxWant(t, runs, tenant, got.RunID, &got, what+" (returned vs stored)")
}

// fxClaim claims run id, failing on an error.
func fxClaim(t *testing.T, runs contract.FencedRuns, tenant, id string, c contract.Claim) contract.RunState {
	t.Helper()
	got, err := runs.Claim(ctxFor(t, tenant), id, c)
	cfNoErr(t, err, "Claim "+id+" token "+c.Token)
	fxReturned(t, runs, tenant, got, "Claim "+c.Token)
	return got
}

// fxFinish writes a terminal status under epoch.
func fxFinish(t *testing.T, runs contract.FencedRuns, tenant, id string, epoch int64, st contract.RunStatus) contract.RunState {
	t.Helper()
	got, err := runs.UpdateFenced(ctxFor(t, tenant), id, epoch, contract.RunPatch{Status: contract.Set(st), FinishedAt: contract.Set[int64](9000)})
	cfNoErr(t, err, "UpdateFenced "+id+" to "+string(st))
	return got
}

// fxDetach detaches run id under epoch at now.
func fxDetach(t *testing.T, runs contract.FencedRuns, tenant, id string, epoch, now int64) contract.RunState {
	t.Helper()
	got, err := runs.Detach(ctxFor(t, tenant), id, epoch, fxKey, now)
	cfNoErr(t, err, fmt.Sprintf("Detach %s at %d", id, now))
	fxReturned(t, runs, tenant, got, "Detach")
	return got
}

// fxUsingKeyEventually polls RunsUsingKey until it holds exactly the ids want (any order).
func fxUsingKeyEventually(t *testing.T, b contract.Backend, tenant, key string, want []string, what string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := b.Runs().RunsUsingKey(ctxFor(t, tenant), key)
		if err != nil {
			return false, "", fmt.Errorf("RunsUsingKey %q: %w", key, err)
		}
		got = slices.Sorted(slices.Values(got))
		return cfSameStrings(got, want), cfStrings(got), nil
	})
}

func fxCases() []cfCase {
	return []cfCase{
		// CreateClaimed.
		{"CreateClaimed creates the run holding epoch 1, its key, sandbox and lease", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			got := fxCreate(t, runs, fxTenant, "r")
			want := fxFresh("r")
			if !fxEqual(got, want) {
				t.Fatalf("CreateClaimed = %s, want %s", cfJSON(got), cfJSON(want))
			}
			fxWant(t, runs, fxTenant, "r", &want, "stored")
			rsWant(t, refstore.Runs(b.Runs()), fxTenant, "r", &want.RunRecord, "Get")
			rsActiveEventually(t, b, fxTenant, "t", &want.RunRecord, "the created run is active")
		}},
		{"CreateClaimed without a sandbox id leaves it unrecorded", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			in := fxInput("r")
			in.ProviderSandboxID = ""
			got, created, err := runs.CreateClaimed(ctxFor(t, fxTenant), in)
			cfNoErr(t, err, "CreateClaimed")
			want := fxFresh("r")
			want.ProviderSandboxID = ""
			if !created || !fxEqual(got, want) {
				t.Fatalf("CreateClaimed = (%s, %v), want (%s, true)", cfJSON(got), created, cfJSON(want))
			}
			fxWant(t, runs, fxTenant, "r", &want, "stored")
		}},
		{"CreateClaimed on an existing run returns it untouched with created=false", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			plain := rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "plain", "t", 5)
			got, created, err := runs.CreateClaimed(ctx, fxInput("plain"))
			cfNoErr(t, err, "CreateClaimed over a CreateOrResume run")
			want := contract.RunState{RunRecord: plain}
			if created || !fxEqual(got, want) {
				t.Fatalf("CreateClaimed over an unclaimed run = (%s, %v), want it untouched (%s, false)", cfJSON(got), created, cfJSON(want))
			}
			fxWant(t, runs, fxTenant, "plain", &want, "the unclaimed run after CreateClaimed")

			first := fxCreate(t, runs, fxTenant, "claimed")
			other := fxInput("claimed")
			other.Token, other.LeaseUntil, other.SandboxKey, other.ThreadID = "create-other", 99_999, "sk_other", "t-other"
			got, created, err = runs.CreateClaimed(ctx, other)
			cfNoErr(t, err, "CreateClaimed with another token")
			if created || !fxEqual(got, first) {
				t.Fatalf("CreateClaimed with another token = (%s, %v), want (%s, false)", cfJSON(got), created, cfJSON(first))
			}
			fxWant(t, runs, fxTenant, "claimed", &first, "after the second CreateClaimed")

			fxCreate(t, runs, fxTenant, "done")
			done := fxFinish(t, runs, fxTenant, "done", 1, contract.StatusCompleted)
			in := fxInput("done")
			in.Token = "create-again"
			got, created, err = runs.CreateClaimed(ctx, in)
			cfNoErr(t, err, "CreateClaimed over a terminal run")
			if created || !fxEqual(got, done) {
				t.Fatalf("CreateClaimed over a terminal run = (%s, %v), want (%s, false)", cfJSON(got), created, cfJSON(done))
			}
		}},
		{"CreateClaimed retried with its own token after it landed reports created=true", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			first := fxCreate(t, runs, fxTenant, "r")
			got, created, err := runs.CreateClaimed(ctxFor(t, fxTenant), fxInput("r"))
			cfNoErr(t, err, "retried CreateClaimed")
			if !created || !fxEqual(got, first) {
				t.Fatalf("retried CreateClaimed = (%s, %v), want (%s, true)", cfJSON(got), created, cfJSON(first))
			}
			fxWant(t, runs, fxTenant, "r", &first, "after the retry")
		}},

		// Claim.
		{"Claim bumps the epoch by exactly one and renews the lease", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			want := fxCreate(t, runs, fxTenant, "r")
			for i, lease := range []int64{90_000, 80_000} { // a lease may also move back: the claim sets it
				got := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: fmt.Sprintf("claim-%d", i), LeaseUntil: lease})
				want.DriverEpoch, want.LeaseUntil = cfPtr(int64(i+2)), lease
				if !fxEqual(got, want) {
					t.Fatalf("claim %d = %s, want %s", i, cfJSON(got), cfJSON(want))
				}
			}
			rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "unclaimed", "t", 5)
			if got := fxClaim(t, runs, fxTenant, "unclaimed", contract.Claim{Token: "c", LeaseUntil: 70_000}); got.Epoch() != 1 || got.LeaseUntil != 70_000 {
				t.Fatalf("first claim of an unclaimed run = %s, want epoch 1 lease 70000", cfJSON(got))
			}
		}},
		{"Claim refusals are distinguishable: unknown, terminal, conflict", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			_, err := runs.Claim(ctx, "absent", contract.Claim{Token: "c", LeaseUntil: 1})
			cfIs(t, err, contract.ErrUnknownRun, "Claim of an unknown run")
			fxWant(t, runs, fxTenant, "absent", nil, "a refused claim creates nothing")
			for _, st := range []contract.RunStatus{contract.StatusCompleted, contract.StatusFailed, contract.StatusAborted} {
				id := "done-" + string(st)
				fxCreate(t, runs, fxTenant, id)
				done := fxFinish(t, runs, fxTenant, id, 1, st)
				_, err = runs.Claim(ctx, id, contract.Claim{Token: "c", LeaseUntil: 1})
				cfIs(t, err, contract.ErrTerminalRun, "Claim of a "+string(st)+" run")
				fxWant(t, runs, fxTenant, id, &done, "the "+string(st)+" run after the refused claim")
			}
			live := fxCreate(t, runs, fxTenant, "live")
			_, err = runs.Claim(ctx, "live", contract.Claim{Token: "c", LeaseUntil: 1, If: contract.ClaimCond{DetachedSince: cfPtr[int64](5000)}})
			cfIs(t, err, contract.ErrConflict, "Claim conditioned on a detachedSince the run lacks")
			fxWant(t, runs, fxTenant, "live", &live, "after the refused claim")
		}},
		{"Claim conditioned on detachedSince requires equality", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			fxCreate(t, runs, fxTenant, "r")
			want := fxDetach(t, runs, fxTenant, "r", 1, 5000)
			for _, ds := range []int64{4999, 5001, 0} {
				_, err := runs.Claim(ctx, "r", contract.Claim{Token: "c", LeaseUntil: 1, If: contract.ClaimCond{DetachedSince: cfPtr(ds)}})
				cfIs(t, err, contract.ErrConflict, fmt.Sprintf("Claim if detachedSince = %d", ds))
				fxWant(t, runs, fxTenant, "r", &want, "after the refused claim")
			}
			got := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c-ok", LeaseUntil: 70_000, If: contract.ClaimCond{DetachedSince: cfPtr[int64](5000)}})
			if got.Epoch() != 2 || got.DetachedSince == nil || *got.DetachedSince != 5000 {
				t.Fatalf("claim if detachedSince = 5000: %s, want epoch 2 with detachedSince kept", cfJSON(got))
			}
		}},
		{"Claim cutoff is inclusive and needs a detachedSince", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			attached := fxCreate(t, runs, fxTenant, "attached")
			_, err := runs.Claim(ctx, "attached", contract.Claim{Token: "c", LeaseUntil: 1, If: contract.ClaimCond{Cutoff: cfPtr[int64](1 << 40)}})
			cfIs(t, err, contract.ErrConflict, "Claim with a cutoff of a run never detached")
			fxWant(t, runs, fxTenant, "attached", &attached, "after the refused claim")
			fxCreate(t, runs, fxTenant, "r")
			want := fxDetach(t, runs, fxTenant, "r", 1, 5000)
			_, err = runs.Claim(ctx, "r", contract.Claim{Token: "c", LeaseUntil: 1, If: contract.ClaimCond{DetachedSince: cfPtr[int64](5000), Cutoff: cfPtr[int64](4999)}})
			cfIs(t, err, contract.ErrConflict, "Claim with cutoff 4999 of a run detached at 5000")
			fxWant(t, runs, fxTenant, "r", &want, "after the refused claim")
			got := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c-ok", LeaseUntil: 70_000, If: contract.ClaimCond{DetachedSince: cfPtr[int64](5000), Cutoff: cfPtr[int64](5000)}})
			if got.Epoch() != 2 {
				t.Fatalf("claim at the inclusive cutoff = %s, want epoch 2", cfJSON(got))
			}
			got = fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c-cut", LeaseUntil: 70_000, If: contract.ClaimCond{Cutoff: cfPtr[int64](6000)}})
			if got.Epoch() != 3 {
				t.Fatalf("claim with a cutoff alone = %s, want epoch 3", cfJSON(got))
			}
		}},
		{"Claim unheld: refused while a driver's lease runs, with the run as read", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			held := fxCreate(t, runs, fxTenant, "held") // leaseUntil fxLease, attached
			for _, at := range []int64{0, fxLease - 1} {
				_, err := runs.Claim(ctx, "held", contract.Claim{Token: "c", LeaseUntil: 1, If: contract.ClaimCond{Unheld: cfPtr(at)}})
				cfIs(t, err, contract.ErrConflict, fmt.Sprintf("Claim unheld at %d of a run leased until %d", at, fxLease))
				var refused *contract.ClaimRefused
				if !errors.As(err, &refused) || refused.State.Epoch() != 1 || refused.State.LeaseUntil != fxLease || refused.State.RunID != "held" {
					t.Fatalf("the refusal %v carries %+v, want the run at epoch 1 leased until %d", err, refused, fxLease)
				}
				fxWant(t, runs, fxTenant, "held", &held, "after the refused claim")
			}
			// The lease's end is inclusive: at leaseUntil nobody holds the run.
			if got := fxClaim(t, runs, fxTenant, "held", contract.Claim{Token: "c-end", LeaseUntil: 70_000, If: contract.ClaimCond{Unheld: cfPtr[int64](fxLease)}}); got.Epoch() != 2 {
				t.Fatalf("claim unheld at the lease's end = %s, want epoch 2", cfJSON(got))
			}
			// A detached run is unheld whatever its lease says.
			fxCreate(t, runs, fxTenant, "detached")
			fxDetach(t, runs, fxTenant, "detached", 1, 5000)
			if got := fxClaim(t, runs, fxTenant, "detached", contract.Claim{Token: "c-det", LeaseUntil: 70_000, ClearDetached: true, If: contract.ClaimCond{Unheld: cfPtr[int64](0)}}); got.Epoch() != 2 || got.DetachedSince != nil {
				t.Fatalf("claim unheld of a detached run = %s, want epoch 2, attached", cfJSON(got))
			}
		}},
		{"Claim on the cancel path requires cancelRequested", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			fxCreate(t, runs, fxTenant, "r")
			want := fxDetach(t, runs, fxTenant, "r", 1, 5000)
			cond := contract.ClaimCond{DetachedSince: cfPtr[int64](5000), Cancelled: true}
			_, err := runs.Claim(ctx, "r", contract.Claim{Token: "c", LeaseUntil: 1, If: cond})
			cfIs(t, err, contract.ErrConflict, "cancel-path claim of a run not cancelled")
			fxWant(t, runs, fxTenant, "r", &want, "after the refused claim")
			_, err = runs.RequestCancel(ctx, "r")
			cfNoErr(t, err, "RequestCancel")
			got := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c-ok", LeaseUntil: 70_000, If: cond})
			if got.Epoch() != 2 || !got.Cancelled() || got.DetachedSince == nil || *got.DetachedSince != 5000 {
				t.Fatalf("cancel-path claim = %s, want epoch 2, cancelled, detachedSince 5000", cfJSON(got))
			}
			// Cancelled alone needs no detachment.
			fxCreate(t, runs, fxTenant, "attached")
			_, err = runs.Claim(ctx, "attached", contract.Claim{Token: "c", LeaseUntil: 1, If: contract.ClaimCond{Cancelled: true}})
			cfIs(t, err, contract.ErrConflict, "cancel-path claim of an attached run not cancelled")
			_, err = runs.RequestCancel(ctx, "attached")
			cfNoErr(t, err, "RequestCancel attached")
			if got := fxClaim(t, runs, fxTenant, "attached", contract.Claim{Token: "c2", LeaseUntil: 1, If: contract.ClaimCond{Cancelled: true}}); got.Epoch() != 2 {
				t.Fatalf("cancel-path claim of a cancelled attached run = %s, want epoch 2", cfJSON(got))
			}
		}},
		{"Claim with ClearDetached removes detachedSince and lapsed; without it both stay", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			fxCreate(t, runs, fxTenant, "detached")
			fxDetach(t, runs, fxTenant, "detached", 1, 5000)
			got := fxClaim(t, runs, fxTenant, "detached", contract.Claim{Token: "keep", LeaseUntil: 70_000})
			if got.DetachedSince == nil || *got.DetachedSince != 5000 {
				t.Fatalf("claim without ClearDetached = %s, want detachedSince 5000 kept", cfJSON(got))
			}
			got = fxClaim(t, runs, fxTenant, "detached", contract.Claim{Token: "clear", LeaseUntil: 70_000, ClearDetached: true})
			if got.DetachedSince != nil || got.Lapsed || got.Epoch() != 3 {
				t.Fatalf("claim with ClearDetached = %s, want no detachedSince, epoch 3", cfJSON(got))
			}
			fxCreate(t, runs, fxTenant, "lapsed")
			cfNoErr(t, runs.Lapse(ctx, "lapsed", 1, fxLease), "Lapse")
			got = fxClaim(t, runs, fxTenant, "lapsed", contract.Claim{Token: "keep", LeaseUntil: 70_000, If: contract.ClaimCond{DetachedSince: cfPtr[int64](fxLease)}})
			if got.DetachedSince == nil || *got.DetachedSince != fxLease || !got.Lapsed {
				t.Fatalf("reaper claim of a lapsed run = %s, want detachedSince %d and lapsed kept", cfJSON(got), fxLease)
			}
			got = fxClaim(t, runs, fxTenant, "lapsed", contract.Claim{Token: "clear", LeaseUntil: 80_000, ClearDetached: true})
			if got.DetachedSince != nil || got.Lapsed || got.LeaseUntil != 80_000 {
				t.Fatalf("attach claim of a lapsed run = %s, want no detachedSince, not lapsed, lease 80000", cfJSON(got))
			}
		}},
		{"Claim turns an interrupted run running", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			fxCreate(t, runs, fxTenant, "r")
			paused, err := runs.UpdateFenced(ctxFor(t, fxTenant), "r", 1, contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)})
			cfNoErr(t, err, "UpdateFenced interrupted")
			if paused.Status != contract.StatusInterrupted {
				t.Fatalf("after interrupting: %s", cfJSON(paused))
			}
			rsActiveEventually(t, b, fxTenant, "t", nil, "an interrupted run is not active")
			got := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c", LeaseUntil: 70_000})
			if got.Status != contract.StatusRunning || got.Epoch() != 2 {
				t.Fatalf("claim of an interrupted run = %s, want running at epoch 2", cfJSON(got))
			}
			rsActiveEventually(t, b, fxTenant, "t", &got.RunRecord, "the claimed run is active again")
		}},
		{"Claim returns the record after the write, cancelRequested included", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			want := fxCreate(t, runs, fxTenant, "r")
			_, err := runs.RequestCancel(ctxFor(t, fxTenant), "r")
			cfNoErr(t, err, "RequestCancel")
			got := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c", LeaseUntil: 77_000})
			want.CancelRequested, want.DriverEpoch, want.LeaseUntil = cfPtr(true), cfPtr[int64](2), 77_000
			if !fxEqual(got, want) {
				t.Fatalf("Claim = %s, want %s", cfJSON(got), cfJSON(want))
			}
		}},
		{"a retried Claim whose condition now fails but which carries my token succeeds", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			fxCreate(t, runs, fxTenant, "r")
			fxDetach(t, runs, fxTenant, "r", 1, 5000)
			c := contract.Claim{Token: "claim-1", LeaseUntil: 70_000, ClearDetached: true, If: contract.ClaimCond{DetachedSince: cfPtr[int64](5000)}}
			first := fxClaim(t, runs, fxTenant, "r", c)
			if first.Epoch() != 2 || first.DetachedSince != nil {
				t.Fatalf("claim = %s, want epoch 2 without detachedSince", cfJSON(first))
			}
			// The first attempt landed but its response was lost; the retry's condition
			// (detachedSince = 5000) no longer holds, yet the run carries its token.
			again, err := runs.Claim(ctxFor(t, fxTenant), "r", c)
			cfNoErr(t, err, "retried Claim")
			if again.Epoch() != first.Epoch() {
				t.Fatalf("retried claim returned epoch %d, want the landed %d", again.Epoch(), first.Epoch())
			}
			fxWant(t, runs, fxTenant, "r", &first, "after the retried claim")
		}},
		{"a retried Claim after another claimer won is refused", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			fxCreate(t, runs, fxTenant, "r")
			fxDetach(t, runs, fxTenant, "r", 1, 5000)
			c := contract.Claim{Token: "claim-1", LeaseUntil: 70_000, ClearDetached: true, If: contract.ClaimCond{DetachedSince: cfPtr[int64](5000)}}
			fxClaim(t, runs, fxTenant, "r", c)
			winner := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "claim-2", LeaseUntil: 80_000, ClearDetached: true})
			_, err := runs.Claim(ctxFor(t, fxTenant), "r", c)
			cfIs(t, err, contract.ErrConflict, "late retry of claim-1")
			fxWant(t, runs, fxTenant, "r", &winner, "after the late retry")
		}},
		{"concurrent Claims yield distinct epochs", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			const n, maxRounds = 16, 20
			overlapped := 0 // claims that started while another claim on the run was in flight
			burned := 0     // epochs skipped by retried claims (only through a lossy network)
			rounds := 0
			for rounds < maxRounds && (rounds < 2 || overlapped == 0) {
				id := fmt.Sprintf("race-%d", rounds)
				rounds++
				fxCreate(t, runs, fxTenant, id)
				var inflight, overlaps atomic.Int64
				start := make(chan struct{})
				epochs := make([]int64, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						<-start
						if inflight.Add(1) > 1 {
							overlaps.Add(1)
						}
						got, err := runs.Claim(ctxFor(t, fxTenant), id, contract.Claim{Token: fmt.Sprintf("claim-%d", i), LeaseUntil: int64(70_000 + i)})
						inflight.Add(-1)
						epochs[i], errs[i] = got.Epoch(), err
					})
				}
				close(start)
				wg.Wait()
				for i, err := range errs {
					cfNoErr(t, err, fmt.Sprintf("round %d claim %d", rounds, i))
				}
				// Every claimer gets its own epoch, above 1 and at most the final one. A claim
				// whose response was lost and whose retry met another claimer's token may burn
				// an epoch (docs/design.md §3.1: harmless), so gaps are allowed and counted, never
				// duplicates.
				slices.Sort(epochs)
				st := fxState(t, runs, fxTenant, id)
				if st == nil {
					t.Fatalf("round %d: run vanished", rounds)
				}
				for i, e := range epochs {
					if e < 2 || e > st.Epoch() || (i > 0 && e == epochs[i-1]) {
						t.Fatalf("round %d: epochs returned %v, final %d: want %d distinct epochs in 2..final", rounds, epochs, st.Epoch(), n)
					}
				}
				if st.Epoch() < n+1 || st.Epoch() != epochs[n-1] {
					t.Fatalf("round %d: final state %s, want epoch %d (the highest returned, at least %d)", rounds, cfJSON(st), epochs[n-1], n+1)
				}
				burned += int(st.Epoch()) - 1 - int(n)
				overlapped += int(overlaps.Load())
			}
			t.Logf("%d rounds of %d concurrent claims; %d claims overlapped another in flight; %d epochs burned by retries", rounds, n, overlapped, burned)
			if overlapped == 0 {
				t.Fatalf("no two claims were ever in flight together in %d rounds; the race was never exercised", rounds)
			}
		}},

		// UpdateFenced.
		{"UpdateFenced applies the patch under the current epoch", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			want := fxCreate(t, runs, fxTenant, "r")
			got, err := runs.UpdateFenced(ctxFor(t, fxTenant), "r", 1, contract.RunPatch{Usage: contract.Set(json.RawMessage(rsUsage)),
				Error: contract.Set(contract.RunError{Message: "m", Code: "c"})})
			cfNoErr(t, err, "UpdateFenced")
			want.Usage, want.Error = json.RawMessage(rsUsage), &contract.RunError{Message: "m", Code: "c"}
			if !fxEqual(got, want) {
				t.Fatalf("UpdateFenced = %s, want %s", cfJSON(got), cfJSON(want))
			}
			fxReturned(t, runs, fxTenant, got, "UpdateFenced")
		}},
		{"UpdateFenced refuses a mismatched epoch with ErrSuperseded", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			want := fxCreate(t, runs, fxTenant, "r")
			for _, e := range []int64{0, 2, -1} {
				_, err := runs.UpdateFenced(ctxFor(t, fxTenant), "r", e, contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
				cfIs(t, err, contract.ErrSuperseded, fmt.Sprintf("UpdateFenced at epoch %d of a run at 1", e))
				fxWant(t, runs, fxTenant, "r", &want, "after the refused write")
			}
			rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "unclaimed", "t", 5)
			_, err := runs.UpdateFenced(ctxFor(t, fxTenant), "unclaimed", 1, contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
			cfIs(t, err, contract.ErrSuperseded, "UpdateFenced at epoch 1 of a never-claimed run")
		}},
		{"UpdateFenced refuses terminal and unknown runs", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			_, err := runs.UpdateFenced(ctx, "absent", 1, contract.RunPatch{Status: contract.Set(contract.StatusCompleted)})
			cfIs(t, err, contract.ErrUnknownRun, "UpdateFenced of an unknown run")
			fxWant(t, runs, fxTenant, "absent", nil, "a refused write creates nothing")
			fxCreate(t, runs, fxTenant, "r")
			done := fxFinish(t, runs, fxTenant, "r", 1, contract.StatusCompleted)
			for name, p := range map[string]contract.RunPatch{
				"usage":           {Usage: contract.Set(json.RawMessage(`{"x":1}`))},
				"another status":  {Status: contract.Set(contract.StatusFailed), FinishedAt: contract.Set[int64](9000)},
				"running again":   {Status: contract.Set(contract.StatusRunning)},
				"cancel":          {CancelRequested: contract.Set(true)},
				"detached":        {DetachedSince: contract.Set[int64](1)},
				"interrupted now": {Status: contract.Set(contract.StatusInterrupted)},
			} {
				_, err := runs.UpdateFenced(ctx, "r", 1, p)
				cfIs(t, err, contract.ErrTerminalRun, "UpdateFenced of a completed run: "+name)
				fxWant(t, runs, fxTenant, "r", &done, "the completed run after "+name)
			}
		}},
		{"a retried terminal UpdateFenced succeeds idempotently", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			for _, st := range []contract.RunStatus{contract.StatusCompleted, contract.StatusFailed, contract.StatusAborted} {
				id := "r-" + string(st)
				fxCreate(t, runs, fxTenant, id)
				p := contract.RunPatch{Status: contract.Set(st), FinishedAt: contract.Set[int64](9000), Usage: contract.Set(json.RawMessage(`{"totalTokens":7}`))}
				if st == contract.StatusFailed {
					p.Error = contract.Set(contract.RunError{Message: "boom", Code: "start-failed"})
				}
				first, err := runs.UpdateFenced(ctx, id, 1, p)
				cfNoErr(t, err, "terminal UpdateFenced "+string(st))
				again, err := runs.UpdateFenced(ctx, id, 1, p)
				cfNoErr(t, err, "retried terminal UpdateFenced "+string(st))
				if again.Status != st || !fxEqual(again, first) {
					t.Fatalf("retry returned %s, want the landed %s", cfJSON(again), cfJSON(first))
				}
				fxWant(t, runs, fxTenant, id, &first, "after the retry")
			}
		}},
		{"every fenced write refuses a stale epoch after a claim", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			fxCreate(t, runs, fxTenant, "r")
			now := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "takeover", LeaseUntil: 70_000, ClearDetached: true})
			_, err := runs.UpdateFenced(ctx, "r", 1, contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set[int64](9000)})
			cfIs(t, err, contract.ErrSuperseded, "UpdateFenced by the old epoch")
			_, err = runs.RecordSandbox(ctx, "r", 1, "sb-old")
			cfIs(t, err, contract.ErrSuperseded, "RecordSandbox by the old epoch")
			_, err = runs.Heartbeat(ctx, "r", 1, 99_000)
			cfIs(t, err, contract.ErrSuperseded, "Heartbeat by the old epoch")
			_, err = runs.Detach(ctx, "r", 1, fxKey, 5000)
			cfIs(t, err, contract.ErrSuperseded, "Detach by the old epoch")
			fxWant(t, runs, fxTenant, "r", &now, "after the old epoch's refused writes")
			done := fxFinish(t, runs, fxTenant, "r", 2, contract.StatusCompleted)
			if done.Status != contract.StatusCompleted || done.Epoch() != 2 {
				t.Fatalf("the new epoch's finish = %s", cfJSON(done))
			}
		}},
		{"UpdateFenced rejects an invalid patch and changes nothing", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			want := fxCreate(t, runs, fxTenant, "r")
			for name, p := range map[string]contract.RunPatch{
				"Clear status":   {Status: contract.Clear[contract.RunStatus]()},
				"unknown status": {Status: contract.Set(contract.RunStatus("Completed"))},
				"usage not JSON": {Usage: contract.Set(json.RawMessage(`nope`))},
			} {
				_, err := runs.UpdateFenced(ctxFor(t, fxTenant), "r", 1, p)
				cfIs(t, err, contract.ErrInvalid, "UpdateFenced with "+name)
				fxWant(t, runs, fxTenant, "r", &want, "after the refused "+name)
			}
		}},

		// RecordSandbox.
		{"RecordSandbox records the sandbox id under the fence", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			in := fxInput("r")
			in.ProviderSandboxID = ""
			_, _, err := runs.CreateClaimed(ctx, in)
			cfNoErr(t, err, "CreateClaimed")
			got, err := runs.RecordSandbox(ctx, "r", 1, "sb-9")
			cfNoErr(t, err, "RecordSandbox")
			want := fxFresh("r")
			want.ProviderSandboxID = "sb-9"
			if !fxEqual(got, want) {
				t.Fatalf("RecordSandbox = %s, want %s", cfJSON(got), cfJSON(want))
			}
			fxReturned(t, runs, fxTenant, got, "RecordSandbox")
			again, err := runs.RecordSandbox(ctx, "r", 1, "sb-9")
			cfNoErr(t, err, "retried RecordSandbox")
			if !fxEqual(again, want) {
				t.Fatalf("retried RecordSandbox = %s, want %s", cfJSON(again), cfJSON(want))
			}
			_, err = runs.RecordSandbox(ctx, "r", 2, "sb-x")
			cfIs(t, err, contract.ErrSuperseded, "RecordSandbox by a higher epoch than the run's")
			_, err = runs.RecordSandbox(ctx, "absent", 1, "sb-x")
			cfIs(t, err, contract.ErrUnknownRun, "RecordSandbox of an unknown run")
			done := fxFinish(t, runs, fxTenant, "r", 1, contract.StatusFailed)
			_, err = runs.RecordSandbox(ctx, "r", 1, "sb-x")
			cfIs(t, err, contract.ErrTerminalRun, "RecordSandbox of a failed run")
			fxWant(t, runs, fxTenant, "r", &done, "after the refusals")
		}},

		// The launch deadline (docs/design.md §4.2).
		{"launchBy is stored by CreateClaimed, kept by heartbeats, conditions a claim and is removed by ClearLaunch", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			in := fxInput("r")
			in.LaunchBy = fxLease - 1_000
			got, _, err := runs.CreateClaimed(ctx, in)
			cfNoErr(t, err, "CreateClaimed with launchBy")
			want := fxFresh("r")
			want.LaunchBy = in.LaunchBy
			if !fxEqual(got, want) {
				t.Fatalf("CreateClaimed = %s, want %s", cfJSON(got), cfJSON(want))
			}
			fxWant(t, runs, fxTenant, "r", &want, "after CreateClaimed")
			if at, _ := contract.ReclaimAt(want, contract.DefaultDriverLease); at != in.LaunchBy {
				t.Fatalf("ReclaimAt = %d, want the earlier launchBy %d", at, in.LaunchBy)
			}
			hb, err := runs.Heartbeat(ctx, "r", 1, fxLease+60_000)
			cfNoErr(t, err, "Heartbeat")
			if hb.LaunchBy != in.LaunchBy {
				t.Fatalf("Heartbeat moved launchBy to %d", hb.LaunchBy)
			}
			other := in.LaunchBy + 1
			_, err = runs.Claim(ctx, "r", contract.Claim{Token: "c1", LeaseUntil: fxLease, If: contract.ClaimCond{LaunchBy: &other}})
			cfIs(t, err, contract.ErrConflict, "Claim on another launchBy")
			lb := in.LaunchBy
			cl, err := runs.Claim(ctx, "r", contract.Claim{Token: "c2", LeaseUntil: fxLease, If: contract.ClaimCond{LaunchBy: &lb}})
			cfNoErr(t, err, "Claim on the launchBy as read")
			if cl.Epoch() != 2 || cl.LaunchBy != lb {
				t.Fatalf("Claim = %s, want epoch 2 keeping launchBy", cfJSON(cl))
			}
			cleared, err := runs.ClearLaunch(ctx, "r")
			cfNoErr(t, err, "ClearLaunch")
			if cleared.LaunchBy != 0 || cleared.Epoch() != 2 {
				t.Fatalf("ClearLaunch = %s, want no launchBy at epoch 2", cfJSON(cleared))
			}
			fxReturned(t, runs, fxTenant, cleared, "ClearLaunch")
			again, err := runs.ClearLaunch(ctx, "r")
			cfNoErr(t, err, "repeated ClearLaunch")
			if !fxEqual(again, cleared) {
				t.Fatalf("repeated ClearLaunch = %s, want %s", cfJSON(again), cfJSON(cleared))
			}
			_, err = runs.Claim(ctx, "r", contract.Claim{Token: "c3", LeaseUntil: fxLease, If: contract.ClaimCond{LaunchBy: &lb}})
			cfIs(t, err, contract.ErrConflict, "Claim on a launchBy cleared since")
			_, err = runs.ClearLaunch(ctx, "absent")
			cfIs(t, err, contract.ErrUnknownRun, "ClearLaunch of an unknown run")
			in2 := fxInput("r2")
			in2.LaunchBy = fxLease
			_, _, err = runs.CreateClaimed(ctx, in2)
			cfNoErr(t, err, "CreateClaimed r2")
			done := fxFinish(t, runs, fxTenant, "r2", 1, contract.StatusFailed)
			end, err := runs.ClearLaunch(ctx, "r2")
			cfNoErr(t, err, "ClearLaunch of a terminal run")
			if !fxEqual(end, done) {
				t.Fatalf("ClearLaunch of a terminal run = %s, want it unchanged %s", cfJSON(end), cfJSON(done))
			}
		}},

		// Heartbeat.
		{"Heartbeat extends the lease under the fence", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			want := fxCreate(t, runs, fxTenant, "r")
			got, err := runs.Heartbeat(ctx, "r", 1, 121_000)
			cfNoErr(t, err, "Heartbeat")
			want.LeaseUntil = 121_000
			if !fxEqual(got, want) {
				t.Fatalf("Heartbeat = %s, want %s", cfJSON(got), cfJSON(want))
			}
			fxReturned(t, runs, fxTenant, got, "Heartbeat")
			again, err := runs.Heartbeat(ctx, "r", 1, 121_000)
			cfNoErr(t, err, "retried Heartbeat")
			if !fxEqual(again, want) {
				t.Fatalf("retried Heartbeat = %s, want %s", cfJSON(again), cfJSON(want))
			}
			_, err = runs.Heartbeat(ctx, "r", 2, 200_000)
			cfIs(t, err, contract.ErrSuperseded, "Heartbeat at a wrong epoch")
			_, err = runs.Heartbeat(ctx, "absent", 1, 200_000)
			cfIs(t, err, contract.ErrUnknownRun, "Heartbeat of an unknown run")
			done := fxFinish(t, runs, fxTenant, "r", 1, contract.StatusAborted)
			_, err = runs.Heartbeat(ctx, "r", 1, 200_000)
			cfIs(t, err, contract.ErrTerminalRun, "Heartbeat of an aborted run")
			fxWant(t, runs, fxTenant, "r", &done, "after the refusals")
		}},
		{"Heartbeat undoes a lapse", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			want := fxCreate(t, runs, fxTenant, "r")
			cfNoErr(t, runs.Lapse(ctx, "r", 1, fxLease), "Lapse")
			if st := fxState(t, runs, fxTenant, "r"); st == nil || !st.Lapsed || st.DetachedSince == nil || *st.DetachedSince != fxLease {
				t.Fatalf("after Lapse: %s", cfJSON(st))
			}
			got, err := runs.Heartbeat(ctx, "r", 1, 200_000)
			cfNoErr(t, err, "Heartbeat of a lapsed run")
			want.LeaseUntil = 200_000
			if !fxEqual(got, want) {
				t.Fatalf("Heartbeat of a lapsed run = %s, want %s (lapse and its detachedSince removed)", cfJSON(got), cfJSON(want))
			}
			fxReturned(t, runs, fxTenant, got, "Heartbeat")
			rsReclaimableEventually(t, b, fxTenant, 1<<40, 0, nil, "the un-lapsed run is not reclaimable")
		}},
		{"Heartbeat never removes an explicit detach", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			fxCreate(t, runs, fxTenant, "r")
			want := fxDetach(t, runs, fxTenant, "r", 1, 5000)
			got, err := runs.Heartbeat(ctxFor(t, fxTenant), "r", 1, 200_000)
			cfNoErr(t, err, "Heartbeat of a detached run")
			want.LeaseUntil = 200_000
			if !fxEqual(got, want) {
				t.Fatalf("Heartbeat of a detached run = %s, want %s (detachedSince kept)", cfJSON(got), cfJSON(want))
			}
			fxReturned(t, runs, fxTenant, got, "Heartbeat")
		}},

		// Detach.
		{"Detach stamps detachedSince and sandboxKey", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "r", "t", fxStart)
			claimed := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c", LeaseUntil: fxLease})
			got, err := runs.Detach(ctx, "r", 1, "sk_b", 5000)
			cfNoErr(t, err, "Detach")
			want := claimed
			want.DetachedSince, want.SandboxKey = cfPtr[int64](5000), cfPtr("sk_b")
			if !fxEqual(got, want) {
				t.Fatalf("Detach = %s, want %s", cfJSON(got), cfJSON(want))
			}
			fxReturned(t, runs, fxTenant, got, "Detach")
			again, err := runs.Detach(ctx, "r", 1, "sk_b", 5000)
			cfNoErr(t, err, "retried Detach")
			if !fxEqual(again, want) {
				t.Fatalf("retried Detach = %s, want %s", cfJSON(again), cfJSON(want))
			}
			rsReclaimableEventually(t, b, fxTenant, 5000, 0, []string{"r"}, "the detached run is reclaimable at its detachedSince")
		}},
		{"Detach with an empty key keeps the stamped sandboxKey", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			fxCreate(t, runs, fxTenant, "r")
			before, err := runs.State(ctx, "r")
			cfNoErr(t, err, "State")
			if before == nil || before.SandboxKey == nil {
				t.Fatalf("created run has no sandboxKey: %s", cfJSON(before))
			}
			got, err := runs.Detach(ctx, "r", 1, "", 5000)
			cfNoErr(t, err, "Detach with an empty key")
			if got.SandboxKey == nil || *got.SandboxKey != *before.SandboxKey || got.DetachedSince == nil || *got.DetachedSince != 5000 {
				t.Fatalf("Detach(\"\") = %s, want detachedSince 5000 and sandboxKey %q kept", cfJSON(got), *before.SandboxKey)
			}
			fxReturned(t, runs, fxTenant, got, "Detach")
		}},
		{"a repeated Detach never pushes detachedSince back", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			fxCreate(t, runs, fxTenant, "r")
			first := fxDetach(t, runs, fxTenant, "r", 1, 5000)
			again := fxDetach(t, runs, fxTenant, "r", 1, 9000)
			if !fxEqual(again, first) {
				t.Fatalf("repeated Detach = %s, want %s (first detachedSince wins)", cfJSON(again), cfJSON(first))
			}
			rsReclaimableEventually(t, b, fxTenant, 5000+100, 100, []string{"r"}, "expiry counts from the first detach")
			fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "attach", LeaseUntil: 80_000, ClearDetached: true})
			if got := fxDetach(t, runs, fxTenant, "r", 2, 12_000); got.DetachedSince == nil || *got.DetachedSince != 12_000 {
				t.Fatalf("Detach after a re-attach = %s, want detachedSince 12000", cfJSON(got))
			}
		}},
		{"Detach is fenced", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			want := fxCreate(t, runs, fxTenant, "r")
			_, err := runs.Detach(ctx, "r", 2, fxKey, 5000)
			cfIs(t, err, contract.ErrSuperseded, "Detach at a wrong epoch")
			fxWant(t, runs, fxTenant, "r", &want, "after the refused detach")
			_, err = runs.Detach(ctx, "absent", 1, fxKey, 5000)
			cfIs(t, err, contract.ErrUnknownRun, "Detach of an unknown run")
			done := fxFinish(t, runs, fxTenant, "r", 1, contract.StatusCompleted)
			_, err = runs.Detach(ctx, "r", 1, fxKey, 5000)
			cfIs(t, err, contract.ErrTerminalRun, "Detach of a completed run")
			fxWant(t, runs, fxTenant, "r", &done, "after the refused detach")
		}},

		// Lapse.
		{"Lapse stamps detachedSince from the lease and marks the run lapsed", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			want := fxCreate(t, runs, fxTenant, "r")
			cfNoErr(t, runs.Lapse(ctxFor(t, fxTenant), "r", 1, fxLease), "Lapse")
			want.DetachedSince, want.Lapsed = cfPtr[int64](fxLease), true
			fxWant(t, runs, fxTenant, "r", &want, "after Lapse")
			rsReclaimableEventually(t, b, fxTenant, fxLease, 0, []string{"r"}, "the lapsed run is reclaimable from its lease end")
		}},
		{"Lapse refuses a changed epoch, a changed lease and an existing detachedSince", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			want := fxCreate(t, runs, fxTenant, "r")
			cfIs(t, runs.Lapse(ctx, "r", 2, fxLease), contract.ErrConflict, "Lapse at another epoch")
			cfIs(t, runs.Lapse(ctx, "r", 1, fxLease-1), contract.ErrConflict, "Lapse with another leaseUntil")
			fxWant(t, runs, fxTenant, "r", &want, "after the refusals")
			// The driver heartbeats between the reaper's read and its lapse.
			hb, err := runs.Heartbeat(ctx, "r", 1, 200_000)
			cfNoErr(t, err, "Heartbeat")
			cfIs(t, runs.Lapse(ctx, "r", 1, fxLease), contract.ErrConflict, "Lapse with the lease read before a heartbeat")
			fxWant(t, runs, fxTenant, "r", &hb, "after the stale lapse")
			det := fxDetach(t, runs, fxTenant, "r", 1, 5000)
			cfIs(t, runs.Lapse(ctx, "r", 1, 200_000), contract.ErrConflict, "Lapse of an explicitly detached run")
			fxWant(t, runs, fxTenant, "r", &det, "the explicit detach after the refused lapse")
		}},

		// RequestCancel.
		{"RequestCancel sets a sticky cancelRequested", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			want := fxCreate(t, runs, fxTenant, "r")
			got, err := runs.RequestCancel(ctx, "r")
			cfNoErr(t, err, "RequestCancel")
			want.CancelRequested = cfPtr(true)
			if !fxEqual(got, want) {
				t.Fatalf("RequestCancel = %s, want %s (no status change)", cfJSON(got), cfJSON(want))
			}
			fxReturned(t, runs, fxTenant, got, "RequestCancel")
			got, err = runs.RequestCancel(ctx, "r")
			cfNoErr(t, err, "repeated RequestCancel")
			if !fxEqual(got, want) {
				t.Fatalf("repeated RequestCancel = %s, want %s", cfJSON(got), cfJSON(want))
			}
			c := fxClaim(t, runs, fxTenant, "r", contract.Claim{Token: "c", LeaseUntil: 90_000, ClearDetached: true})
			hb, err := runs.Heartbeat(ctx, "r", 2, 95_000)
			cfNoErr(t, err, "Heartbeat")
			up, err := runs.UpdateFenced(ctx, "r", 2, contract.RunPatch{Usage: contract.Set(json.RawMessage(`{"a":1}`))})
			cfNoErr(t, err, "UpdateFenced")
			det := fxDetach(t, runs, fxTenant, "r", 2, 5000)
			for name, s := range map[string]contract.RunState{"Claim": c, "Heartbeat": hb, "UpdateFenced": up, "Detach": det} {
				if !s.Cancelled() {
					t.Fatalf("cancelRequested lost by %s: %s", name, cfJSON(s))
				}
			}
		}},
		{"RequestCancel leaves a terminal run unchanged and refuses an unknown one", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			fxCreate(t, runs, fxTenant, "r")
			done := fxFinish(t, runs, fxTenant, "r", 1, contract.StatusCompleted)
			got, err := runs.RequestCancel(ctx, "r")
			cfNoErr(t, err, "RequestCancel of a completed run")
			if !fxEqual(got, done) || got.Cancelled() {
				t.Fatalf("RequestCancel of a completed run = %s, want it unchanged %s", cfJSON(got), cfJSON(done))
			}
			fxWant(t, runs, fxTenant, "r", &done, "the completed run after RequestCancel")
			_, err = runs.RequestCancel(ctx, "absent")
			cfIs(t, err, contract.ErrUnknownRun, "RequestCancel of an unknown run")
			fxWant(t, runs, fxTenant, "absent", nil, "a refused cancel creates nothing")
		}},

		// The in-use index.
		{"RunsUsingKey lists the non-terminal runs stamped with the key", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			fxCreate(t, runs, fxTenant, "r1")
			fxCreate(t, runs, fxTenant, "r2")
			in := fxInput("r3")
			in.SandboxKey = "sk_other"
			_, _, err := runs.CreateClaimed(ctx, in)
			cfNoErr(t, err, "CreateClaimed r3")
			rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "r4", "t", fxStart) // stamped by a plain Update
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r4", contract.RunPatch{SandboxKey: contract.Set(fxKey)})
			fxCreate(t, runs, fxTenant, "r5") // paused: still non-terminal
			_, err = runs.UpdateFenced(ctx, "r5", 1, contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)})
			cfNoErr(t, err, "interrupt r5")
			rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "r6", "t", fxStart) // detached by the fenced Detach after a claim
			fxClaim(t, runs, fxTenant, "r6", contract.Claim{Token: "c", LeaseUntil: fxLease})
			fxDetach(t, runs, fxTenant, "r6", 1, 5000)
			fxUsingKeyEventually(t, b, fxTenant, fxKey, []string{"r1", "r2", "r4", "r5", "r6"}, "runs using sk_a")
			fxUsingKeyEventually(t, b, fxTenant, "sk_other", []string{"r3"}, "runs using sk_other")
			fxCreate(t, runs, "tenant-b", "rb")
			fxUsingKeyEventually(t, b, "tenant-b", fxKey, []string{"rb"}, "B's runs using sk_a")
			fxFinish(t, runs, fxTenant, "r1", 1, contract.StatusCompleted)
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r4", contract.RunPatch{Status: contract.Set(contract.StatusFailed)})
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r2", contract.RunPatch{SandboxKey: contract.Clear[string]()})
			fxUsingKeyEventually(t, b, fxTenant, fxKey, []string{"r5", "r6"}, "terminal and unstamped runs drop out")
			fxUsingKeyEventually(t, b, fxTenant, "sk_unused", nil, "an unused key")
		}},

		// Helper maintenance through the plain reference writes.
		{"a run made terminal by plain Update leaves RunsUsingKey and the reclaim candidates", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			src := rpSource(t, b)
			st := fxCreate(t, runs, fxTenant, "r")
			fxUsingKeyEventually(t, b, fxTenant, fxKey, []string{"r"}, "the run uses its key")
			rpCandidatesEventually(t, b, src, rpCandidate(fxTenant, st).ReclaimAt, []contract.Candidate{rpCandidate(fxTenant, st)}, "the leased run is a candidate at its lease end's reclaimAt")
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r", contract.RunPatch{Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set[int64](9000)})
			fxUsingKeyEventually(t, b, fxTenant, fxKey, nil, "the completed run left the in-use index")
			rpCandidatesEventually(t, b, src, 1<<40, nil, "the completed run left the candidates")
		}},
		{"a run detached by plain Update is reclaimable and a candidate at its detachedSince", func(t *testing.T, b contract.Backend) {
			src := rpSource(t, b)
			rec := rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "r", "t", fxStart)
			rpCandidatesEventually(t, b, src, 1<<40, []contract.Candidate{rpCandidate(fxTenant, contract.RunState{RunRecord: rec})},
				"an unleased run is a candidate at startedAt + driver lease")
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r", contract.RunPatch{DetachedSince: contract.Set[int64](2000), SandboxKey: contract.Set(fxKey)})
			rsReclaimableEventually(t, b, fxTenant, 2000, 0, []string{"r"}, "ListReclaimable after a plain detach")
			rpCandidatesEventually(t, b, src, 2000, []contract.Candidate{{Tenant: fxTenant, RunID: "r", ReclaimAt: 2000}}, "candidate at its detachedSince")
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r", contract.RunPatch{CancelRequested: contract.Set(true)})
			rpCandidatesEventually(t, b, src, 0, []contract.Candidate{{Tenant: fxTenant, RunID: "r", ReclaimAt: 0}}, "a cancel by plain Update moves it to 0")
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r", contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)})
			rpCandidatesEventually(t, b, src, 1<<40, nil, "an interrupted run is no candidate")
			rsReclaimableEventually(t, b, fxTenant, 1<<40, 0, nil, "an interrupted run is not reclaimable")
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "r", contract.RunPatch{Status: contract.Set(contract.StatusRunning)})
			rpCandidatesEventually(t, b, src, 0, []contract.Candidate{{Tenant: fxTenant, RunID: "r", ReclaimAt: 0}}, "running again, cancelled: back at 0")
		}},
		{"CreateOrResume of an existing run leaves its index entries intact", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			src := rpSource(t, b)
			st := fxCreate(t, runs, fxTenant, "r")
			_, err := refstore.Runs(b.Runs()).CreateOrResume(ctxFor(t, fxTenant), contract.NewRun{RunID: "r", ThreadID: "t-other", StartedAt: 1})
			cfNoErr(t, err, "CreateOrResume of the existing run")
			fxWant(t, runs, fxTenant, "r", &st, "after CreateOrResume")
			fxUsingKeyEventually(t, b, fxTenant, fxKey, []string{"r"}, "still using its key")
			rpCandidatesEventually(t, b, src, 1<<40, []contract.Candidate{rpCandidate(fxTenant, st)}, "still a candidate at its lease end")
			rsActiveEventually(t, b, fxTenant, "t", &st.RunRecord, "still the active run of its own thread")
			rsActiveEventually(t, b, fxTenant, "t-other", nil, "not the active run of the thread passed on resume")
		}},

		// Tenancy.
		{"fenced primitives are tenant-scoped", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			a := fxCreate(t, runs, "tenant-a", "r")
			in := fxInput("r")
			in.Token, in.LeaseUntil = "create-b", 99_000
			bst, created, err := runs.CreateClaimed(ctxFor(t, "tenant-b"), in)
			cfNoErr(t, err, "CreateClaimed in B")
			if !created || bst.Epoch() != 1 || bst.LeaseUntil != 99_000 {
				t.Fatalf("CreateClaimed in B = (%s, %v); want B's own run", cfJSON(bst), created)
			}
			fxClaim(t, runs, "tenant-b", "r", contract.Claim{Token: "c", LeaseUntil: 1})
			_, err = runs.RequestCancel(ctxFor(t, "tenant-b"), "r")
			cfNoErr(t, err, "RequestCancel in B")
			fxWant(t, runs, "tenant-a", "r", &a, "A after B claimed and cancelled its own r")
			ctxC := ctxFor(t, "tenant-c")
			_, err = runs.Claim(ctxC, "r", contract.Claim{Token: "c", LeaseUntil: 1})
			cfIs(t, err, contract.ErrUnknownRun, "Claim in C")
			_, err = runs.RequestCancel(ctxC, "r")
			cfIs(t, err, contract.ErrUnknownRun, "RequestCancel in C")
			_, err = runs.UpdateFenced(ctxC, "r", 1, contract.RunPatch{Status: contract.Set(contract.StatusAborted)})
			cfIs(t, err, contract.ErrUnknownRun, "UpdateFenced in C")
			_, err = runs.Heartbeat(ctxC, "r", 1, 5)
			cfIs(t, err, contract.ErrUnknownRun, "Heartbeat in C")
			_, err = runs.Detach(ctxC, "r", 1, fxKey, 5)
			cfIs(t, err, contract.ErrUnknownRun, "Detach in C")
			fxWant(t, runs, "tenant-c", "r", nil, "C after its refused writes")
			fxWant(t, runs, "tenant-a", "r", &a, "A after C's refused writes")
		}},
		{"fenced primitives reject an invalid tenant", func(t *testing.T, b contract.Backend) {
			runs := fxRuns(t, b)
			for _, bad := range cfBadTenants() {
				ctx := ctxFor(t, bad)
				_, err := runs.State(ctx, "r")
				cfIs(t, err, contract.ErrInvalid, "State under "+bad)
				_, _, err = runs.CreateClaimed(ctx, fxInput("r"))
				cfIs(t, err, contract.ErrInvalid, "CreateClaimed under "+bad)
				_, err = runs.Claim(ctx, "r", contract.Claim{Token: "c", LeaseUntil: 1})
				cfIs(t, err, contract.ErrInvalid, "Claim under "+bad)
				_, err = runs.UpdateFenced(ctx, "r", 1, contract.RunPatch{Status: contract.Set(contract.StatusAborted)})
				cfIs(t, err, contract.ErrInvalid, "UpdateFenced under "+bad)
				_, err = runs.RecordSandbox(ctx, "r", 1, "sb")
				cfIs(t, err, contract.ErrInvalid, "RecordSandbox under "+bad)
				_, err = runs.Heartbeat(ctx, "r", 1, 5)
				cfIs(t, err, contract.ErrInvalid, "Heartbeat under "+bad)
				_, err = runs.Detach(ctx, "r", 1, fxKey, 5)
				cfIs(t, err, contract.ErrInvalid, "Detach under "+bad)
				cfIs(t, runs.Lapse(ctx, "r", 1, 5), contract.ErrInvalid, "Lapse under "+bad)
				_, err = runs.RequestCancel(ctx, "r")
				cfIs(t, err, contract.ErrInvalid, "RequestCancel under "+bad)
				_, err = runs.RunsUsingKey(ctx, fxKey)
				cfIs(t, err, contract.ErrInvalid, "RunsUsingKey under "+bad)
			}
		}},
	}
}
