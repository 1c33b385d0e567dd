package awsfn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
)

// ReaperDeadlineMargin is kept free before the invocation deadline: the sweep's context
// ends this much earlier so its report is still logged and returned.
const ReaperDeadlineMargin = 2 * time.Second

// Report is what one sweep reports (docs/design.md §5): marshalled as the invocation's result and logged
// as one JSON line; each outcome count becomes a ReapOutcome metric.
type Report interface {
	// OutcomeCounts returns the number of runs per outcome name (e.g. "reclaim-failed").
	OutcomeCounts() map[string]int
}

// Sweep runs one reaper sweep: the seam between the Lambda handler and shared/ops/reaper
// (ReaperSweep), replaceable in tests.
type Sweep func(ctx context.Context) (Report, error)

// ReaperEnv is what a sweep is built from, once per container: the function's settings
// and the keeper over its backend and provider (the reaper claims, ends and reclaims
// through it).
type ReaperEnv struct {
	Config Config
	Keeper *keeper.Keeper
}

// SweepFactory builds the sweep of a container.
type SweepFactory func(env ReaperEnv) (Sweep, error)

// ReaperHandler serves the scheduled event of EventBridge Scheduler; safe for concurrent
// use (the template reserves one concurrent execution anyway).
type ReaperHandler struct {
	sweep   Sweep
	log     *slog.Logger
	metrics *emf.Recorder
}

// NewReaper builds the reaper function of cfg with the sweep made by factory.
func NewReaper(cfg Config, d Deps, factory SweepFactory) (*ReaperHandler, error) {
	if cfg.Function != Reaper {
		return nil, fmt.Errorf("awsfn: %s is not the reaper", cfg.Function)
	}
	if cfg.DetachedTTL <= 0 {
		return nil, fmt.Errorf("%w: %s is not set", ErrConfig, EnvDetachedTTLSeconds)
	}
	d, err := d.withDefaults()
	if err != nil {
		return nil, err
	}
	prov, err := d.provider(cfg)
	if err != nil {
		return nil, err
	}
	backend := NewBackend(cfg, d.DynamoDB, d.Now)
	dl, err := d.deliverer(cfg, backend)
	if err != nil {
		return nil, err
	}
	k, err := keeper.New(keeper.Config{
		Backend:     backend,
		Push:        logPush(dl), // the finalization's events and close reach watchers
		Providers:   []contract.Provider{prov},
		DriverLease: cfg.DriverLease,
		// Every function applies the launch deadline it meets (docs/design.md §4.2).
		LaunchDeadline: cfg.LaunchDeadline,
		IdleStop:       cfg.IdleStop,
		Now:            d.Now,
		Logger:         d.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("awsfn: %w", err)
	}
	sweep, err := factory(ReaperEnv{Config: cfg, Keeper: k})
	if err != nil {
		return nil, fmt.Errorf("awsfn: build sweep: %w", err)
	}
	return &ReaperHandler{sweep: sweep, log: d.Logger, metrics: d.Metrics}, nil
}

// Handle runs one sweep for a scheduled event (its payload is ignored: the schedule only
// says "now"); it returns the report, or the sweep's error so the invocation fails and
// reaches the dead-letter queue. A panic in the sweep is recovered as an error.
func (h *ReaperHandler) Handle(ctx context.Context, _ json.RawMessage) (out json.RawMessage, err error) {
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-ReaperDeadlineMargin))
		defer cancel()
	}
	var rep Report
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("reap: sweep panicked: %v", p)
			}
		}()
		rep, err = h.sweep(ctx)
	}()
	attrs := []slog.Attr{}
	if rep != nil {
		counts := rep.OutcomeCounts()
		for _, name := range slices.Sorted(maps.Keys(counts)) {
			if n := counts[name]; n > 0 {
				h.metrics.Count("ReapOutcome", float64(n), "Outcome", name)
			}
		}
		b, merr := json.Marshal(rep)
		if merr != nil {
			return nil, errors.Join(err, fmt.Errorf("reap: marshal report: %w", merr))
		}
		out = b
		attrs = append(attrs, slog.Any("report", out))
	}
	if err != nil {
		h.log.LogAttrs(ctx, slog.LevelError, "reap: sweep failed", append(attrs, slog.String("error", err.Error()))...)
		return nil, err
	}
	h.log.LogAttrs(ctx, slog.LevelInfo, "reap: sweep done", attrs...)
	return out, nil
}

// ReaperSweep builds the container's sweep: shared/ops/reaper over the function's backend and
// provider, configured from the function's settings. With the API's public URL and the
// cursor key it replaces a shipped run's dead shipper once its lease lapsed, as the dev
// server's reaper does (docs/design.md §8.3): a scheduled event has no request to take the
// stage URL from, so the template gives the reaper that URL. A sweep that finds another in
// progress (reaper.ErrBusy) is no failure: it must not reach the dead-letter queue. The
// handler logs the report and sends the ReapOutcome metrics, so the reaper does neither.
func ReaperSweep(env ReaperEnv) (Sweep, error) {
	var ship *agentrun.ShipConfig
	if env.Config.PublicURL != "" && len(env.Config.CursorKey) > 0 {
		ship = &agentrun.ShipConfig{URL: env.Config.PublicURL, Key: env.Config.CursorKey}
	}
	rp, err := reaper.New(reaper.Config{
		Keeper:            env.Keeper,
		DetachedRunTTL:    env.Config.DetachedTTL,
		InstanceRetention: env.Config.InstanceRetention,
		IdleStop:          env.Config.IdleStop,
		LockLease:         env.Config.LockLease,
		QuietReport:       true,
		Ship:              ship,
	})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (Report, error) {
		rep, err := rp.Sweep(ctx)
		if errors.Is(err, reaper.ErrBusy) {
			err = nil
		}
		return rep, err
	}, nil
}
