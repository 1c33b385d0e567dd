package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
)

// Reap is docs/design.md §11's reaper drain: N detached runs past the TTL, each on its own
// one-run sandbox (reuse "none", so the reaper reclaims it with its run: a thread's sandbox
// it would keep for the idle stop, docs/design.md §5), swept repeatedly until a sweep finds
// nothing.
type Reap struct {
	Runs       int
	Batch      int // the reaper's maxRuns
	Sweeps     int // sweeps that acted (the final empty sweep not included)
	Drained    bool
	Outcomes   map[reaper.Outcome]int
	Reaped     int // runs whose outcome ended them (expired, in-use, reclaim-failed)
	Aborted    int // runs read back aborted after the drain
	Destroys   int // provider Destroy calls
	Calls      int // DynamoDB calls of the acting sweeps
	ByAPI      map[string]int
	Scanned    int64 // items the acting sweeps' queries read
	EmptySweep int   // DynamoDB calls of the final, empty sweep (a sweep's fixed cost)
	Wall       time.Duration
	Sweep      *OpStats // each acting sweep's latency and calls
	Setup      time.Duration
}

// PerRun returns the DynamoDB calls per reaped run, sweep overhead included.
func (r *Reap) PerRun() float64 {
	if r.Reaped == 0 {
		return 0
	}
	return float64(r.Calls) / float64(r.Reaped)
}

// PerRunNet returns the calls per reaped run with each sweep's fixed cost (measured on the
// empty sweep) taken out.
func (r *Reap) PerRunNet() float64 {
	if r.Reaped == 0 {
		return 0
	}
	return float64(r.Calls-r.Sweeps*r.EmptySweep) / float64(r.Reaped)
}

// reapSkew moves the reaper's clock past the TTL, so runs detached just now are expired.
const (
	reapTTL  = time.Hour
	reapSkew = 2 * time.Hour
)

// reap sets up cfg.Reap detached runs (each with its own thread, one-run sandbox and row,
// as a start and a detach leave them) and sweeps until drained.
func (e *env) reap(ctx context.Context, table string) (*Reap, error) {
	n := e.cfg.Reap
	store := dynamostore.New(dynamostore.Config{Client: e.client, Table: table})
	prov := newMemProvider(ProviderName)
	tctx := contract.WithTenant(ctx, Tenant)
	t0 := time.Now()
	if err := parallel(n, e.cfg.Workers, func(i int) error { return e.detachedRun(tctx, store, prov, i) }); err != nil {
		return nil, err
	}
	r := &Reap{Runs: n, Batch: e.cfg.ReapBatch, Setup: time.Since(t0), Outcomes: map[reaper.Outcome]int{},
		ByAPI: map[string]int{}, Sweep: newOp("reaper sweep", 0, false)}
	rk, err := keeper.New(keeper.Config{Backend: store, Providers: []contract.Provider{prov}, Logger: e.quiet,
		Now: func() time.Time { return time.Now().Add(reapSkew) }})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rp, err := reaper.New(reaper.Config{Keeper: rk, DetachedRunTTL: reapTTL, MaxRuns: e.cfg.ReapBatch})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	// Every sweep acts on at least one run or ends the drain; the bound only stops a
	// reaper that keeps failing the same runs.
	maxSweeps := n/max(e.cfg.ReapBatch, 1) + 10
	start := time.Now()
	for range maxSweeps {
		var sr reaper.Report
		before, scanned := e.counter.Snapshot(), e.counter.Scanned()
		err := e.record(r.Sweep, func() (err error) { sr, err = rp.Sweep(ctx); return })
		if err != nil {
			return nil, fmt.Errorf("bench: sweep %d: %w", r.Sweeps+1, err)
		}
		if sr.Considered == 0 {
			// The final, empty sweep: its calls are a sweep's fixed cost, not a run's.
			last := len(r.Sweep.Samples) - 1
			r.EmptySweep = r.Sweep.Calls[last]
			r.Sweep.Samples, r.Sweep.Calls = r.Sweep.Samples[:last], r.Sweep.Calls[:last]
			r.Drained = true
			break
		}
		r.Sweeps++
		for api, v := range e.counter.Snapshot() {
			if d := v - before[api]; d > 0 {
				r.ByAPI[api] += d
				r.Calls += d
			}
		}
		r.Scanned += e.counter.Scanned() - scanned
		for _, o := range reaper.AllOutcomes {
			r.Outcomes[o] += sr.Outcomes.Get(o)
		}
	}
	r.Wall = time.Since(start)
	r.Reaped = r.Outcomes[reaper.Expired] + r.Outcomes[reaper.Finalized]
	r.Destroys = prov.Counts().Destroys
	// Read every run back (uncounted): the figures mean something only if they all ended.
	var aborted atomic.Int64
	err = parallel(n, e.cfg.Workers, func(i int) error {
		rec, err := store.Runs().State(tctx, reapRunID(i))
		if err != nil {
			return fmt.Errorf("bench: read back %s: %w", reapRunID(i), err)
		}
		if rec != nil && rec.Status == contract.StatusAborted {
			aborted.Add(1)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.Aborted = int(aborted.Load())
	return r, nil
}

func reapRunID(i int) string { return fmt.Sprintf("reap-%05d", i) }

// detachedRun leaves run i as a created start followed by a detach leaves it: the run at
// epoch 1 with its sandbox key and id, the instance row, and detachedSince = now. The
// sandbox is a reuse "none" one (keyed by the run, DestroyOnEnd), as keeper.Start writes it.
func (e *env) detachedRun(ctx context.Context, store *dynamostore.Store, prov contract.Provider, i int) error {
	run, thread := reapRunID(i), fmt.Sprintf("reap-th-%05d", i)
	key, err := contract.SandboxKey(contract.KeyInput{ThreadID: thread, SetupID: "bench", Provider: ProviderName, Tenant: Tenant, RunID: run})
	if err != nil {
		return fmt.Errorf("bench: key: %w", err)
	}
	psid, err := prov.Create(ctx, contract.CreateInput{Name: key})
	if err != nil {
		return fmt.Errorf("bench: create sandbox: %w", err)
	}
	now := time.Now().UnixMilli()
	rec := contract.InstanceRecord{Key: key, Provider: ProviderName, ProviderSandboxID: psid, ThreadID: thread, LatestRunID: run,
		UpdatedAt: now, DestroyOnEnd: true}
	if err := store.Instances().CreateRow(ctx, rec, randHex(16)); err != nil {
		return fmt.Errorf("bench: row of %s: %w", run, err)
	}
	cc := contract.CreateClaimedRun{
		NewRun:     contract.NewRun{RunID: run, ThreadID: thread, StartedAt: now, Status: contract.StatusRunning},
		SandboxKey: key, ProviderSandboxID: psid, LeaseUntil: now + contract.DefaultDriverLease, Token: randHex(16),
	}
	if _, _, err := store.Runs().CreateClaimed(ctx, cc); err != nil {
		return fmt.Errorf("bench: create %s: %w", run, err)
	}
	if _, err := store.Runs().Detach(ctx, run, 1, key, now); err != nil {
		return fmt.Errorf("bench: detach %s: %w", run, err)
	}
	return nil
}

// parallel runs f(0..n-1) on w goroutines and returns the first error (the rest still run).
func parallel(n, w int, f func(i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range max(w, 1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}
