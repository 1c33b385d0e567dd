package main

import (
	"context"
	"errors"

	"github.com/sandkeep/sandkeep/shared/awsfn"
	"github.com/sandkeep/sandkeep/shared/reaper"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// reaperSweep builds the container's sweep: shared/reaper over the function's backend and
// provider, configured from the function's environment. A sweep that finds another in
// progress is no failure (it must not reach the dead-letter queue).
func reaperSweep(env awsfn.ReaperEnv) (awsfn.Sweep, error) {
	rp, err := reaper.New(reaper.Config{
		Backend:           env.Backend,
		Providers:         []sandbox.Provider{env.Provider},
		DetachedRunTTL:    env.Config.DetachedTTL,
		InstanceRetention: env.Config.InstanceRetention,
		DriverLease:       env.Config.DriverLease,
		LockLease:         env.Config.LockLease,
		Now:               env.Now,
		Logger:            env.Logger,
	})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (awsfn.Report, error) {
		rep, err := rp.Sweep(ctx)
		if errors.Is(err, reaper.ErrBusy) {
			err = nil
		}
		return rep, err
	}, nil
}
