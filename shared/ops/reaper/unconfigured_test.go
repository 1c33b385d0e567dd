package reaper_test

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// renamed is a provider under another name: the reaper knows it, the rows do not.
type renamed struct{ *fastProvider }

func (renamed) Name() string { return "other" }

// TestExpiredRunOfAnUnconfiguredProviderKeptInUse: an expired run whose row names a
// provider the reaper does not have, on a key another live run still uses, ends expired with
// its sandbox kept instead of panicking the sweep.
func TestExpiredRunOfAnUnconfiguredProviderKeptInUse(t *testing.T) {
	prov := &fastProvider{live: map[string]bool{}}
	w := newWorld(t, memstore.New(), prov)
	thread := w.id("thread")
	expired, live := w.id("expired"), w.id("live")
	res := w.start(expired, thread)
	w.detach(res, expired)
	past := time.Now().Add(-2 * time.Hour).UnixMilli()
	must(t, refstore.Runs(w.b.Runs()).Update(w.ctx, expired, contract.RunPatch{DetachedSince: contract.Set(past)}))
	w.start(live, thread) // same thread, same key: the sandbox stays in use
	w.prov = renamed{prov}
	rep, err := w.reaper(0, nil, nil).Sweep(w.ctx)
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if got := entry(rep, expired); got.Outcome != reaper.Expired || got.Sandbox != reaper.SandboxKept || got.Status != string(contract.StatusAborted) {
		t.Fatalf("expired run: %+v; want expired, aborted, its sandbox kept", got)
	}
	if !prov.live[res.Sandbox.ProviderSandboxID] {
		t.Fatal("the sandbox another run uses was destroyed")
	}
}
