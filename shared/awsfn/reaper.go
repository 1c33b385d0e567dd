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

	"github.com/sandkeep/sandkeep/shared/emf"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// ReaperDeadlineMargin is kept free before the invocation deadline: the sweep's context
// ends this much earlier so its report is still logged and returned.
const ReaperDeadlineMargin = 2 * time.Second

// Report is what one sweep reports (§5): marshalled as the invocation's result and logged
// as one JSON line; each outcome count becomes a ReapOutcome metric.
type Report interface {
	// OutcomeCounts returns the number of runs per outcome name (e.g. "reclaim-failed").
	OutcomeCounts() map[string]int
}

// Sweep runs one reaper sweep. It is the seam to shared/reaper: the reaper function wires
// whichever sweep exists (ListingSweep until the reaper lands).
type Sweep func(ctx context.Context) (Report, error)

// ReaperEnv is what a sweep is built from, once per container.
type ReaperEnv struct {
	Config   Config
	Backend  sandbox.Backend
	Provider sandbox.Provider
	Logger   *slog.Logger
	Now      func() time.Time
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
	prov, err := NewProvider(cfg)
	if err != nil {
		return nil, err
	}
	sweep, err := factory(ReaperEnv{Config: cfg, Backend: NewBackend(cfg, d.DynamoDB, d.Now), Provider: prov, Logger: d.Logger, Now: d.Now})
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

// ListingReport is the report of ListingSweep: what the reaper source offered, nothing
// acted on.
type ListingReport struct {
	NotBuilt        bool           `json:"notBuilt"` // always true: the reaper is not built yet
	Considered      int            `json:"considered"`
	Outcomes        map[string]int `json:"outcomes"`
	PendingReclaims int            `json:"pendingReclaims"`
	IdleInstances   int            `json:"idleInstances"`
	StaleIntents    int            `json:"staleIntents"`
}

// OutcomeCounts is empty: a listing acts on nothing.
func (r ListingReport) OutcomeCounts() map[string]int { return r.Outcomes }

// ListingSweep is the placeholder sweep until shared/reaper lands: it reads the reaper
// source (§2.7: reclaim candidates, pending reclaims, idle instances, stale intents; 25
// each) and reports the counts without acting on any of them, so a deployed reaper shows
// what it would work on and exercises its read permissions.
func ListingSweep(env ReaperEnv) (Sweep, error) {
	if env.Backend == nil {
		return nil, errors.New("a backend is required")
	}
	const limit = 25
	return func(ctx context.Context) (Report, error) {
		src := env.Backend.Reaper()
		now := env.Now().UnixMilli()
		rep := ListingReport{NotBuilt: true, Outcomes: map[string]int{}}
		cands, err := src.ReclaimCandidates(ctx, now, limit)
		if err != nil {
			return rep, fmt.Errorf("reap: reclaim candidates: %w", err)
		}
		rep.Considered = len(cands)
		pending, err := src.PendingReclaims(ctx, limit)
		if err != nil {
			return rep, fmt.Errorf("reap: pending reclaims: %w", err)
		}
		rep.PendingReclaims = len(pending)
		idle, err := src.IdleInstances(ctx, now-env.Config.InstanceRetention.Milliseconds(), limit)
		if err != nil {
			return rep, fmt.Errorf("reap: idle instances: %w", err)
		}
		rep.IdleInstances = len(idle)
		stale, err := src.StaleIntents(ctx, now-env.Config.LockLease.Milliseconds(), limit)
		if err != nil {
			return rep, fmt.Errorf("reap: stale intents: %w", err)
		}
		rep.StaleIntents = len(stale)
		env.Logger.LogAttrs(ctx, slog.LevelWarn, "reap: the reaper is not built yet; candidates listed, nothing acted on",
			slog.Int("considered", rep.Considered), slog.Duration("detachedTTL", env.Config.DetachedTTL))
		return rep, nil
	}, nil
}
