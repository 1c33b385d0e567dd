package daytona_test

import (
	"encoding/json"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/daytona"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// TestKeeperStartOrder drives keeper.Start's resume → restore → create order with the
// Daytona client against the local fake: alive → resumed; stopped → started, then
// resumed; gone with a snapshot → restored (the row keeps the snapshot); gone without
// one, or with one that vanished → created (the snapshot cleared).
func TestKeeperStartOrder(t *testing.T) {
	f := newFake(t, testKey)
	prov, _ := newProvider(t, f)
	be := memstore.New()
	k, err := keeper.New(keeper.Config{Backend: be, Providers: []contract.Provider{prov}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := contract.WithTenant(ctxFor(t), "tenant-a")
	setup := keeper.Setup{ID: "setup-1", Provider: "daytona", Workspace: json.RawMessage(`{"repo":"x","secrets":{"GH_TOKEN":"ghp-secret-1234"}}`)}
	runs := 0
	start := func(want keeper.Outcome) keeper.StartResult {
		t.Helper()
		runs++
		res, err := k.Start(ctx, keeper.StartInput{RunID: "run-" + string(rune('a'+runs)), ThreadID: "thread-1", Sandbox: setup})
		if err != nil {
			t.Fatalf("start %d: %v", runs, err)
		}
		if res.Outcome != want {
			t.Fatalf("start %d: outcome %s, want %s", runs, res.Outcome, want)
		}
		if res.Run.SandboxKey == nil || *res.Run.SandboxKey != res.Sandbox.Key || res.Sandbox.Provider != daytona.Name {
			t.Fatalf("start %d: run key %v, sandbox %+v", runs, res.Run.SandboxKey, res.Sandbox)
		}
		return res
	}
	row := func(key string) contract.InstanceRecord {
		t.Helper()
		rec, err := refstore.Instances(be.Instances()).Get(ctx, key)
		if err != nil || rec == nil {
			t.Fatalf("row %s: %v %v", key, rec, err)
		}
		return *rec
	}
	setSnapshot := func(key, snap string) {
		t.Helper()
		rec := row(key)
		rec.LatestSnapshotID = snap
		if err := refstore.Instances(be.Instances()).Upsert(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}

	// No row: created, labelled with the key, the secret injected as env (not at create).
	r := start(keeper.OutcomeCreated)
	key, id1 := r.Sandbox.Key, r.Sandbox.ProviderSandboxID
	if f.sandbox(id1).Labels[daytona.KeyLabel] != key {
		t.Fatalf("sandbox label %v, want the key %s", f.sandbox(id1).Labels, key)
	}
	res, err := prov.Exec(ctx, id1, `printf %s "$GH_TOKEN"`)
	if err != nil || string(res.Stdout) != "ghp-secret-1234" {
		t.Fatalf("injected secret: %q %v", res.Stdout, err)
	}

	// Alive: resumed, nothing started.
	startCalls := func() int { return f.count("POST", "/api/sandbox/"+id1+"/start") }
	if r = start(keeper.OutcomeResumed); r.Sandbox.ProviderSandboxID != id1 || startCalls() != 0 {
		t.Fatalf("alive: %s, %d start calls", r.Sandbox.ProviderSandboxID, startCalls())
	}

	// Stopped: started, then resumed.
	f.set(id1, "stopped")
	if r = start(keeper.OutcomeResumed); r.Sandbox.ProviderSandboxID != id1 || startCalls() != 1 || f.state(id1) != "started" {
		t.Fatalf("stopped: %s, %d start calls, state %s", r.Sandbox.ProviderSandboxID, startCalls(), f.state(id1))
	}

	// Gone with a snapshot: restored from it; the row keeps the snapshot id.
	snap, err := prov.Snapshot(ctx, id1, "after-setup")
	if err != nil {
		t.Fatal(err)
	}
	setSnapshot(key, snap)
	if err := prov.Destroy(ctx, id1); err != nil {
		t.Fatal(err)
	}
	r = start(keeper.OutcomeRestored)
	id2 := r.Sandbox.ProviderSandboxID
	if id2 == id1 || f.sandbox(id2).Snapshot != snap || row(key).LatestSnapshotID != snap || row(key).ProviderSandboxID != id2 {
		t.Fatalf("restore: id %s (old %s), from %q, row %+v", id2, id1, f.sandbox(id2).Snapshot, row(key))
	}

	// Gone without a snapshot: created afresh.
	setSnapshot(key, "")
	if err := prov.Destroy(ctx, id2); err != nil {
		t.Fatal(err)
	}
	r = start(keeper.OutcomeCreated)
	id3 := r.Sandbox.ProviderSandboxID
	if id3 == id2 || f.sandbox(id3).Snapshot != "" || row(key).LatestSnapshotID != "" {
		t.Fatalf("create: id %s, snapshot %q, row %+v", id3, f.sandbox(id3).Snapshot, row(key))
	}

	// Gone with a snapshot that no longer exists: Restore says gone, so created; the row's
	// snapshot is cleared.
	setSnapshot(key, "sandkeep-deleted-snapshot")
	if err := prov.Destroy(ctx, id3); err != nil {
		t.Fatal(err)
	}
	r = start(keeper.OutcomeCreated)
	if r.Sandbox.ProviderSandboxID == id3 || row(key).LatestSnapshotID != "" {
		t.Fatalf("create after a vanished snapshot: %s, row %+v", r.Sandbox.ProviderSandboxID, row(key))
	}
	if n := len(f.live()); n != 1 {
		t.Fatalf("live sandboxes %d, want 1 (every replaced one was gone)", n)
	}
}
