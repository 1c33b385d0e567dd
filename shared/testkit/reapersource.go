package testkit

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// RunReaperSourceConformance proves the reaper's cross-tenant discovery (docs/design.md §2.7): reclaim
// candidates with their tenants, reclaimAt order with cancelled runs first, no terminal or
// interrupted runs, pending reclaims, idle instances and stale intents. Every assertion on an
// index polls with a deadline, and one case proves the suite never trusts a hit without
// re-reading its base record (backends may emulate index lag).
func RunReaperSourceConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, rpCases())
}

// rpLimit is the listing limit of cases that do not test limits.
const rpLimit = 1000

// rpSource returns the reaper source; fresh fails a case whose backend has none.
func rpSource(t *testing.T, b contract.Backend) contract.ReaperSource {
	t.Helper()
	return b.Reaper()
}

// rpCandidate is the candidate a run in state st must be listed as.
func rpCandidate(tenant string, st contract.RunState) contract.Candidate {
	at, _ := contract.ReclaimAt(st, cfDriverLease)
	return contract.Candidate{Tenant: tenant, RunID: st.RunID, ReclaimAt: at}
}

// rpCanon sorts refs by (order key, tenant, id) so ties, whose order no contract fixes,
// compare equal; it reports whether got was already ascending by the order key.
func rpCanon[T any](got []T, at func(T) int64, id func(T) string) ([]T, bool) {
	ascending := slices.IsSortedFunc(got, func(a, b T) int { return cmp.Compare(at(a), at(b)) })
	out := slices.Clone(got)
	slices.SortStableFunc(out, func(a, b T) int {
		return cmp.Or(cmp.Compare(at(a), at(b)), cmp.Compare(id(a), id(b)))
	})
	return out, ascending
}

// rpNoNudge drops the poller's own row from a global listing.
func rpNoNudge[T any](got []T, tenant func(T) string) []T {
	return slices.DeleteFunc(slices.Clone(got), func(v T) bool { return tenant(v) == cfNudgeTenant })
}

func rpCandAt(c contract.Candidate) int64  { return c.ReclaimAt }
func rpCandID(c contract.Candidate) string { return c.Tenant + "/" + c.RunID }
func rpCandTn(c contract.Candidate) string { return c.Tenant }
func rpInstAt(r contract.InstanceRef) int64 {
	return r.UpdatedAt
}
func rpInstID(r contract.InstanceRef) string { return r.Tenant + "/" + r.Key }
func rpInstTn(r contract.InstanceRef) string { return r.Tenant }
func rpIntAt(r contract.IntentRef) int64     { return r.CreatedAt }
func rpIntID(r contract.IntentRef) string    { return r.Tenant + "/" + r.Key }
func rpIntTn(r contract.IntentRef) string    { return r.Tenant }

// rpCandidatesEventually polls ReclaimCandidates(now) until it lists exactly want,
// ascending by reclaimAt (ties in any order).
func rpCandidatesEventually(t *testing.T, b contract.Backend, src contract.ReaperSource, now int64, want []contract.Candidate, what string) {
	t.Helper()
	rpCandidatesLimitEventually(t, b, src, now, rpLimit, want, what)
}

func rpCandidatesLimitEventually(t *testing.T, b contract.Backend, src contract.ReaperSource, now int64, limit int, want []contract.Candidate, what string) {
	t.Helper()
	want, _ = rpCanon(want, rpCandAt, rpCandID)
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := src.ReclaimCandidates(t.Context(), now, limit)
		if err != nil {
			return false, "", fmt.Errorf("ReclaimCandidates(%d, %d): %w", now, limit, err)
		}
		if len(got) > limit {
			return false, "", fmt.Errorf("ReclaimCandidates(%d, %d) returned %d hits", now, limit, len(got))
		}
		c, asc := rpCanon(rpNoNudge(got, rpCandTn), rpCandAt, rpCandID)
		return asc && slices.Equal(c, want), cfJSON(got), nil
	})
}

// rpPendingEventually polls PendingReclaims until it lists exactly want (any order).
func rpPendingEventually(t *testing.T, b contract.Backend, src contract.ReaperSource, limit int, want []contract.InstanceRef, what string) {
	t.Helper()
	want, _ = rpCanon(want, func(contract.InstanceRef) int64 { return 0 }, rpInstID)
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := src.PendingReclaims(t.Context(), limit)
		if err != nil {
			return false, "", fmt.Errorf("PendingReclaims(%d): %w", limit, err)
		}
		if len(got) > limit {
			return false, "", fmt.Errorf("PendingReclaims(%d) returned %d hits", limit, len(got))
		}
		c, _ := rpCanon(rpNoNudge(got, rpInstTn), func(contract.InstanceRef) int64 { return 0 }, rpInstID)
		return slices.Equal(c, want), cfJSON(got), nil
	})
}

// rpIdleEventually polls IdleInstances(before) until it lists exactly want, oldest first.
func rpIdleEventually(t *testing.T, b contract.Backend, src contract.ReaperSource, before int64, limit int, want []contract.InstanceRef, what string) {
	t.Helper()
	want, _ = rpCanon(want, rpInstAt, rpInstID)
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := src.IdleInstances(t.Context(), before, limit)
		if err != nil {
			return false, "", fmt.Errorf("IdleInstances(%d, %d): %w", before, limit, err)
		}
		if len(got) > limit {
			return false, "", fmt.Errorf("IdleInstances(%d, %d) returned %d hits", before, limit, len(got))
		}
		c, asc := rpCanon(rpNoNudge(got, rpInstTn), rpInstAt, rpInstID)
		return asc && slices.Equal(c, want), cfJSON(got), nil
	})
}

// rpStopEventually polls StopCandidates(before) until it lists exactly want, oldest first.
func rpStopEventually(t *testing.T, b contract.Backend, src contract.ReaperSource, before int64, limit int, want []contract.InstanceRef, what string) {
	t.Helper()
	want, _ = rpCanon(want, rpInstAt, rpInstID)
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := src.StopCandidates(t.Context(), before, limit)
		if err != nil {
			return false, "", fmt.Errorf("StopCandidates(%d, %d): %w", before, limit, err)
		}
		if len(got) > limit {
			return false, "", fmt.Errorf("StopCandidates(%d, %d) returned %d hits", before, limit, len(got))
		}
		c, asc := rpCanon(rpNoNudge(got, rpInstTn), rpInstAt, rpInstID)
		return asc && slices.Equal(c, want), cfJSON(got), nil
	})
}

// rpStaleEventually polls StaleIntents(before) until it lists exactly want, oldest first.
func rpStaleEventually(t *testing.T, b contract.Backend, src contract.ReaperSource, before int64, limit int, want []contract.IntentRef, what string) {
	t.Helper()
	want, _ = rpCanon(want, rpIntAt, rpIntID)
	cfEventually(t, b, what, func() (bool, string, error) {
		got, err := src.StaleIntents(t.Context(), before, limit)
		if err != nil {
			return false, "", fmt.Errorf("StaleIntents(%d, %d): %w", before, limit, err)
		}
		if len(got) > limit {
			return false, "", fmt.Errorf("StaleIntents(%d, %d) returned %d hits", before, limit, len(got))
		}
		c, asc := rpCanon(rpNoNudge(got, rpIntTn), rpIntAt, rpIntID)
		return asc && slices.Equal(c, want), cfJSON(got), nil
	})
}

// rpDetached creates run id in tenant holding epoch 1 and detaches it at since.
func rpDetached(t *testing.T, runs contract.FencedRuns, tenant, id string, since int64) contract.RunState {
	t.Helper()
	fxCreate(t, runs, tenant, id)
	return fxDetach(t, runs, tenant, id, 1, since)
}

// rpRow writes an instance row with updatedAt in tenant.
func rpRow(t *testing.T, b contract.Backend, tenant, key string, updatedAt int64) {
	t.Helper()
	rec := instBase(key)
	rec.UpdatedAt = updatedAt
	cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctxFor(t, tenant), rec), "Upsert "+tenant+"/"+key)
}

func rpCases() []cfCase {
	return []cfCase{
		{"ReclaimCandidates span tenants, each hit with its tenant", func(t *testing.T, b contract.Backend) {
			src, runs := rpSource(t, b), fxRuns(t, b)
			a := rpDetached(t, runs, "tenant-a", "r", 1000)
			bb := rpDetached(t, runs, "tenant-b", "r", 2000)
			e := rpDetached(t, runs, "", "r", 1500)
			rpCandidatesEventually(t, b, src, 5000, []contract.Candidate{
				rpCandidate("tenant-a", a), rpCandidate("", e), rpCandidate("tenant-b", bb),
			}, "candidates of three tenants")
			if c := rpCandidate("tenant-b", bb); c.ReclaimAt != 2000 {
				t.Fatalf("B's expected candidate %s; want reclaimAt = detachedSince 2000", cfJSON(c))
			}
		}},
		{"ReclaimCandidates list only reclaimAt <= now, inclusive", func(t *testing.T, b contract.Backend) {
			src, runs := rpSource(t, b), fxRuns(t, b)
			leased := fxCreate(t, runs, fxTenant, "leased") // reclaimAt = leaseUntil 61000 rounded up: 120000
			plainRec := rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "plain", "t", 3000)
			plain := contract.RunState{RunRecord: plainRec} // reclaimAt = startedAt + lease = 63000 rounded up: 120000
			det := rpDetached(t, runs, fxTenant, "det", 5000)
			fxCreate(t, runs, fxTenant, "lapsed")
			_, err := runs.Heartbeat(ctxFor(t, fxTenant), "lapsed", 1, 62_000)
			cfNoErr(t, err, "Heartbeat")
			cfNoErr(t, runs.Lapse(ctxFor(t, fxTenant), "lapsed", 1, 62_000), "Lapse") // reclaimAt = detachedSince 62000, as it is
			lapsed := *fxState(t, runs, fxTenant, "lapsed")
			cands := map[string]contract.Candidate{}
			for _, st := range []contract.RunState{leased, plain, det, lapsed} {
				cands[st.RunID] = rpCandidate(fxTenant, st)
			}
			const step = cfDriverLease // reclaimAt's step: the backend's driver lease
			if step != 60_000 || cands["leased"].ReclaimAt != 2*step || cands["plain"].ReclaimAt != 2*step || cands["det"].ReclaimAt != 5000 || cands["lapsed"].ReclaimAt != 62_000 {
				t.Fatalf("expected candidates %s do not follow contract.ReclaimAt's rules", cfJSON(cands))
			}
			rpCandidatesEventually(t, b, src, 4999, nil, "nothing before 5000")
			rpCandidatesEventually(t, b, src, 5000, []contract.Candidate{cands["det"]}, "at 5000")
			rpCandidatesEventually(t, b, src, fxLease, []contract.Candidate{cands["det"]}, "at the lease end, the lease's step not passed yet")
			rpCandidatesEventually(t, b, src, 62_000, []contract.Candidate{cands["det"], cands["lapsed"]}, "at the lapse")
			rpCandidatesEventually(t, b, src, 2*step-1, []contract.Candidate{cands["det"], cands["lapsed"]}, "before the step")
			rpCandidatesEventually(t, b, src, 2*step, []contract.Candidate{cands["det"], cands["lapsed"], cands["leased"], cands["plain"]}, "at the step both leases end in")
		}},
		{"a renewal within a step leaves reclaimAt unchanged; one past it moves it", func(t *testing.T, b contract.Backend) {
			src, runs := rpSource(t, b), fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			const step = cfDriverLease       // reclaimAt's step: the backend's driver lease
			fxCreate(t, runs, fxTenant, "r") // leaseUntil 61000: reclaimAt 120000
			at := func(st contract.RunState, lease int64, what string) {
				t.Helper()
				if st.LeaseUntil != lease {
					t.Fatalf("%s: leaseUntil %d, want %d", what, st.LeaseUntil, lease)
				}
				rpCandidatesEventually(t, b, src, 1<<40, []contract.Candidate{{Tenant: fxTenant, RunID: "r", ReclaimAt: contract.LeaseReclaimAt(lease, cfDriverLease)}}, what)
			}
			// Renewals inside one step, the last one short of the step's end, so a backend that
			// kept the exact lease would list the run before the step.
			for _, lease := range []int64{76_000, 2 * step, 91_000} {
				st, err := runs.Heartbeat(ctx, "r", 1, lease)
				cfNoErr(t, err, "Heartbeat")
				at(st, lease, fmt.Sprintf("renewed to %d: reclaimAt stays %d", lease, 2*step))
			}
			rpCandidatesEventually(t, b, src, 2*step-1, nil, "not a candidate before its step")
			st, err := runs.Heartbeat(ctx, "r", 1, 2*step+1) // past the step
			cfNoErr(t, err, "Heartbeat")
			at(st, 2*step+1, "renewed past the step: reclaimAt moves a step on")
			rpCandidatesEventually(t, b, src, 3*step-1, nil, "not a candidate before its new step")
			rpCandidatesEventually(t, b, src, 3*step, []contract.Candidate{{Tenant: fxTenant, RunID: "r", ReclaimAt: 3 * step}}, "a candidate once now reaches it")
			// A claim renews the lease by the same rule; a detach puts the run at its
			// detachedSince, as it is, and a heartbeat while detached leaves it there.
			st, err = runs.Claim(ctx, "r", contract.Claim{Token: "c2", LeaseUntil: 3*step + 5})
			cfNoErr(t, err, "Claim")
			at(st, 3*step+5, "claimed: reclaimAt is the new lease's step")
			fxDetach(t, runs, fxTenant, "r", 2, 150_001)
			_, err = runs.Heartbeat(ctx, "r", 2, 5*step+1)
			cfNoErr(t, err, "Heartbeat while detached")
			rpCandidatesEventually(t, b, src, 1<<40, []contract.Candidate{{Tenant: fxTenant, RunID: "r", ReclaimAt: 150_001}}, "detached: at its detachedSince, whatever the lease")
		}},
		{"ReclaimCandidates ascend by reclaimAt with cancelled runs first", func(t *testing.T, b contract.Backend) {
			src, runs := rpSource(t, b), fxRuns(t, b)
			late := rpDetached(t, runs, fxTenant, "det-late", 3000)
			early := rpDetached(t, runs, "tenant-b", "det-early", 1000)
			fxCreate(t, runs, fxTenant, "cancelled")
			c, err := runs.RequestCancel(ctxFor(t, fxTenant), "cancelled")
			cfNoErr(t, err, "RequestCancel")
			rpDetached(t, runs, fxTenant, "cancelled-detached", 2000)
			cd, err := runs.RequestCancel(ctxFor(t, fxTenant), "cancelled-detached")
			cfNoErr(t, err, "RequestCancel")
			if rpCandidate(fxTenant, c).ReclaimAt != 0 || rpCandidate(fxTenant, cd).ReclaimAt != 0 {
				t.Fatal("sandbox.ReclaimAt of a cancelled run is not 0")
			}
			rpCandidatesEventually(t, b, src, 5000, []contract.Candidate{
				rpCandidate(fxTenant, c), rpCandidate(fxTenant, cd), rpCandidate("tenant-b", early), rpCandidate(fxTenant, late),
			}, "cancelled first, then oldest")
			rpCandidatesEventually(t, b, src, 0, []contract.Candidate{rpCandidate(fxTenant, c), rpCandidate(fxTenant, cd)}, "at now = 0 only the cancelled")
		}},
		{"ReclaimCandidates never list terminal or interrupted runs", func(t *testing.T, b contract.Backend) {
			src, runs := rpSource(t, b), fxRuns(t, b)
			ctx := ctxFor(t, fxTenant)
			live := rpDetached(t, runs, fxTenant, "live", 1000)
			rpDetached(t, runs, fxTenant, "late", 1000)
			rpCandidatesEventually(t, b, src, 5000, []contract.Candidate{rpCandidate(fxTenant, live), {Tenant: fxTenant, RunID: "late", ReclaimAt: 1000}}, "both listed")
			rpDetached(t, runs, fxTenant, "done", 1000)
			fxFinish(t, runs, fxTenant, "done", 1, contract.StatusCompleted)
			rsCreate(t, refstore.Runs(b.Runs()), fxTenant, "failed", "t", 1)
			rsUpdate(t, refstore.Runs(b.Runs()), fxTenant, "failed", contract.RunPatch{Status: contract.Set(contract.StatusFailed), DetachedSince: contract.Set[int64](1000)})
			rpDetached(t, runs, fxTenant, "paused", 1000)
			_, err := runs.UpdateFenced(ctx, "paused", 1, contract.RunPatch{Status: contract.Set(contract.StatusInterrupted)})
			cfNoErr(t, err, "interrupt paused")
			rpDetached(t, runs, fxTenant, "cancelled-done", 1000)
			_, err = runs.RequestCancel(ctx, "cancelled-done")
			cfNoErr(t, err, "RequestCancel")
			fxFinish(t, runs, fxTenant, "cancelled-done", 1, contract.StatusAborted)
			fxFinish(t, runs, fxTenant, "late", 1, contract.StatusFailed) // seen, then finished
			rpCandidatesEventually(t, b, src, 1<<40, []contract.Candidate{rpCandidate(fxTenant, live)}, "only the running run")
		}},
		{"ReclaimCandidates honour the limit, oldest first", func(t *testing.T, b contract.Backend) {
			src, runs := rpSource(t, b), fxRuns(t, b)
			var all []contract.Candidate
			for i, since := range []int64{500, 100, 400, 200, 300} {
				all = append(all, rpCandidate(fxTenant, rpDetached(t, runs, fxTenant, fmt.Sprintf("r%d", i), since)))
			}
			all, _ = rpCanon(all, rpCandAt, rpCandID)
			rpCandidatesEventually(t, b, src, 5000, all, "all five")
			rpCandidatesLimitEventually(t, b, src, 5000, 2, all[:2], "the two oldest")
			rpCandidatesLimitEventually(t, b, src, 5000, 1, all[:1], "the oldest")
		}},
		{"PendingReclaims list the rows carrying a reclaim token until deleted", func(t *testing.T, b contract.Backend) {
			src, rows := rpSource(t, b), instRows(t, b)
			rpRow(t, b, "tenant-a", "k1", 1)
			rpRow(t, b, "tenant-b", "k2", 2)
			rpRow(t, b, "tenant-a", "k3", 3)
			rpPendingEventually(t, b, src, rpLimit, nil, "no reclaim pending")
			cfNoErr(t, rows.MarkReclaiming(ctxFor(t, "tenant-a"), "k1", "sb-1", 1, 10, "ra"), "MarkReclaiming A/k1")
			cfNoErr(t, rows.MarkReclaiming(ctxFor(t, "tenant-b"), "k2", "sb-1", 2, 10, "rb"), "MarkReclaiming B/k2")
			want := []contract.InstanceRef{{Tenant: "tenant-a", Key: "k1", UpdatedAt: 1}, {Tenant: "tenant-b", Key: "k2", UpdatedAt: 2}}
			rpPendingEventually(t, b, src, rpLimit, want, "the two tombstones")
			cfEventually(t, b, "PendingReclaims(1) returns one tombstone", func() (bool, string, error) {
				got, err := src.PendingReclaims(t.Context(), 1)
				if err != nil {
					return false, "", err
				}
				return len(got) == 1 && (got[0] == want[0] || got[0] == want[1]), cfJSON(got), nil
			})
			cfNoErr(t, rows.DeleteReclaimed(ctxFor(t, "tenant-a"), "k1", "ra"), "DeleteReclaimed A/k1")
			rpPendingEventually(t, b, src, rpLimit, want[1:], "the deleted tombstone left")
		}},
		{"PendingReclaims list deferred reclaims by due until cleared, touched or tombstoned", func(t *testing.T, b contract.Backend) {
			src, rows := rpSource(t, b), instRows(t, b)
			rpRow(t, b, "tenant-a", "k1", 1)
			rpRow(t, b, "tenant-b", "k2", 2)
			rpRow(t, b, "tenant-a", "k3", 3)
			ca, cb := ctxFor(t, "tenant-a"), ctxFor(t, "tenant-b")
			cfNoErr(t, rows.DeferReclaim(ca, "k1", "sb-1", 500), "DeferReclaim A/k1")
			cfNoErr(t, rows.DeferReclaim(ca, "k1", "sb-1", 500), "DeferReclaim A/k1 again")
			cfNoErr(t, rows.DeferReclaim(cb, "k2", "sb-1", 400), "DeferReclaim B/k2")
			cfNoErr(t, rows.DeferReclaim(ca, "k3", "sb-1", 600), "DeferReclaim A/k3")
			if err := rows.DeferReclaim(ca, "k3", "sb-other", 700); !errors.Is(err, contract.ErrConflict) {
				t.Fatalf("DeferReclaim naming another sandbox: %v, want ErrConflict", err)
			}
			if err := rows.DeferReclaim(ca, "missing", "sb-1", 700); !errors.Is(err, contract.ErrConflict) {
				t.Fatalf("DeferReclaim of a missing row: %v, want ErrConflict", err)
			}
			row, err := rows.GetRow(ca, "k1")
			if err != nil || row == nil || row.ReclaimDue != 500 || row.Reclaiming != "" || row.UpdatedAt != 1 {
				t.Fatalf("deferred row %s (%v); want reclaimDue 500, no tombstone, updatedAt unchanged", cfJSON(row), err)
			}
			k1 := contract.InstanceRef{Tenant: "tenant-a", Key: "k1", UpdatedAt: 500}
			k2 := contract.InstanceRef{Tenant: "tenant-b", Key: "k2", UpdatedAt: 400}
			k3 := contract.InstanceRef{Tenant: "tenant-a", Key: "k3", UpdatedAt: 600}
			rpPendingEventually(t, b, src, rpLimit, []contract.InstanceRef{k1, k2, k3}, "three deferred reclaims")
			cfEventually(t, b, "PendingReclaims(1) returns the first due", func() (bool, string, error) {
				got, err := src.PendingReclaims(t.Context(), 1)
				return err == nil && len(got) == 1 && got[0] == k2, cfJSON(got), err
			})
			// A run resuming the sandbox cancels the deferral; so does a clear; a tombstone
			// supersedes it.
			cfNoErr(t, rows.Touch(ca, "k1", "sb-1", "run-2", 50), "Touch A/k1")
			if row, err := rows.GetRow(ca, "k1"); err != nil || row == nil || row.ReclaimDue != 0 {
				t.Fatalf("touched row %s (%v); want the deferral cancelled", cfJSON(row), err)
			}
			cfNoErr(t, rows.DeferReclaim(cb, "k2", "sb-1", 0), "DeferReclaim B/k2 cleared")
			cfNoErr(t, rows.MarkReclaiming(ca, "k3", "sb-1", 3, 10, "r3"), "MarkReclaiming A/k3")
			if err := rows.DeferReclaim(ca, "k3", "sb-1", 900); !errors.Is(err, contract.ErrConflict) {
				t.Fatalf("DeferReclaim of a tombstone: %v, want ErrConflict", err)
			}
			if row, err := rows.GetRow(ca, "k3"); err != nil || row == nil || row.ReclaimDue != 0 || row.Reclaiming != "r3" {
				t.Fatalf("tombstoned row %s (%v)", cfJSON(row), err)
			}
			// k1's listing may linger after the touch (a sweep clears it); the clear and the
			// tombstone are exact.
			cfEventually(t, b, "the cleared deferral left, the tombstone listed", func() (bool, string, error) {
				got, err := src.PendingReclaims(t.Context(), rpLimit)
				if err != nil {
					return false, "", err
				}
				keys := []string{}
				for _, r := range rpNoNudge(got, rpInstTn) {
					if r.Key != "k1" {
						keys = append(keys, r.Tenant+"/"+r.Key)
					}
				}
				return slices.Equal(keys, []string{"tenant-a/k3"}), cfJSON(got), nil
			})
			cfNoErr(t, rows.DeferReclaim(ca, "k1", "sb-1", 0), "DeferReclaim A/k1 cleared")
			rpPendingEventually(t, b, src, rpLimit, []contract.InstanceRef{{Tenant: "tenant-a", Key: "k3", UpdatedAt: 3}}, "only the tombstone")
		}},
		{"IdleInstances list rows with updatedAt <= before, oldest first", func(t *testing.T, b contract.Backend) {
			src, rows := rpSource(t, b), instRows(t, b)
			rpRow(t, b, "tenant-a", "old", 100)
			rpRow(t, b, "tenant-b", "mid", 200)
			rpRow(t, b, "tenant-a", "new", 300)
			rpRow(t, b, "tenant-a", "touched", 150)
			old, mid := contract.InstanceRef{Tenant: "tenant-a", Key: "old", UpdatedAt: 100}, contract.InstanceRef{Tenant: "tenant-b", Key: "mid", UpdatedAt: 200}
			touched := contract.InstanceRef{Tenant: "tenant-a", Key: "touched", UpdatedAt: 150}
			rpIdleEventually(t, b, src, 250, rpLimit, []contract.InstanceRef{old, touched, mid}, "idle before 250")
			cfNoErr(t, rows.Touch(ctxFor(t, "tenant-a"), "touched", "sb-1", "run-9", 1000), "Touch")
			rpIdleEventually(t, b, src, 250, rpLimit, []contract.InstanceRef{old, mid}, "a touched row is no longer idle")
			rpIdleEventually(t, b, src, 200, rpLimit, []contract.InstanceRef{old, mid}, "before is inclusive")
			rpIdleEventually(t, b, src, 199, rpLimit, []contract.InstanceRef{old}, "before 199")
			rpIdleEventually(t, b, src, 1000, 1, []contract.InstanceRef{old}, "limit 1: the oldest")
			cfNoErr(t, refstore.Instances(b.Instances()).Delete(ctxFor(t, "tenant-a"), "old"), "Delete old")
			rpIdleEventually(t, b, src, 250, rpLimit, []contract.InstanceRef{mid}, "a deleted row left")
		}},
		{"StopCandidates list running and stopping rows by idleSince until stopped or tombstoned", func(t *testing.T, b contract.Backend) {
			src, rows := rpSource(t, b), instRows(t, b)
			ca, cb := ctxFor(t, "tenant-a"), ctxFor(t, "tenant-b")
			rpRow(t, b, "tenant-a", "old", 100)
			rpRow(t, b, "tenant-b", "mid", 200)
			rpRow(t, b, "tenant-a", "new", 300)
			ref := func(tenant, key string, at int64) contract.InstanceRef {
				return contract.InstanceRef{Tenant: tenant, Key: key, UpdatedAt: at}
			}
			rpStopEventually(t, b, src, 250, rpLimit, []contract.InstanceRef{ref("tenant-a", "old", 100), ref("tenant-b", "mid", 200)}, "idle since 250")
			rpStopEventually(t, b, src, 1000, 1, []contract.InstanceRef{ref("tenant-a", "old", 100)}, "limit 1: the oldest")
			cfNoErr(t, rows.DeferStop(ca, "old", "sb-1", 400), "DeferStop old")
			cfNoErr(t, rows.MarkStopping(cb, "mid", "sb-1", 200, "stop-1", 500), "MarkStopping mid")
			rpStopEventually(t, b, src, 1000, rpLimit, []contract.InstanceRef{ref("tenant-b", "mid", 200), ref("tenant-a", "new", 300), ref("tenant-a", "old", 400)}, "a deferred row moves, a stopping one stays")
			cfNoErr(t, rows.SettleStop(cb, "mid", "stop-1", contract.LifecycleStopped, 600), "SettleStop mid")
			cfNoErr(t, rows.MarkReclaiming(ca, "new", "sb-1", 300, 300, "reclaim-1"), "MarkReclaiming new")
			rpStopEventually(t, b, src, 1000, rpLimit, []contract.InstanceRef{ref("tenant-a", "old", 400)}, "stopped and tombstoned rows left")
			cfNoErr(t, rows.Touch(cb, "mid", "sb-1", "run-2", 700), "Touch mid")
			rpStopEventually(t, b, src, 1000, rpLimit, []contract.InstanceRef{ref("tenant-a", "old", 400), ref("tenant-b", "mid", 700)}, "a resumed row is listed again")
		}},
		{"StaleIntents list intents with createdAt <= before, oldest first", func(t *testing.T, b contract.Backend) {
			src, in := rpSource(t, b), itStore(t, b)
			cfNoErr(t, in.Put(ctxFor(t, "tenant-a"), "k1", 1, 100), "Put A/k1")
			cfNoErr(t, in.Put(ctxFor(t, "tenant-b"), "k2", 1, 200), "Put B/k2")
			cfNoErr(t, in.Put(ctxFor(t, "tenant-a"), "k3", 1, 300), "Put A/k3")
			k1, k2 := contract.IntentRef{Tenant: "tenant-a", Key: "k1", CreatedAt: 100}, contract.IntentRef{Tenant: "tenant-b", Key: "k2", CreatedAt: 200}
			rpStaleEventually(t, b, src, 250, rpLimit, []contract.IntentRef{k1, k2}, "stale before 250")
			rpStaleEventually(t, b, src, 200, rpLimit, []contract.IntentRef{k1, k2}, "before is inclusive")
			rpStaleEventually(t, b, src, 199, rpLimit, []contract.IntentRef{k1}, "before 199")
			rpStaleEventually(t, b, src, 1000, 1, []contract.IntentRef{k1}, "limit 1: the oldest")
			cfNoErr(t, in.Record(ctxFor(t, "tenant-a"), "k1", 1, "sb-1"), "Record A/k1")
			rpStaleEventually(t, b, src, 250, rpLimit, []contract.IntentRef{k1, k2}, "a recorded intent is still open")
			cfNoErr(t, in.Drop(ctxFor(t, "tenant-a"), "k1", 1), "Drop A/k1")
			cfNoErr(t, in.Put(ctxFor(t, "tenant-b"), "k2", 2, 400), "Put B/k2 with a higher token")
			rpStaleEventually(t, b, src, 250, rpLimit, nil, "dropped and replaced intents left")
			rpStaleEventually(t, b, src, 400, rpLimit, []contract.IntentRef{{Tenant: "tenant-b", Key: "k2", CreatedAt: 400}, {Tenant: "tenant-a", Key: "k3", CreatedAt: 300}}, "the replacement counts from its own createdAt")
		}},
		{"a stale index hit is told apart by re-reading the base record", func(t *testing.T, b contract.Backend) {
			src, runs, rows := rpSource(t, b), fxRuns(t, b), instRows(t, b)
			ctx := ctxFor(t, fxTenant)
			// The base record is consistent at once, whatever the index shows.
			det := rpDetached(t, runs, fxTenant, "r", 1000)
			fxWant(t, runs, fxTenant, "r", &det, "base record right after the detach")
			rpCandidatesEventually(t, b, src, 5000, []contract.Candidate{rpCandidate(fxTenant, det)}, "the detached run")
			fxUsingKeyEventually(t, b, fxTenant, fxKey, []string{"r"}, "the run uses its key")
			rpRow(t, b, fxTenant, "row", 100)
			rpIdleEventually(t, b, src, 200, rpLimit, []contract.InstanceRef{{Tenant: fxTenant, Key: "row", UpdatedAt: 100}}, "the idle row")

			done := fxFinish(t, runs, fxTenant, "r", 1, contract.StatusCompleted)
			cfNoErr(t, rows.Touch(ctx, "row", "sb-1", "run-2", 500), "Touch")
			// Read the indexes without waiting: a hit may be stale; the base record never is.
			stale := 0
			cfEventually(t, b, "stale hits drain and every hit re-reads as the truth", func() (bool, string, error) {
				cands, err := src.ReclaimCandidates(t.Context(), 5000, rpLimit)
				if err != nil {
					return false, "", err
				}
				using, err := runs.RunsUsingKey(ctx, fxKey)
				if err != nil {
					return false, "", err
				}
				idle, err := src.IdleInstances(t.Context(), 200, rpLimit)
				if err != nil {
					return false, "", err
				}
				hits := 0
				for _, c := range rpNoNudge(cands, rpCandTn) {
					st, err := runs.State(ctxFor(t, c.Tenant), c.RunID)
					if err != nil {
						return false, "", err
					}
					if st == nil || !fxEqual(*st, done) {
						return false, "", fmt.Errorf("candidate %s re-reads as %s, want the finished %s", cfJSON(c), cfJSON(st), cfJSON(done))
					}
					hits++
				}
				for _, id := range using {
					st, err := runs.State(ctx, id)
					if err != nil {
						return false, "", err
					}
					if st == nil || !st.Status.Terminal() {
						return false, "", fmt.Errorf("in-use hit %s re-reads as %s, want terminal", id, cfJSON(st))
					}
					hits++
				}
				for _, r := range rpNoNudge(idle, rpInstTn) {
					row, err := rows.GetRow(ctxFor(t, r.Tenant), r.Key)
					if err != nil {
						return false, "", err
					}
					if row == nil || row.UpdatedAt != 500 {
						return false, "", fmt.Errorf("idle hit %s re-reads as %s, want updatedAt 500", cfJSON(r), cfJSON(row))
					}
					hits++
				}
				stale += hits
				return hits == 0, fmt.Sprintf("candidates %s, using %v, idle %s", cfJSON(cands), using, cfJSON(idle)), nil
			})
			t.Logf("stale index hits observed and told apart by re-reading: %d", stale)
		}},
		{"every listing has the run's tenant, never the caller's", func(t *testing.T, b contract.Backend) {
			src, runs := rpSource(t, b), fxRuns(t, b)
			st := rpDetached(t, runs, "tenant-x", "r", 1000)
			// The caller's context carries another tenant: discovery is global and ignores it.
			got := []contract.Candidate{}
			cfEventually(t, b, "a candidate of tenant-x listed under tenant-y", func() (bool, string, error) {
				c, err := src.ReclaimCandidates(ctxFor(t, "tenant-y"), 5000, rpLimit)
				got = rpNoNudge(c, rpCandTn)
				return err == nil && slices.Equal(got, []contract.Candidate{rpCandidate("tenant-x", st)}), cfJSON(c), err
			})
		}},
	}
}
