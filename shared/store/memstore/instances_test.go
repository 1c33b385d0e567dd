package memstore_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

func TestUpsertIsAFullReplace(t *testing.T) {
	ctx, rows := tctx(t, "a"), memstore.New().Instances()
	rec := contract.InstanceRecord{Key: "k", Provider: "p", ProviderSandboxID: "s1", ThreadID: "th",
		LatestSnapshotID: "snap", LatestRunID: "r1", UpdatedAt: 1}
	must(t, refstore.Instances(rows).Upsert(ctx, rec), "upsert")
	first, err := rows.GetRow(ctx, "k")
	must(t, err, "get row")
	rec.LatestSnapshotID, rec.LatestRunID = "", ""
	must(t, refstore.Instances(rows).Upsert(ctx, rec), "re-upsert")
	second, err := rows.GetRow(ctx, "k")
	must(t, err, "get row")
	if second.LatestSnapshotID != "" || second.LatestRunID != "" {
		t.Fatalf("omitted optionals survived: %+v", second)
	}
	if second.Incarnation == first.Incarnation || second.Incarnation == "" {
		t.Fatalf("incarnation not fresh: %q then %q", first.Incarnation, second.Incarnation)
	}
}

func TestConditionalRowsRecogniseTheirToken(t *testing.T) {
	ctx, rows := tctx(t, "a"), memstore.New().Instances()
	rec := contract.InstanceRecord{Key: "k", Provider: "p", ProviderSandboxID: "s1", ThreadID: "th", UpdatedAt: 10}
	must(t, rows.CreateRow(ctx, rec, "i1"), "create")
	must(t, rows.CreateRow(ctx, rec, "i1"), "retried create")
	wantErr(t, rows.CreateRow(ctx, rec, "i2"), contract.ErrConflict, "create over a row")

	rec.ProviderSandboxID = "s2"
	must(t, rows.ReplaceRow(ctx, rec, "i1", "i3"), "replace")
	must(t, rows.ReplaceRow(ctx, rec, "i1", "i3"), "retried replace")
	wantErr(t, rows.ReplaceRow(ctx, rec, "i1", "i4"), contract.ErrConflict, "replace of a changed row")

	wantErr(t, rows.Touch(ctx, "k", "s1", "r9", 20), contract.ErrConflict, "touch with an old psid")
	wantErr(t, rows.MarkReclaiming(ctx, "k", "s2", 10, 9, "t1"), contract.ErrConflict, "reclaim a row touched too recently")
	must(t, rows.MarkReclaiming(ctx, "k", "s2", 10, 10, "t1"), "mark reclaiming")
	must(t, rows.MarkReclaiming(ctx, "k", "s2", 10, 10, "t1"), "retried mark")
	wantErr(t, rows.Touch(ctx, "k", "s2", "r9", 20), contract.ErrConflict, "touch a tombstone")
	wantErr(t, rows.ReplaceRow(ctx, rec, "i3", "i5"), contract.ErrConflict, "replace a tombstone")
	wantErr(t, rows.DeleteReclaimed(ctx, "k", "t2"), contract.ErrConflict, "delete by another token")
	must(t, rows.DeleteReclaimed(ctx, "k", "t1"), "delete reclaimed")
	must(t, rows.DeleteReclaimed(ctx, "k", "t1"), "retried delete")
	if got, err := refstore.Instances(rows).Get(ctx, "k"); err != nil || got != nil {
		t.Fatalf("row survived its reclaim: %+v %v", got, err)
	}
}

func TestIntentsAndTheirIndex(t *testing.T) {
	s := memstore.New()
	ctx, in := tctx(t, "a"), s.Intents()
	must(t, in.Put(ctx, "k", 5, 100), "put")
	must(t, in.Put(ctx, "k", 5, 200), "retried put")
	wantErr(t, in.Put(ctx, "k", 4, 300), contract.ErrConflict, "put with a lower token")
	wantErr(t, in.Record(ctx, "k", 4, "s1"), contract.ErrConflict, "record with another token")
	must(t, in.Record(ctx, "k", 5, "s1"), "record")
	got, err := in.Get(ctx, "k")
	must(t, err, "get")
	if got == nil || got.ProviderSandboxID != "s1" || got.CreatedAt != 100 {
		t.Fatalf("intent %+v", got)
	}
	stale, err := s.Reaper().StaleIntents(ctx, 100, 10)
	must(t, err, "stale intents")
	if len(stale) != 1 || stale[0] != (contract.IntentRef{Tenant: "a", Key: "k", CreatedAt: 100}) {
		t.Fatalf("stale intents %+v", stale)
	}
	must(t, in.Put(ctx, "k", 6, 400), "put with a higher token")
	wantErr(t, in.Drop(ctx, "k", 5), contract.ErrConflict, "drop by the replaced token")
	must(t, in.Drop(ctx, "k", 6), "drop")
	must(t, in.Drop(ctx, "k", 6), "retried drop")
}
