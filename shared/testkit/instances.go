package testkit

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// RunInstanceStoreConformance proves the instance map (docs/design.md §2.1): the reference cases of
// InstanceStore (I1–I7 plus tenancy) and every conditional primitive of InstanceRows, each
// with its refusal and a lost-response retry recognised by its token.
func RunInstanceStoreConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, instCases())
}

const instTenant = "tenant-a"

// instBase is the reference base record of a key.
func instBase(key string) contract.InstanceRecord {
	return contract.InstanceRecord{Key: key, Provider: "fake", ProviderSandboxID: "sb-1", ThreadID: "thread-1", UpdatedAt: 1}
}

// instFull is instBase with both optionals present.
func instFull(key string) contract.InstanceRecord {
	r := instBase(key)
	r.LatestSnapshotID = "snap-1"
	r.LatestRunID = "run-1"
	return r
}

// instRows returns the conditional instance map; fresh fails a case whose backend has none.
func instRows(t *testing.T, b contract.Backend) contract.InstanceRows {
	t.Helper()
	return b.Instances()
}

// instGet reads key, failing on an error.
func instGet(t *testing.T, s contract.InstanceStore, tenant, key string) *contract.InstanceRecord {
	t.Helper()
	got, err := s.Get(ctxFor(t, tenant), key)
	cfNoErr(t, err, "Get "+key)
	return got
}

// instWant fails unless the record of key is exactly want (nil = absent).
func instWant(t *testing.T, s contract.InstanceStore, tenant, key string, want *contract.InstanceRecord, what string) {
	t.Helper()
	cfWantRead(t, "Get", key, instGet(t, s, tenant, key), want, func(a, b contract.InstanceRecord) bool { return reflect.DeepEqual(a, b) }, what)
}

// instRow reads the row of key, failing on an error.
func instRow(t *testing.T, rows contract.InstanceRows, tenant, key string) *contract.InstanceRow {
	t.Helper()
	got, err := rows.GetRow(ctxFor(t, tenant), key)
	cfNoErr(t, err, "GetRow "+key)
	return got
}

// instRowWant fails unless the row of key is exactly want (nil = absent).
func instRowWant(t *testing.T, rows contract.InstanceRows, tenant, key string, want *contract.InstanceRow, what string) {
	t.Helper()
	cfWantRead(t, "GetRow", key, instRow(t, rows, tenant, key), want, func(a, b contract.InstanceRow) bool { return reflect.DeepEqual(a, b) }, what)
}

// instCreate writes rec with CreateRow under incarnation and returns the stored row.
func instCreate(t *testing.T, rows contract.InstanceRows, rec contract.InstanceRecord, incarnation string) contract.InstanceRow {
	t.Helper()
	cfNoErr(t, rows.CreateRow(ctxFor(t, instTenant), rec, incarnation), "CreateRow "+rec.Key)
	want := contract.FullRow(rec, incarnation)
	instRowWant(t, rows, instTenant, rec.Key, &want, "after CreateRow")
	return want
}

func instCases() []cfCase {
	return []cfCase{
		{"Get of a missing key returns nil without error", func(t *testing.T, b contract.Backend) {
			got, err := refstore.Instances(b.Instances()).Get(ctxFor(t, instTenant), "absent")
			if err != nil || got != nil {
				t.Fatalf("Get absent = (%s, %v), want (nil, nil)", cfJSON(got), err)
			}
		}},
		{"Upsert then Get round-trips every field", func(t *testing.T, b contract.Backend) {
			rec := instFull("thread-1")
			rec.UpdatedAt = 1_700_000_000_123
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctxFor(t, instTenant), rec), "Upsert")
			instWant(t, refstore.Instances(b.Instances()), instTenant, rec.Key, &rec, "round trip")
		}},
		{"absent optionals read back absent", func(t *testing.T, b contract.Backend) {
			rec := instBase("thread-1")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctxFor(t, instTenant), rec), "Upsert")
			got := instGet(t, refstore.Instances(b.Instances()), instTenant, rec.Key)
			if got == nil || *got != rec {
				t.Fatalf("Get = %s, want %s", cfJSON(got), cfJSON(rec))
			}
			enc, err := json.Marshal(got)
			cfNoErr(t, err, "marshal")
			if strings.Contains(string(enc), "latestSnapshotId") || strings.Contains(string(enc), "latestRunId") {
				t.Fatalf("absent optionals appear in the record's JSON: %s", enc)
			}
		}},
		{"re-Upsert fully replaces and clears omitted optionals", func(t *testing.T, b contract.Backend) {
			ctx := ctxFor(t, instTenant)
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, instFull("thread-1")), "first Upsert")
			next := instBase("thread-1")
			next.ProviderSandboxID, next.UpdatedAt = "sb-2", 2
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, next), "second Upsert")
			// A merging upsert keeps latestSnapshotId/latestRunId from the first write.
			instWant(t, refstore.Instances(b.Instances()), instTenant, next.Key, &next, "after the replacing Upsert")
		}},
		{"keys are isolated", func(t *testing.T, b contract.Backend) {
			ctx := ctxFor(t, instTenant)
			a, c := instFull("a"), instBase("b")
			c.ProviderSandboxID = "sb-b"
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, a), "Upsert a")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, c), "Upsert b")
			instWant(t, refstore.Instances(b.Instances()), instTenant, "a", &a, "a after writing b")
			instWant(t, refstore.Instances(b.Instances()), instTenant, "b", &c, "b")
			cfNoErr(t, refstore.Instances(b.Instances()).Delete(ctx, "a"), "Delete a")
			instWant(t, refstore.Instances(b.Instances()), instTenant, "a", nil, "a after Delete a")
			instWant(t, refstore.Instances(b.Instances()), instTenant, "b", &c, "b after Delete a")
		}},
		{"Delete removes the record", func(t *testing.T, b contract.Backend) {
			ctx := ctxFor(t, instTenant)
			rec := instFull("thread-1")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, rec), "Upsert")
			instWant(t, refstore.Instances(b.Instances()), instTenant, rec.Key, &rec, "before Delete")
			cfNoErr(t, refstore.Instances(b.Instances()).Delete(ctx, rec.Key), "Delete")
			instWant(t, refstore.Instances(b.Instances()), instTenant, rec.Key, nil, "after Delete")
		}},
		{"Delete of a missing key is a no-op", func(t *testing.T, b contract.Backend) {
			ctx := ctxFor(t, instTenant)
			other := instBase("other")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, other), "Upsert other")
			cfNoErr(t, refstore.Instances(b.Instances()).Delete(ctx, "absent"), "Delete absent")
			cfNoErr(t, refstore.Instances(b.Instances()).Delete(ctx, "absent"), "Delete absent again")
			instWant(t, refstore.Instances(b.Instances()), instTenant, "absent", nil, "absent after Delete")
			instWant(t, refstore.Instances(b.Instances()), instTenant, "other", &other, "other after Delete absent")
		}},
		{"tenants are isolated", func(t *testing.T, b contract.Backend) {
			inA, inB := instFull("k"), instBase("k")
			inB.ProviderSandboxID, inB.ThreadID = "sb-b", "thread-b"
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctxFor(t, "tenant-a"), inA), "Upsert in A")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctxFor(t, "tenant-b"), inB), "Upsert in B")
			instWant(t, refstore.Instances(b.Instances()), "tenant-a", "k", &inA, "A after B wrote the same key")
			instWant(t, refstore.Instances(b.Instances()), "tenant-b", "k", &inB, "B")
			instWant(t, refstore.Instances(b.Instances()), "tenant-c", "k", nil, "C never wrote k")
			instWant(t, refstore.Instances(b.Instances()), "", "k", nil, "the empty tenant never wrote k")
			cfNoErr(t, refstore.Instances(b.Instances()).Delete(ctxFor(t, "tenant-a"), "k"), "Delete in A")
			instWant(t, refstore.Instances(b.Instances()), "tenant-a", "k", nil, "A after its Delete")
			instWant(t, refstore.Instances(b.Instances()), "tenant-b", "k", &inB, "B after A's Delete")
		}},
		{"an invalid tenant is ErrInvalid", func(t *testing.T, b contract.Backend) {
			for _, bad := range cfBadTenants() {
				ctx := ctxFor(t, bad)
				_, err := refstore.Instances(b.Instances()).Get(ctx, "k")
				cfIs(t, err, contract.ErrInvalid, "Get under tenant "+bad)
				cfIs(t, refstore.Instances(b.Instances()).Upsert(ctx, instBase("k")), contract.ErrInvalid, "Upsert under tenant "+bad)
				cfIs(t, refstore.Instances(b.Instances()).Delete(ctx, "k"), contract.ErrInvalid, "Delete under tenant "+bad)
			}
		}},
		{"Upsert of an empty key is ErrInvalid", func(t *testing.T, b contract.Backend) {
			cfIs(t, refstore.Instances(b.Instances()).Upsert(ctxFor(t, instTenant), instBase("")), contract.ErrInvalid, "Upsert key \"\"")
		}},

		// Conditional primitives (docs/design.md §2.1).
		{"GetRow returns nil for a missing key and the incarnation of a row", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			instRowWant(t, rows, instTenant, "k", nil, "missing key")
			instCreate(t, rows, instFull("k"), "inc-1")
		}},
		{"CreateRow creates only when no row exists", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			want := instCreate(t, rows, instBase("k"), "inc-1")
			other := instFull("k")
			other.ProviderSandboxID = "sb-2"
			cfIs(t, rows.CreateRow(ctx, other, "inc-2"), contract.ErrConflict, "CreateRow over a row")
			instRowWant(t, rows, instTenant, "k", &want, "after the refused CreateRow")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, instBase("plain")), "Upsert plain")
			cfIs(t, rows.CreateRow(ctx, other, "inc-3"), contract.ErrConflict, "CreateRow over a row written by Upsert")
		}},
		{"CreateRow retried after a lost response succeeds and changes nothing", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			rec := instFull("k")
			want := instCreate(t, rows, rec, "inc-1")
			cfNoErr(t, rows.CreateRow(ctx, rec, "inc-1"), "retried CreateRow with its own incarnation")
			instRowWant(t, rows, instTenant, "k", &want, "after the retry")
			next := instBase("k")
			next.ProviderSandboxID = "sb-2"
			cfNoErr(t, rows.ReplaceRow(ctx, next, "inc-1", "inc-2"), "ReplaceRow by another writer")
			cfIs(t, rows.CreateRow(ctx, rec, "inc-1"), contract.ErrConflict, "retry after the row moved on")
			instRowWant(t, rows, instTenant, "k", ptr(contract.FullRow(next, "inc-2")), "after the late retry")
		}},
		{"plain Upsert stamps a fresh incarnation", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, instBase("k")), "Upsert")
			got := instRow(t, rows, instTenant, "k")
			if got == nil || got.Incarnation == "" || got.Incarnation == "inc-1" {
				t.Fatalf("GetRow after Upsert = %s; want a fresh non-empty incarnation", cfJSON(got))
			}
			if got.InstanceRecord != instBase("k") {
				t.Fatalf("GetRow after Upsert = %s, want record %s", cfJSON(got), cfJSON(instBase("k")))
			}
			cfIs(t, rows.ReplaceRow(ctx, instFull("k"), "inc-1", "inc-2"), contract.ErrConflict, "ReplaceRow against the pre-Upsert incarnation")
			cfNoErr(t, refstore.Instances(b.Instances()).Upsert(ctx, instBase("fresh")), "Upsert fresh")
			if r := instRow(t, rows, instTenant, "fresh"); r == nil || r.Incarnation == "" {
				t.Fatalf("GetRow of an upserted key = %s; want a non-empty incarnation", cfJSON(r))
			}
		}},
		{"ReplaceRow fully replaces while the incarnation is unchanged", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			instCreate(t, rows, instFull("k"), "inc-1")
			next := instBase("k")
			next.ProviderSandboxID, next.UpdatedAt = "sb-2", 7
			cfNoErr(t, rows.ReplaceRow(ctxFor(t, instTenant), next, "inc-1", "inc-2"), "ReplaceRow")
			instRowWant(t, rows, instTenant, "k", ptr(contract.FullRow(next, "inc-2")), "after ReplaceRow (optionals cleared)")
		}},
		{"ReplaceRow refuses a changed incarnation, a missing row and a pending reclaim", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			next := instBase("k")
			next.ProviderSandboxID = "sb-2"
			cfIs(t, rows.ReplaceRow(ctx, next, "inc-0", "inc-2"), contract.ErrConflict, "ReplaceRow with a stale incarnation")
			instRowWant(t, rows, instTenant, "k", &want, "after the stale ReplaceRow")
			cfIs(t, rows.ReplaceRow(ctx, instBase("absent"), "inc-1", "inc-2"), contract.ErrConflict, "ReplaceRow of a missing row")
			instRowWant(t, rows, instTenant, "absent", nil, "a refused ReplaceRow creates nothing")
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", want.UpdatedAt, want.UpdatedAt, "reclaim-1"), "MarkReclaiming")
			want.Reclaiming = "reclaim-1"
			cfIs(t, rows.ReplaceRow(ctx, next, "inc-1", "inc-2"), contract.ErrConflict, "ReplaceRow of a tombstoned row")
			instRowWant(t, rows, instTenant, "k", &want, "the tombstone after the refused ReplaceRow")
		}},
		{"ReplaceRow retried after a lost response succeeds and changes nothing", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			instCreate(t, rows, instFull("k"), "inc-1")
			next := instBase("k")
			next.ProviderSandboxID = "sb-2"
			cfNoErr(t, rows.ReplaceRow(ctx, next, "inc-1", "inc-2"), "ReplaceRow")
			want := contract.FullRow(next, "inc-2")
			cfNoErr(t, rows.ReplaceRow(ctx, next, "inc-1", "inc-2"), "retried ReplaceRow with its own incarnation")
			instRowWant(t, rows, instTenant, "k", &want, "after the retry")
			third := instBase("k")
			third.ProviderSandboxID = "sb-3"
			cfNoErr(t, rows.ReplaceRow(ctx, third, "inc-2", "inc-3"), "ReplaceRow by another writer")
			cfIs(t, rows.ReplaceRow(ctx, next, "inc-1", "inc-2"), contract.ErrConflict, "retry after the row moved on")
			instRowWant(t, rows, instTenant, "k", ptr(contract.FullRow(third, "inc-3")), "after the late retry")
		}},
		{"the idle stop: MarkStopping, SettleStop, DeferStop and Touch move the lifecycle", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			if want.Lifecycle != contract.LifecycleRunning || want.LifecycleSince != 1 || want.IdleSince != 1 {
				t.Fatalf("a created row = %s, want running since its updatedAt and listed from then", cfJSON(want))
			}
			cfIs(t, rows.MarkStopping(ctx, "k", "sb-other", 1, "stop-1", 10), contract.ErrConflict, "MarkStopping with another sandbox id")
			cfIs(t, rows.MarkStopping(ctx, "k", "sb-1", 2, "stop-1", 10), contract.ErrConflict, "MarkStopping of a row touched since it was read")
			cfIs(t, rows.MarkStopping(ctx, "absent", "sb-1", 1, "stop-1", 10), contract.ErrConflict, "MarkStopping of a missing row")
			instRowWant(t, rows, instTenant, "k", &want, "after refused marks")
			cfNoErr(t, rows.MarkStopping(ctx, "k", "sb-1", 1, "stop-1", 10), "MarkStopping")
			want.Lifecycle, want.LifecycleSince, want.StopToken = contract.LifecycleStopping, 10, "stop-1"
			instRowWant(t, rows, instTenant, "k", &want, "after MarkStopping")
			cfNoErr(t, rows.MarkStopping(ctx, "k", "sb-1", 1, "stop-1", 10), "retried MarkStopping")
			instRowWant(t, rows, instTenant, "k", &want, "after the retried MarkStopping")
			cfIs(t, rows.Touch(ctx, "k", "sb-1", "run-2", 15), contract.ErrConflict, "Touch of a stopping row")
			cfIs(t, rows.DeferStop(ctx, "k", "sb-1", 15), contract.ErrConflict, "DeferStop of a stopping row")
			cfIs(t, rows.SettleStop(ctx, "k", "stop-other", contract.LifecycleStopped, 20), contract.ErrConflict, "SettleStop with another token")
			instRowWant(t, rows, instTenant, "k", &want, "after refused writes to a stopping row")
			cfNoErr(t, rows.SettleStop(ctx, "k", "stop-1", contract.LifecycleStopped, 20), "SettleStop stopped")
			want.Lifecycle, want.LifecycleSince, want.IdleSince = contract.LifecycleStopped, 20, 0
			instRowWant(t, rows, instTenant, "k", &want, "after SettleStop")
			cfNoErr(t, rows.SettleStop(ctx, "k", "stop-1", contract.LifecycleStopped, 20), "retried SettleStop")
			instRowWant(t, rows, instTenant, "k", &want, "after the retried SettleStop")
			cfIs(t, rows.MarkStopping(ctx, "k", "sb-1", 1, "stop-2", 25), contract.ErrConflict, "MarkStopping of a stopped row")
			cfIs(t, rows.DeferStop(ctx, "k", "sb-1", 25), contract.ErrConflict, "DeferStop of a stopped row")
			cfNoErr(t, rows.Touch(ctx, "k", "sb-1", "run-2", 30), "Touch resumes a stopped row")
			want.LatestRunID, want.UpdatedAt = "run-2", 30
			want.Lifecycle, want.LifecycleSince, want.StopToken, want.IdleSince = contract.LifecycleRunning, 30, "", 30
			instRowWant(t, rows, instTenant, "k", &want, "after Touch")
			cfNoErr(t, rows.DeferStop(ctx, "k", "sb-1", 40), "DeferStop")
			want.IdleSince = 40
			instRowWant(t, rows, instTenant, "k", &want, "after DeferStop")
			cfIs(t, rows.DeferStop(ctx, "k", "sb-other", 45), contract.ErrConflict, "DeferStop with another sandbox id")
			cfNoErr(t, rows.MarkStopping(ctx, "k", "sb-1", 30, "stop-3", 50), "MarkStopping again")
			cfNoErr(t, rows.MarkStopping(ctx, "k", "sb-1", 30, "stop-4", 55), "MarkStopping takes over a stop left unfinished")
			cfIs(t, rows.SettleStop(ctx, "k", "stop-3", contract.LifecycleStopped, 58), contract.ErrConflict, "SettleStop by the superseded stop")
			cfNoErr(t, rows.SettleStop(ctx, "k", "stop-4", contract.LifecycleRunning, 60), "SettleStop running (the stop failed)")
			want.Lifecycle, want.LifecycleSince, want.StopToken, want.IdleSince = contract.LifecycleRunning, 60, "stop-4", 60
			instRowWant(t, rows, instTenant, "k", &want, "after a failed stop")
			cfNoErr(t, rows.SettleStop(ctx, "k", "stop-4", contract.LifecycleRunning, 60), "retried SettleStop running")
			instRowWant(t, rows, instTenant, "k", &want, "after the retried SettleStop running")
			cfIs(t, rows.SettleStop(ctx, "k", "stop-4", contract.LifecycleStopped, 60), contract.ErrConflict, "SettleStop stopped of a row a failed stop left running")
			cfIs(t, rows.SettleStop(ctx, "k", "stop-other", contract.LifecycleRunning, 60), contract.ErrConflict, "SettleStop of a running row by another token")
			cfIs(t, rows.SettleStop(ctx, "k", "stop-4", "paused", 60), contract.ErrInvalid, "SettleStop to a state no stop ends in")
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", 30, 30, "reclaim-1"), "MarkReclaiming")
			cfIs(t, rows.MarkStopping(ctx, "k", "sb-1", 30, "stop-5", 70), contract.ErrConflict, "MarkStopping of a tombstone")
			cfIs(t, rows.DeferStop(ctx, "k", "sb-1", 70), contract.ErrConflict, "DeferStop of a tombstone")
			cfNoErr(t, rows.CreateRow(ctx, instBase("k2"), "inc-k2"), "CreateRow k2")
			cfNoErr(t, rows.MarkStopping(ctx, "k2", "sb-1", 1, "stop-k2", 80), "MarkStopping k2")
			cfNoErr(t, rows.SettleStop(ctx, "k2", "stop-k2", contract.LifecycleGone, 90), "SettleStop gone")
			if got := instRow(t, rows, instTenant, "k2"); got == nil || got.Lifecycle != contract.LifecycleGone || got.LifecycleSince != 90 || got.IdleSince != 0 {
				t.Fatalf("k2 after SettleStop gone = %s, want gone since 90, not listed", cfJSON(got))
			}
			cfNoErr(t, rows.CreateRow(ctx, instBase("k3"), "inc-k3"), "CreateRow k3")
			cfNoErr(t, rows.MarkStopping(ctx, "k3", "sb-1", 1, "stop-k3", 80), "MarkStopping k3")
			cfNoErr(t, rows.SettleStop(ctx, "k3", "stop-k3", contract.LifecycleArchived, 95), "SettleStop archived")
			cfNoErr(t, rows.SettleStop(ctx, "k3", "stop-k3", contract.LifecycleArchived, 95), "retried SettleStop archived")
			if got := instRow(t, rows, instTenant, "k3"); got == nil || got.Lifecycle != contract.LifecycleArchived || got.LifecycleSince != 95 || got.IdleSince != 0 {
				t.Fatalf("k3 after SettleStop archived = %s, want archived since 95, not listed", cfJSON(got))
			}
			cfNoErr(t, rows.Touch(ctx, "k3", "sb-1", "run-3", 99), "Touch resumes an archived row")
			if got := instRow(t, rows, instTenant, "k3"); got == nil || got.Lifecycle != contract.LifecycleRunning || got.LifecycleSince != 99 {
				t.Fatalf("k3 after Touch = %s, want running since 99", cfJSON(got))
			}
		}},
		{"Touch sets latestRunId and updatedAt only", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, rows.Touch(ctxFor(t, instTenant), "k", "sb-1", "run-2", 50), "Touch")
			got := instRow(t, rows, instTenant, "k")
			want := instFull("k")
			want.LatestRunID, want.UpdatedAt = "run-2", 50
			if got == nil || got.InstanceRecord != want || got.Reclaiming != "" {
				t.Fatalf("GetRow after Touch = %s, want record %s and no reclaim", cfJSON(got), cfJSON(want))
			}
		}},
		{"Touch refuses a changed sandbox, a missing row and a pending reclaim", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			cfIs(t, rows.Touch(ctx, "k", "sb-other", "run-2", 50), contract.ErrConflict, "Touch with another sandbox id")
			instRowWant(t, rows, instTenant, "k", &want, "after the refused Touch")
			cfIs(t, rows.Touch(ctx, "absent", "sb-1", "run-2", 50), contract.ErrConflict, "Touch of a missing row")
			instRowWant(t, rows, instTenant, "absent", nil, "a refused Touch creates nothing")
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", 1, 1, "reclaim-1"), "MarkReclaiming")
			want.Reclaiming = "reclaim-1"
			cfIs(t, rows.Touch(ctx, "k", "sb-1", "run-2", 50), contract.ErrConflict, "Touch of a tombstoned row")
			instRowWant(t, rows, instTenant, "k", &want, "the tombstone after the refused Touch")
		}},
		{"Touch retried after a lost response succeeds and changes nothing", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, rows.Touch(ctx, "k", "sb-1", "run-2", 50), "Touch")
			want := instRow(t, rows, instTenant, "k")
			cfNoErr(t, rows.Touch(ctx, "k", "sb-1", "run-2", 50), "retried Touch")
			instRowWant(t, rows, instTenant, "k", want, "after the retry")
		}},
		{"SetSnapshot sets latestSnapshotId and updatedAt only", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, rows.SetSnapshot(ctxFor(t, instTenant), "k", "sb-1", "snap-1", "snap-2", 60), "SetSnapshot")
			got := instRow(t, rows, instTenant, "k")
			want := instFull("k")
			want.LatestSnapshotID, want.UpdatedAt = "snap-2", 60
			if got == nil || got.InstanceRecord != want || got.Reclaiming != "" || !slices.Equal(got.StaleSnapshots, []string{"snap-1"}) {
				t.Fatalf("GetRow after SetSnapshot = %s, want record %s with snap-1 stale", cfJSON(got), cfJSON(want))
			}
		}},
		{"SetSnapshot refuses a changed sandbox and a missing row", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			cfIs(t, rows.SetSnapshot(ctx, "k", "sb-other", "snap-1", "snap-2", 60), contract.ErrConflict, "SetSnapshot with another sandbox id")
			instRowWant(t, rows, instTenant, "k", &want, "after the refused SetSnapshot")
			cfIs(t, rows.SetSnapshot(ctx, "k", "sb-1", "snap-0", "snap-2", 60), contract.ErrConflict, "SetSnapshot superseding another snapshot than the row's")
			cfIs(t, rows.SetSnapshot(ctx, "k", "sb-1", "", "snap-2", 60), contract.ErrConflict, "SetSnapshot superseding none while the row has one")
			instRowWant(t, rows, instTenant, "k", &want, "after the refused SetSnapshots")
			cfIs(t, rows.SetSnapshot(ctx, "absent", "sb-1", "", "snap-2", 60), contract.ErrConflict, "SetSnapshot of a missing row")
			instRowWant(t, rows, instTenant, "absent", nil, "a refused SetSnapshot creates nothing")
		}},
		{"SetSnapshot retried after a lost response succeeds and changes nothing", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, rows.SetSnapshot(ctx, "k", "sb-1", "snap-1", "snap-2", 60), "SetSnapshot")
			want := instRow(t, rows, instTenant, "k")
			cfNoErr(t, rows.SetSnapshot(ctx, "k", "sb-1", "snap-1", "snap-2", 60), "retried SetSnapshot")
			instRowWant(t, rows, instTenant, "k", want, "after the retry")
		}},
		{"superseded snapshots stay listed until their delete is confirmed", func(t *testing.T, b contract.Backend) {
			rows, src := instRows(t, b), b.Reaper()
			ctx := ctxFor(t, instTenant)
			rec := instBase("k")
			instCreate(t, rows, rec, "inc-1")
			cfNoErr(t, rows.SetSnapshot(ctx, "k", "sb-1", "", "snap-1", 10), "first SetSnapshot")
			if got := instRow(t, rows, instTenant, "k"); got.LatestSnapshotID != "snap-1" || len(got.StaleSnapshots) != 0 {
				t.Fatalf("the first snapshot superseded nothing: %s", cfJSON(got))
			}
			cfNoErr(t, rows.SetSnapshot(ctx, "k", "sb-1", "snap-1", "snap-2", 20), "second")
			cfNoErr(t, rows.SetSnapshot(ctx, "k", "sb-1", "snap-2", "snap-3", 30), "third")
			got := instRow(t, rows, instTenant, "k")
			if got.LatestSnapshotID != "snap-3" || !slices.Equal(got.StaleSnapshots, []string{"snap-1", "snap-2"}) {
				t.Fatalf("after three snapshots: %s; want snap-3 latest, snap-1 and snap-2 stale", cfJSON(got))
			}
			if src != nil {
				cfEventually(t, b, "the row with stale snapshots listed as pending", func() (bool, string, error) {
					refs, err := src.PendingReclaims(t.Context(), 100)
					return err == nil && slices.ContainsFunc(refs, func(r contract.InstanceRef) bool { return r.Key == "k" && r.Tenant == instTenant }), cfJSON(refs), err
				})
			}
			cfNoErr(t, rows.DropStaleSnapshot(ctx, "k", "snap-1"), "DropStaleSnapshot snap-1")
			cfNoErr(t, rows.DropStaleSnapshot(ctx, "k", "snap-1"), "retried DropStaleSnapshot")
			cfNoErr(t, rows.DropStaleSnapshot(ctx, "k", "snap-9"), "DropStaleSnapshot of one never stale")
			cfNoErr(t, rows.DropStaleSnapshot(ctx, "absent", "snap-1"), "DropStaleSnapshot of a missing row")
			instRowWant(t, rows, instTenant, "absent", nil, "a drop creates nothing")
			if got := instRow(t, rows, instTenant, "k"); got.LatestSnapshotID != "snap-3" || !slices.Equal(got.StaleSnapshots, []string{"snap-2"}) {
				t.Fatalf("after dropping snap-1: %s", cfJSON(got))
			}
			cfNoErr(t, rows.DropStaleSnapshot(ctx, "k", "snap-2"), "DropStaleSnapshot snap-2")
			if got := instRow(t, rows, instTenant, "k"); len(got.StaleSnapshots) != 0 || got.LatestSnapshotID != "snap-3" || got.UpdatedAt != 30 {
				t.Fatalf("after dropping both: %s", cfJSON(got))
			}
		}},
		{"MarkReclaiming tombstones the row with the token, idleBefore inclusive", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			rec := instFull("k")
			rec.UpdatedAt = 100
			want := instCreate(t, rows, rec, "inc-1")
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", 100, 100, "reclaim-1"), "MarkReclaiming at updatedAt == idleBefore")
			want.Reclaiming = "reclaim-1"
			instRowWant(t, rows, instTenant, "k", &want, "the tombstone")
			cfIs(t, rows.CreateRow(ctx, rec, "inc-2"), contract.ErrConflict, "CreateRow over a tombstone")
			instRowWant(t, rows, instTenant, "k", &want, "the tombstone after a refused CreateRow")
		}},
		{"MarkReclaiming refuses a changed sandbox, a touched row, a row idle too briefly and a missing row", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			rec := instFull("k")
			rec.UpdatedAt = 100
			want := instCreate(t, rows, rec, "inc-1")
			cfIs(t, rows.MarkReclaiming(ctx, "k", "sb-other", 100, 1000, "r"), contract.ErrConflict, "another sandbox id")
			cfIs(t, rows.MarkReclaiming(ctx, "k", "sb-1", 99, 1000, "r"), contract.ErrConflict, "another updatedAt")
			cfIs(t, rows.MarkReclaiming(ctx, "k", "sb-1", 100, 99, "r"), contract.ErrConflict, "updatedAt after idleBefore")
			instRowWant(t, rows, instTenant, "k", &want, "after the refusals")
			// The reclaimer read updatedAt 100; a starter touches the row before the mark lands.
			cfNoErr(t, rows.Touch(ctx, "k", "sb-1", "run-2", 150), "Touch")
			cfIs(t, rows.MarkReclaiming(ctx, "k", "sb-1", 100, 1000, "r"), contract.ErrConflict, "a row touched since it was read")
			if got := instRow(t, rows, instTenant, "k"); got == nil || got.Reclaiming != "" {
				t.Fatalf("row after the refused mark = %s; want no reclaim pending", cfJSON(got))
			}
			cfIs(t, rows.MarkReclaiming(ctx, "absent", "sb-1", 100, 1000, "r"), contract.ErrConflict, "a missing row")
			instRowWant(t, rows, instTenant, "absent", nil, "a refused MarkReclaiming creates nothing")
		}},
		{"MarkReclaiming retried after a lost response succeeds and changes nothing", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", 1, 500, "reclaim-1"), "MarkReclaiming")
			want.Reclaiming = "reclaim-1"
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", 1, 500, "reclaim-1"), "retried MarkReclaiming")
			instRowWant(t, rows, instTenant, "k", &want, "after the retry")
		}},
		{"DeleteReclaimed deletes only the row carrying the token", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", 1, 1, "reclaim-1"), "MarkReclaiming")
			want.Reclaiming = "reclaim-1"
			cfIs(t, rows.DeleteReclaimed(ctx, "k", "reclaim-2"), contract.ErrConflict, "DeleteReclaimed with another token")
			instRowWant(t, rows, instTenant, "k", &want, "after the refused delete")
			cfNoErr(t, rows.DeleteReclaimed(ctx, "k", "reclaim-1"), "DeleteReclaimed")
			instRowWant(t, rows, instTenant, "k", nil, "after DeleteReclaimed")
		}},
		{"DeleteReclaimed refuses a row without a pending reclaim", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			cfIs(t, rows.DeleteReclaimed(ctxFor(t, instTenant), "k", "reclaim-1"), contract.ErrConflict, "DeleteReclaimed of a live row")
			instRowWant(t, rows, instTenant, "k", &want, "the live row after the refused delete")
		}},
		{"DeleteReclaimed retried after a lost response succeeds", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			ctx := ctxFor(t, instTenant)
			instCreate(t, rows, instFull("k"), "inc-1")
			cfNoErr(t, rows.MarkReclaiming(ctx, "k", "sb-1", 1, 1, "reclaim-1"), "MarkReclaiming")
			cfNoErr(t, rows.DeleteReclaimed(ctx, "k", "reclaim-1"), "DeleteReclaimed")
			cfNoErr(t, rows.DeleteReclaimed(ctx, "k", "reclaim-1"), "retried DeleteReclaimed")
			instRowWant(t, rows, instTenant, "k", nil, "after the retry")
		}},
		{"conditional primitives are tenant-scoped", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			want := instCreate(t, rows, instFull("k"), "inc-1")
			ctxB := ctxFor(t, "tenant-b")
			cfIs(t, rows.ReplaceRow(ctxB, instBase("k"), "inc-1", "inc-2"), contract.ErrConflict, "ReplaceRow in B")
			cfIs(t, rows.Touch(ctxB, "k", "sb-1", "run-2", 50), contract.ErrConflict, "Touch in B")
			cfIs(t, rows.SetSnapshot(ctxB, "k", "sb-1", "snap-1", "snap-2", 50), contract.ErrConflict, "SetSnapshot in B")
			cfIs(t, rows.MarkReclaiming(ctxB, "k", "sb-1", 1, 1, "r"), contract.ErrConflict, "MarkReclaiming in B")
			instRowWant(t, rows, "tenant-b", "k", nil, "B after its refused writes")
			instRowWant(t, rows, instTenant, "k", &want, "A after B's refused writes")
			cfNoErr(t, rows.CreateRow(ctxB, instBase("k"), "inc-b"), "CreateRow in B")
			instRowWant(t, rows, instTenant, "k", &want, "A after B created the same key")
			cfNoErr(t, rows.MarkReclaiming(ctxB, "k", "sb-1", 1, 1, "rb"), "MarkReclaiming in B")
			cfNoErr(t, rows.DeleteReclaimed(ctxB, "k", "rb"), "DeleteReclaimed in B")
			instRowWant(t, rows, instTenant, "k", &want, "A after B deleted the same key")
		}},
		{"conditional primitives reject an invalid tenant", func(t *testing.T, b contract.Backend) {
			rows := instRows(t, b)
			for _, bad := range cfBadTenants() {
				ctx := ctxFor(t, bad)
				_, err := rows.GetRow(ctx, "k")
				cfIs(t, err, contract.ErrInvalid, "GetRow under "+bad)
				cfIs(t, rows.CreateRow(ctx, instBase("k"), "i"), contract.ErrInvalid, "CreateRow under "+bad)
				cfIs(t, rows.ReplaceRow(ctx, instBase("k"), "i", "j"), contract.ErrInvalid, "ReplaceRow under "+bad)
				cfIs(t, rows.Touch(ctx, "k", "sb-1", "r", 1), contract.ErrInvalid, "Touch under "+bad)
				cfIs(t, rows.SetSnapshot(ctx, "k", "sb-1", "", "s", 1), contract.ErrInvalid, "SetSnapshot under "+bad)
				cfIs(t, rows.DropStaleSnapshot(ctx, "k", "s"), contract.ErrInvalid, "DropStaleSnapshot under "+bad)
				cfIs(t, rows.MarkReclaiming(ctx, "k", "sb-1", 1, 1, "r"), contract.ErrInvalid, "MarkReclaiming under "+bad)
				cfIs(t, rows.DeleteReclaimed(ctx, "k", "r"), contract.ErrInvalid, "DeleteReclaimed under "+bad)
			}
		}},
	}
}

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }
