// Package reaper is sandkeep's scheduled reaper (docs/design.md §5): one bounded sweep finalizes runs
// that finished while detached, expires runs detached past the TTL (or cancelled), turns
// lapsed driver leases into detaches, reclaims sandboxes nobody uses (two-phase, never one
// in use, failed destroys retried), resolves stale resolve intents and sweeps journals.
// A sweep never panics and ends with one JSON report line.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

// SystemTenant is the tenant the sweep lock lives under. The reaper works across tenants,
// so its own lock belongs to none of them; this name is a valid docs/design.md §2.0 tenant that the HTTP
// layer never produces from authentication (it starts with "_", which the JWT/IAM tenants
// of a deployment are not expected to use), and a clash would only make one sweep wait.
const SystemTenant = "_sandkeep-system"

// SweepLockKey is the lock key that keeps one sweep at a time (docs/design.md §5).
const SweepLockKey = "reaper:sweep"

// ErrBusy: another sweep holds the sweep lock; this one did nothing.
var ErrBusy = errors.New("reaper: another sweep is in progress")

// Defaults of Config.
const (
	DefaultMaxRuns           = 25
	DefaultRunBudget         = 30 * time.Second
	DefaultDeadlineMargin    = 5 * time.Second
	DefaultInstanceRetention = 24 * time.Hour
	DefaultLockWait          = 2 * time.Second
	DefaultHousekeepingLimit = 25 // pending reclaims, idle rows, intents per sweep
	// DefaultIdleStopLimit: idle sandboxes one sweep lists to stop. Larger than the other
	// housekeeping because every idle minute past the grace is billed (docs/design.md §5):
	// a burst of threads ending together is stopped by one sweep. One Query page per shard
	// holds it (the index projects a key and a tenant); the sweep's deadline bounds the time.
	DefaultIdleStopLimit    = 100
	DefaultJournalSandboxes = 10 // sandboxes whose journal directory one sweep lists
	DefaultJournalDeletes   = 200
)

// Config configures a Reaper.
type Config struct {
	// Keeper is required: the reaper claims, appends, finishes and reclaims through it, and
	// works with its backend, providers (selected by an instance row's Provider name),
	// driver lease, reclaim margin, destroy timeout, clock and logger.
	Keeper *keeper.Keeper
	// DetachedRunTTL is required: a run detached this long (inclusive) is expired.
	DetachedRunTTL time.Duration
	MaxRuns        int           // runs acted on per sweep (default 25; probes left alone do not count)
	RunBudget      time.Duration // per run (default 30 s), never past ctx's deadline minus DeadlineMargin
	DeadlineMargin time.Duration // default 5 s
	// InstanceRetention: instance rows untouched this long with no non-terminal run are
	// reclaimed (default 24 h; negative disables the idle sweep).
	InstanceRetention time.Duration
	// IdleStop is the idle grace: a sandbox whose key has no live run and whose latest run
	// ended this long ago is stopped (default keeper.DefaultIdleStop, 10 min; negative
	// disables the idle stop, docs/design.md §5).
	IdleStop time.Duration
	// IdleStopLimit: idle sandboxes listed to stop per sweep (default DefaultIdleStopLimit);
	// the stops end early once ctx's deadline less DeadlineMargin is reached.
	IdleStopLimit int
	LockLease     time.Duration // intents older than this are stale (default the lock lease, 15 s)
	LockWait      time.Duration // how long to wait for the sweep lock (default 2 s)
	JournalDir    string        // journal directory inside sandboxes ("" = the provider's, journal.DirFor)
	// Ship starts a new shipper for a shipped run whose driver lease lapsed while its
	// agent runs and whose shipper died (docs/design.md §8.3); nil: such a run is left
	// alone as producing, for an attach or the TTL.
	Ship *agentrun.ShipConfig
	// QuietReport: Sweep does not log its report line (the caller logs the report it
	// returns, e.g. the Lambda handler); failures are still logged.
	QuietReport bool
	Metrics     *emf.Recorder // ReapOutcome{Outcome} per sweep; nil records nothing
}

// Reaper sweeps; safe for concurrent use (sweeps exclude each other through the lock).
type Reaper struct {
	cfg Config
	k   *keeper.Keeper
	kc  keeper.Config // the keeper's configuration in effect
	// st is the keeper's backend behind the store layer (shared/store): a call that failed
	// with an infrastructure error is repeated with the same arguments and token under the
	// shared policy, so a write whose response was lost is recognised as this call's own
	// landed attempt. The reaper keeps the last error as it is (its report names it).
	st        store.Store
	providers map[string]contract.Provider
}

// New validates cfg and returns a Reaper; a missing keeper or TTL is an error, and so is a
// keeper without providers (nothing could be reclaimed).
func New(cfg Config) (*Reaper, error) {
	switch {
	case cfg.Keeper == nil:
		return nil, errors.New("reaper: a keeper is required")
	case len(cfg.Keeper.Config().Providers) == 0:
		return nil, errors.New("reaper: at least one provider is required")
	case cfg.DetachedRunTTL <= 0:
		return nil, errors.New("reaper: the detached-run TTL is required (no default)")
	}
	if cfg.MaxRuns <= 0 {
		cfg.MaxRuns = DefaultMaxRuns
	}
	if cfg.RunBudget <= 0 {
		cfg.RunBudget = DefaultRunBudget
	}
	if cfg.DeadlineMargin <= 0 {
		cfg.DeadlineMargin = DefaultDeadlineMargin
	}
	if cfg.InstanceRetention == 0 {
		cfg.InstanceRetention = DefaultInstanceRetention
	}
	if cfg.IdleStop == 0 {
		cfg.IdleStop = keeper.DefaultIdleStop
	}
	if cfg.IdleStopLimit <= 0 {
		cfg.IdleStopLimit = DefaultIdleStopLimit
	}
	if cfg.LockLease <= 0 {
		cfg.LockLease = contract.DefaultLockLease
	}
	if cfg.LockWait <= 0 {
		cfg.LockWait = DefaultLockWait
	}
	return newReaper(cfg), nil
}

// newReaper is a Reaper over cfg as given (New validates and defaults it).
func newReaper(cfg Config) *Reaper {
	kc := cfg.Keeper.Config()
	r := &Reaper{cfg: cfg, k: cfg.Keeper, kc: kc, st: store.New(kc.Backend, storecall.Policy{}), providers: map[string]contract.Provider{}}
	for _, p := range r.kc.Providers {
		r.providers[p.Name()] = p
	}
	return r
}

// Sweep runs one sweep under the sweep lock and returns its report (also logged as one
// JSON line and counted as ReapOutcome metrics): every candidate and housekeeping item is
// classified from reads, then acted on. It never panics; ErrBusy when another sweep holds
// the lock; other errors are listing failures (the report holds what was done).
func (r *Reaper) Sweep(ctx context.Context) (Report, error) {
	return r.run(ctx, false, func(sctx context.Context, rep *Report) error {
		return r.exclusive(sctx, func(lctx context.Context) error {
			return r.sweep(lctx, rep, acting{r})
		})
	})
}

// DryRun classifies what a sweep would find now and reports what it would do, acting on
// nothing: it lists, re-reads and probes only (no lock, no write, no destroy). Runs are
// marked dryRun, housekeeping is listed in Planned; it is logged as one line but counts no
// metrics.
func (r *Reaper) DryRun(ctx context.Context) (Report, error) {
	return r.run(ctx, true, func(sctx context.Context, rep *Report) error {
		// A dry run writes nothing, the sweep lock's item included; it needs no exclusion.
		return r.sweep(sctx, rep, planning{r})
	})
}

// run runs body in the system tenant, recovers a panic as an error and emits the report.
func (r *Reaper) run(ctx context.Context, dry bool, body func(context.Context, *Report) error) (rep Report, err error) {
	rep.Runs = []RunEntry{}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reaper: sweep panicked: %v\n%s", p, debug.Stack())
		}
		r.emit(ctx, rep, err, dry)
	}()
	err = body(contract.WithTenant(ctx, SystemTenant), &rep)
	return rep, err
}

// executor carries a sweep's decisions out. Classification is the same for a sweep and a
// dry run; only this differs: acting writes (Sweep), planning reports what acting would do
// (DryRun).
type executor interface {
	// run carries out d: the run's report line (nil: nothing to report) and the sandbox
	// kept for another run, whose journals are then swept.
	run(ctx context.Context, d Decision, rep *Report) (*RunEntry, *keptSandbox)
	// chore carries out one housekeeping decision.
	chore(ctx context.Context, c chore, rep *Report)
}

// acting is a sweep's executor: it writes what each decision says.
type acting struct{ *Reaper }

// run acts on d (Reaper.act).
func (a acting) run(ctx context.Context, d Decision, rep *Report) (*RunEntry, *keptSandbox) {
	return a.act(ctx, d, rep)
}

// exclusive runs fn under the sweep lock, waiting at most LockWait to get it: a sweep that
// finds another in progress gives up (ErrBusy) rather than queueing behind it.
func (r *Reaper) exclusive(ctx context.Context, fn func(context.Context) error) error {
	return r.lockWithin(ctx, SweepLockKey, ErrBusy, fn)
}

// lockWithin runs fn under the lock on key, waiting at most LockWait to get it (busy when
// the wait runs out). Only the wait is bounded: fn's context is not, so the work under the
// lock (a destroy with its own timeout) is never cut short by what is left of the wait.
func (r *Reaper) lockWithin(ctx context.Context, key string, busy error, fn func(context.Context) error) error {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var state atomic.Int32 // 0 waiting, 1 acquired, 2 gave up
	t := time.AfterFunc(r.cfg.LockWait, func() {
		if state.CompareAndSwap(0, 2) {
			cancel(busy)
		}
	})
	defer t.Stop()
	err := r.st.Locks().WithLock(actx, key, func(lctx context.Context) error {
		if !state.CompareAndSwap(0, 1) {
			return busy
		}
		return fn(lctx)
	})
	if state.Load() == 2 {
		return busy
	}
	return err
}

// emit logs the report as one JSON line and records the outcome metrics.
func (r *Reaper) emit(ctx context.Context, rep Report, err error, dry bool) {
	switch {
	case !r.cfg.QuietReport:
		attrs := []any{"report", rep, "dryRun", dry}
		if err != nil {
			attrs = append(attrs, "err", err.Error())
		}
		r.kc.Logger.InfoContext(ctx, "reap", attrs...)
	case err != nil && !errors.Is(err, ErrBusy):
		r.kc.Logger.ErrorContext(ctx, "reap: sweep failed", "err", err.Error())
	}
	if dry {
		return
	}
	counts := rep.OutcomeCounts()
	for _, name := range metricNames() {
		r.cfg.Metrics.Count("ReapOutcome", float64(counts[name]), "Outcome", name)
	}
	// The cost signal (docs/design.md §5): the listed sandboxes this sweep found running
	// past the grace with no live run (Lifecycle.IdleRunning says exactly which), and what
	// the lifecycle did.
	r.cfg.Metrics.Count("IdleRunningSandboxes", float64(rep.Lifecycle.IdleRunning))
	for _, a := range []struct {
		name string
		n    int
	}{{"stopped", rep.Lifecycle.Stopped}, {"resumed", rep.Lifecycle.Resumed}, {"destroyed", rep.Lifecycle.Destroyed}} {
		r.cfg.Metrics.Count("SandboxLifecycle", float64(a.n), "Action", a.name)
	}
}

// sweep is one sweep's body (a real one under the lock): pending reclaims first, then
// candidate runs, then idle sandboxes to stop, idle rows, stale intents and journals, each classified then carried
// out by x. The journal sweep follows the sandboxes kept for another run by runs this sweep
// ended (a dry run ends none).
func (r *Reaper) sweep(ctx context.Context, rep *Report, x executor) error {
	now := r.kc.Now().UnixMilli()
	var errs []error
	errs = append(errs, r.pendingReclaims(ctx, rep, x))
	kept, err := r.candidates(ctx, now, rep, x)
	errs = append(errs, err)
	if r.cfg.IdleStop > 0 {
		errs = append(errs, r.idleStops(ctx, now, rep, x))
	}
	if r.cfg.InstanceRetention > 0 {
		errs = append(errs, r.idleInstances(ctx, now, rep, x))
	}
	errs = append(errs, r.staleIntents(ctx, now, rep, x))
	r.sweepJournals(ctx, now, kept, rep)
	rep.countDestroys()
	return errors.Join(errs...)
}

// runBudget returns the budget for one run: RunBudget, capped by ctx's deadline minus the
// margin; <= 0 means no run may start.
func (r *Reaper) runBudget(ctx context.Context) time.Duration {
	b := r.cfg.RunBudget
	if dl, ok := ctx.Deadline(); ok {
		b = min(b, time.Until(dl)-r.cfg.DeadlineMargin)
	}
	return b
}

// candidates classifies reclaim candidates, cancelled first then oldest, and has x carry
// each decision out, until MaxRuns runs were acted on. It returns the sandboxes kept for
// another run (their journals are swept).
func (r *Reaper) candidates(ctx context.Context, now int64, rep *Report, x executor) ([]keptSandbox, error) {
	// Probes left alone do not use a slot: list enough to fill MaxRuns past a few of them.
	cands, err := r.st.Reaper().ReclaimCandidates(ctx, now, 3*r.cfg.MaxRuns)
	if err != nil {
		r.kc.Logger.ErrorContext(ctx, "reap: listing reclaim candidates failed", "err", err)
		return nil, fmt.Errorf("reaper: list candidates: %w", err)
	}
	var kept []keptSandbox
	acted := 0
	for _, c := range cands {
		if acted >= r.cfg.MaxRuns || ctx.Err() != nil || r.runBudget(ctx) <= 0 {
			break
		}
		d := r.classify(ctx, c, now)
		r.tally(rep, d)
		e, ks := x.run(ctx, d, rep)
		if e == nil {
			continue
		}
		rep.add(*e)
		if e.Outcome != Producing && e.Outcome != Unknown {
			acted++
		}
		if ks != nil {
			kept = append(kept, *ks)
		}
	}
	return kept, nil
}
