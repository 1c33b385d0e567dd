package keeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store"
	"github.com/sandkeep/sandkeep/shared/store/wakeset"
)

// Defaults of Config.
const (
	DefaultResumeTimeout  = 10 * time.Second
	DefaultDestroyTimeout = 20 * time.Second
	DefaultCreateTimeout  = 5 * time.Minute
	DefaultStartWait      = 5 * time.Second
)

// New returns a Keeper over cfg; a missing backend is an error. Without providers, Start
// refuses every sandbox.provider and Snapshot is unsupported: a Lambda serving neither
// holds no provider, so no API key (awsfn.Function.UsesProvider).
func New(cfg Config) (*Keeper, error) {
	if cfg.Backend == nil {
		return nil, errors.New("keeper: a backend is required")
	}
	if cfg.DriverLease <= 0 {
		cfg.DriverLease = contract.DefaultDriverLease * time.Millisecond
	}
	if cfg.ReclaimMargin <= 0 {
		cfg.ReclaimMargin = DefaultReclaimMargin
	}
	if cfg.ResumeTimeout <= 0 {
		cfg.ResumeTimeout = DefaultResumeTimeout
	}
	if cfg.DestroyTimeout <= 0 {
		cfg.DestroyTimeout = DefaultDestroyTimeout
	}
	if cfg.IdleStop <= 0 {
		cfg.IdleStop = DefaultIdleStop
	}
	if cfg.CreateTimeout <= 0 {
		cfg.CreateTimeout = DefaultCreateTimeout
	}
	if cfg.StartWait <= 0 {
		cfg.StartWait = DefaultStartWait
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Wake == nil {
		cfg.Wake = &wakeset.Set[RunKey]{}
	}
	k := &Keeper{cfg: cfg, st: store.New(cfg.Backend, storePolicy), providers: map[string]contract.Provider{}, extenders: map[string]contract.LifeExtender{}, drain: make(chan struct{})}
	for _, p := range cfg.Providers {
		if p == nil {
			return nil, errors.New("keeper: nil provider")
		}
		if _, dup := k.providers[p.Name()]; dup {
			return nil, fmt.Errorf("keeper: provider %q configured twice", p.Name())
		}
		k.providers[p.Name()] = p
		if x, ok := p.(contract.LifeExtender); ok {
			k.extenders[p.Name()] = x
		}
	}
	return k, nil
}

// DriverLease returns the driver lease in effect (drivers heartbeat every third of it).
func (k *Keeper) DriverLease() time.Duration { return k.cfg.DriverLease }

// Config returns the configuration in effect, defaults applied: the reaper works with
// this keeper's backend, providers, clock, logger and timeouts rather than copies.
func (k *Keeper) Config() Config { return k.cfg }

// Get returns the run; unknown is ErrUnknownRun.
func (k *Keeper) Get(ctx context.Context, runID string) (contract.RunRecord, error) {
	st, err := k.st.Runs().State(ctx, runID)
	if err != nil {
		return contract.RunRecord{}, fmt.Errorf("keeper: get run: %w", err)
	}
	if st == nil {
		return contract.RunRecord{}, fmt.Errorf("keeper: get run %q: %w", runID, contract.ErrUnknownRun)
	}
	return st.RunRecord, nil
}

// ActiveRun returns the thread's active run, nil when idle.
func (k *Keeper) ActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	rec, err := k.st.Runs().FindActiveRun(ctx, threadID)
	if err != nil {
		return nil, fmt.Errorf("keeper: active run: %w", err)
	}
	return rec, nil
}
