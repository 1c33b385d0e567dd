package testkit

import (
	"errors"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// RunAppDrivenConformance proves the app-driven mark (docs/design.md §2.2): a run the
// reference run store creates with NewRun.AppDriven keeps the mark for good, no claim
// takes it, CreateOrResume refuses a run of the other kind, and the reclaim index holds it
// only while detached (at detachedSince), where ListReclaimable finds it.
func RunAppDrivenConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	const tenant = "testkit.appdriven"
	cfRunCases(t, newBackend, []cfCase{
		{"an app-driven run keeps its mark through updates and is refused to every claim", func(t *testing.T, b contract.Backend) {
			ctx := ctxFor(t, tenant)
			rs := refstore.Runs(b.Runs())
			rec, err := rs.CreateOrResume(ctx, contract.NewRun{RunID: "app", ThreadID: "t", StartedAt: 1, AppDriven: true})
			cfNoErr(t, err, "CreateOrResume(AppDriven)")
			if rec.Status != contract.StatusRunning || rec.DriverEpoch != nil {
				t.Fatalf("created %+v", rec)
			}
			cfNoErr(t, rs.Update(ctx, "app", contract.RunPatch{DetachedSince: contract.Set[int64](5), DriverEpoch: contract.Set[int64](3)}), "Update")
			st, err := b.Runs().State(ctx, "app")
			cfNoErr(t, err, "State")
			if st == nil || !st.AppDriven || st.Epoch() != 3 {
				t.Fatalf("State after Update: %+v, want app-driven at epoch 3", st)
			}
			for _, c := range []contract.Claim{
				{Token: "c1", LeaseUntil: 10},
				{Token: "c2", LeaseUntil: 10, ClearDetached: true},
				{LeaseUntil: 10, If: contract.ClaimCond{Cutoff: cfPtr[int64](100)}},
				{LeaseUntil: 10, If: contract.ClaimCond{DetachedSince: cfPtr[int64](5)}},
			} {
				_, err := b.Runs().Claim(ctx, "app", c)
				cfIs(t, err, contract.ErrAppDriven, "Claim of an app-driven run")
			}
			after, err := b.Runs().State(ctx, "app")
			cfNoErr(t, err, "State")
			if after.Epoch() != 3 || after.DetachedSince == nil || *after.DetachedSince != 5 || after.LeaseUntil != 0 {
				t.Fatalf("refused claims changed the run: %+v", after)
			}
		}},
		{"CreateOrResume refuses a run of the other kind and resumes its own unchanged", func(t *testing.T, b contract.Backend) {
			ctx := ctxFor(t, tenant)
			rs := refstore.Runs(b.Runs())
			_, err := rs.CreateOrResume(ctx, contract.NewRun{RunID: "app", ThreadID: "t", StartedAt: 1, AppDriven: true})
			cfNoErr(t, err, "create app-driven")
			again, err := rs.CreateOrResume(ctx, contract.NewRun{RunID: "app", ThreadID: "x", StartedAt: 9, AppDriven: true})
			cfNoErr(t, err, "resume app-driven")
			if again.ThreadID != "t" || again.StartedAt != 1 {
				t.Fatalf("resume changed the run: %+v", again)
			}
			_, err = rs.CreateOrResume(ctx, contract.NewRun{RunID: "app", ThreadID: "t", StartedAt: 1})
			cfIs(t, err, contract.ErrAppDriven, "CreateOrResume of an app-driven run by a sandkeep caller")
			_, _, err = b.Runs().CreateClaimed(ctx, contract.CreateClaimedRun{NewRun: contract.NewRun{RunID: "sk", ThreadID: "t", StartedAt: 1},
				SandboxKey: "k", LeaseUntil: 10, Token: "tok"})
			cfNoErr(t, err, "CreateClaimed")
			_, err = rs.CreateOrResume(ctx, contract.NewRun{RunID: "sk", ThreadID: "t", StartedAt: 1, AppDriven: true})
			cfIs(t, err, contract.ErrSandkeepDriven, "CreateOrResume(AppDriven) of a sandkeep-driven run")
			st, err := b.Runs().State(ctx, "sk")
			cfNoErr(t, err, "State")
			if st == nil || st.AppDriven || st.Epoch() != 1 {
				t.Fatalf("sandkeep's run after the refusal: %+v", st)
			}
		}},
		{"the reclaim index holds an app-driven run only while detached, at detachedSince", func(t *testing.T, b contract.Backend) {
			ctx := ctxFor(t, tenant)
			rs := refstore.Runs(b.Runs())
			_, err := rs.CreateOrResume(ctx, contract.NewRun{RunID: "app", ThreadID: "t", StartedAt: 1, AppDriven: true})
			cfNoErr(t, err, "create")
			_, err = b.Runs().RequestCancel(ctx, "app") // sandkeep's cancel route may reach it
			cfNoErr(t, err, "RequestCancel")
			far := int64(1) << 50
			candidates := func() (map[string]bool, error) {
				cs, err := b.Reaper().ReclaimCandidates(t.Context(), far, 1000)
				out := map[string]bool{}
				for _, c := range cs {
					if c.Tenant == tenant {
						out[c.RunID] = true
					}
				}
				return out, err
			}
			// Attached (and even cancelled): never a candidate. Checked after a write that
			// indexes a detached run, so a lagging index has caught up past it.
			cfNoErr(t, rs.Update(ctx, "app", contract.RunPatch{SandboxKey: contract.Set("k")}), "Update")
			_, err = rs.CreateOrResume(ctx, contract.NewRun{RunID: "probe", ThreadID: "t", StartedAt: 1, AppDriven: true})
			cfNoErr(t, err, "create probe")
			cfNoErr(t, rs.Update(ctx, "probe", contract.RunPatch{DetachedSince: contract.Set[int64](7)}), "detach probe")
			cfEventually(t, b, "the detached probe listed, the attached run not", func() (bool, string, error) {
				got, err := candidates()
				return got["probe"] && !got["app"], cfJSON(got), err
			})
			cfNoErr(t, rs.Update(ctx, "app", contract.RunPatch{DetachedSince: contract.Set[int64](50)}), "detach")
			cfEventually(t, b, "ListReclaimable lists the detached app-driven run", func() (bool, string, error) {
				got, err := rs.ListReclaimable(ctx, 50, 0)
				return len(got) == 2 && got[0].RunID == "probe" && got[1].RunID == "app", cfJSON(got), err
			})
			cfEventually(t, b, "the reclaim index holds it at detachedSince", func() (bool, string, error) {
				cs, err := b.Reaper().ReclaimCandidates(t.Context(), 49, 1000)
				for _, c := range cs {
					if c.Tenant == tenant && c.RunID == "app" {
						return false, cfJSON(cs), err // indexed before its detachedSince
					}
				}
				got, err2 := candidates()
				return got["app"], cfJSON(got), errors.Join(err, err2)
			})
		}},
	})
}

// RunLeaseLocksConformance proves contract.LeaseLocks (docs/design.md §2.3), the lease
// WithLock holds one step at a time: one owner per key and tenant, a fence that grows,
// renew and release only by the owner, release idempotent, an expired lease taken over.
// A backend without it is reported by name.
func RunLeaseLocksConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	const tenant = "testkit.leaselocks"
	b := fresh(t, newBackend, Options{Lock: lkLeaseTiming, DriverLease: cfDriverLease * time.Millisecond})
	ll, ok := b.Locks().(contract.LeaseLocks)
	if !ok {
		t.Fatalf("the backend's Locks() lacks sandbox.LeaseLocks (the lock routes need it)")
	}
	ctx := ctxFor(t, tenant)
	if tm := ll.Timing(); tm != lkLeaseTiming {
		t.Fatalf("Timing() = %+v, want the configured %+v", tm, lkLeaseTiming)
	}
	f1, ok, err := ll.TryAcquire(ctx, "k", "owner-a")
	cfNoErr(t, err, "TryAcquire a")
	if !ok || f1 < 1 {
		t.Fatalf("first TryAcquire: fence %d ok %v", f1, ok)
	}
	if f, ok, err := ll.TryAcquire(ctx, "k", "owner-a"); err != nil || !ok || f <= f1 {
		t.Fatalf("the owner's repeated TryAcquire (a retried attempt): fence %d ok %v %v, want > %d", f, ok, err, f1)
	}
	if _, ok, err := ll.TryAcquire(ctx, "k", "owner-b"); err != nil || ok {
		t.Fatalf("TryAcquire by another owner while held: ok %v %v", ok, err)
	}
	if _, ok, err := ll.TryAcquire(ctxFor(t, tenant+".other"), "k", "owner-b"); err != nil || !ok {
		t.Fatalf("another tenant's same key: ok %v %v", ok, err)
	}
	if ok, err := ll.Renew(ctx, "k", "owner-a"); err != nil || !ok {
		t.Fatalf("the owner's Renew: %v %v", ok, err)
	}
	if ok, err := ll.Renew(ctx, "k", "owner-b"); err != nil || ok {
		t.Fatalf("a stranger's Renew: %v %v", ok, err)
	}
	cfNoErr(t, ll.Release(ctx, "k", "owner-b"), "a stranger's Release")
	if _, ok, _ := ll.TryAcquire(ctx, "k", "owner-b"); ok {
		t.Fatal("a stranger's Release freed the lease")
	}
	cfNoErr(t, ll.Release(ctx, "k", "owner-a"), "Release")
	cfNoErr(t, ll.Release(ctx, "k", "owner-a"), "repeated Release")
	if ok, err := ll.Renew(ctx, "k", "owner-a"); err != nil || ok {
		t.Fatalf("Renew after Release: %v %v", ok, err)
	}
	f2, ok, err := ll.TryAcquire(ctx, "k", "owner-b")
	if err != nil || !ok || f2 <= f1 {
		t.Fatalf("TryAcquire after Release: fence %d ok %v %v", f2, ok, err)
	}
	// owner-b stops renewing: past lease + skew its lease is taken, with a greater fence.
	deadline := time.Now().Add(lkLeaseTiming.Lease + lkLeaseTiming.Skew + lkWait)
	for {
		f3, ok, err := ll.TryAcquire(ctx, "k", "owner-c")
		cfNoErr(t, err, "TryAcquire c")
		if ok {
			if f3 <= f2 {
				t.Fatalf("takeover fence %d, want > %d", f3, f2)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an expired lease was never taken over")
		}
		time.Sleep(20 * time.Millisecond) // no signal exists for a lease's expiry
	}
	if ok, err := ll.Renew(ctx, "k", "owner-b"); err != nil || ok {
		t.Fatalf("the expired owner's Renew after a takeover: %v %v", ok, err)
	}
	for _, bad := range []string{"", "a b", string(make([]byte, contract.MaxOwnerLen+1))} {
		_, _, err := ll.TryAcquire(ctx, "k", bad)
		cfIs(t, err, contract.ErrInvalid, "TryAcquire with owner "+bad)
	}
}
