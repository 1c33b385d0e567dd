package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
)

// Contention is docs/design.md §11's concurrent-start proof: N starts of N new runs on one new thread at
// once, with a provider whose every Create mints a fresh id. Expected: 1 create, N equal
// ids, 0 destroys.
type Contention struct {
	Starts      int
	Creates     int
	Restores    int
	Resumes     int // provider Resume calls (fast path and under the lock)
	Destroys    int
	DistinctIDs int // provider sandbox ids among the N results
	RowMatches  bool
	Outcomes    map[keeper.Outcome]int
	LockEntries int // starters that entered WithLock (their step-1 read found no row)
	Calls       int // DynamoDB calls of all N starts (lock polling included)
	ByAPI       map[string]int
	Wall        time.Duration // first start released → last start answered
	Start       *OpStats      // each start's latency (calls are not per-start: they overlap)
	Holds       bool          // 1 create, N equal ids, 0 destroys
}

// contention releases cfg.Contention starts on one new thread at the same instant.
func (e *env) contention(ctx context.Context, table string) (*Contention, error) {
	n := e.cfg.Contention
	store := dynamostore.New(dynamostore.Config{Client: e.client, Table: table})
	fb := &lockCounting{Backend: store}
	prov := newMemProvider(ProviderName)
	k, err := keeper.New(keeper.Config{Backend: fb, Providers: []contract.Provider{prov}, Logger: e.quiet})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	ctx = contract.WithTenant(ctx, Tenant)
	thread := "contended-" + randHex(6)
	in := func(i int) keeper.StartInput {
		return keeper.StartInput{RunID: fmt.Sprintf("%s-run-%02d", thread, i), ThreadID: thread,
			Sandbox: keeper.Setup{ID: "bench", Provider: ProviderName}}
	}
	var (
		wg    sync.WaitGroup
		gate  = make(chan struct{})
		res   = make([]keeper.StartResult, n)
		errs  = make([]error, n)
		lat   = make([]time.Duration, n)
		ready sync.WaitGroup
	)
	ready.Add(n)
	for i := range n {
		wg.Go(func() {
			ready.Done()
			<-gate
			t0 := time.Now()
			res[i], errs[i] = k.Start(ctx, in(i))
			lat[i] = time.Since(t0)
		})
	}
	ready.Wait()
	before := e.counter.Snapshot()
	t0 := time.Now()
	close(gate)
	wg.Wait()
	c := &Contention{Starts: n, Wall: time.Since(t0), Outcomes: map[keeper.Outcome]int{}, ByAPI: map[string]int{},
		Start: newOp("start under contention", 0, false)}
	for api, v := range e.counter.Snapshot() {
		if d := v - before[api]; d > 0 {
			c.ByAPI[api] = d
			c.Calls += d
		}
	}
	ids := map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			return nil, fmt.Errorf("bench: contended start %d: %w", i, errs[i])
		}
		c.Outcomes[res[i].Outcome]++
		ids[res[i].Sandbox.ProviderSandboxID] = true
		c.Start.Samples = append(c.Start.Samples, lat[i])
	}
	c.DistinctIDs = len(ids)
	pc := prov.Counts()
	c.Creates, c.Resumes, c.Destroys = pc.Creates, pc.Resumes, pc.Destroys // Restores: the provider cannot restore
	c.LockEntries = int(fb.entries.Load())
	row, err := store.Instances().GetRow(ctx, res[0].Sandbox.Key)
	if err != nil {
		return nil, fmt.Errorf("bench: read the contended row: %w", err)
	}
	c.RowMatches = row != nil && ids[row.ProviderSandboxID] && len(ids) == 1
	c.Holds = c.Creates == 1 && c.Restores == 0 && c.DistinctIDs == 1 && c.Destroys == 0 && c.RowMatches
	return c, nil
}
