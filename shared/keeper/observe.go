package keeper

import (
	"context"
	"errors"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// sentinels are the provider answers that are no failure of the provider (a gone sandbox,
// a refused input, a lost lease): never counted as provider errors.
var sentinels = []error{
	sandbox.ErrSandboxGone, sandbox.ErrInvalid, sandbox.ErrLeaseLost, sandbox.ErrConflict,
	sandbox.ErrUnknownRun, sandbox.ErrTerminalRun, sandbox.ErrSuperseded, sandbox.ErrLogClosed,
}

// providerErr tells the observer of err, the result of a call to prov made on behalf of
// ctx, when it is a provider failure: not a sentinel, and ctx (the caller, or the lease)
// is not done. A provider slower than our own timeout counts. It returns err unchanged.
func (k *Keeper) providerErr(ctx context.Context, prov sandbox.Provider, err error) error {
	if err == nil || k.cfg.Observer == nil || ctx.Err() != nil {
		return err
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return err
		}
	}
	k.cfg.Observer.ProviderError(ctx, prov.Name(), err)
	return err
}

// leaseLostSeen tells the observer that a start lost its sandbox lock lease.
func (k *Keeper) leaseLostSeen(ctx context.Context) {
	if k.cfg.Observer != nil {
		k.cfg.Observer.LeaseLost(ctx)
	}
}
