// Package agenttest is the world of the tests of running an agent, shared by the server
// side's (shared/ops/agentrun) and the host loop's (shared/host/driver): a keeper over a
// backend and a local-process provider, and runs started with their agent launched under
// the journal (docs/design.md §6, §13).
package agenttest

import (
	"context"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// Dir is the journal directory of every run an Env starts.
const Dir = "journal"

// Env is one test's world; its context carries the tenant "t1".
type Env struct {
	T    *testing.T
	Ctx  context.Context
	K    *keeper.Keeper
	Prov *localprocess.Provider
}

// New is an Env over a fresh memstore, its keeper's driver lease lease.
func New(t *testing.T, lease time.Duration) *Env { return NewOn(t, lease, memstore.New()) }

// NewOn is New over backend b.
func NewOn(t *testing.T, lease time.Duration, b contract.Backend) *Env {
	prov := localprocess.New(t.TempDir())
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{prov}, DriverLease: lease})
	if err != nil {
		t.Fatal(err)
	}
	return &Env{T: t, Ctx: contract.WithTenant(t.Context(), "t1"), K: k, Prov: prov}
}

// Start starts runID on thread runID and launches agent in its sandbox under the journal
// (Dir); the sandbox is destroyed when the test ends.
func (e *Env) Start(runID, agent string) keeper.StartResult {
	e.T.Helper()
	res, err := e.K.Start(e.Ctx, keeper.StartInput{RunID: runID, ThreadID: runID, Sandbox: keeper.Setup{ID: "a", Provider: e.Prov.Name()}})
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { _ = e.Prov.Destroy(context.Background(), res.Sandbox.ProviderSandboxID) })
	if _, err := journal.Launch(e.Ctx, e.Prov, res.Sandbox.ProviderSandboxID, Dir, runID, agent); err != nil {
		e.T.Fatal(err)
	}
	return res
}
