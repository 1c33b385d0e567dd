package keeper

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// providerErr tells the observer of err, the result of a call to prov made on behalf of
// ctx, when it is a provider failure: not a sentinel, and ctx (the caller, or the lease)
// is not done. A provider slower than our own timeout counts. A sentinel (a gone sandbox,
// a refused input, a lost lease) is an answer, never counted. It returns err unchanged.
func (k *Keeper) providerErr(ctx context.Context, prov contract.Provider, err error) error {
	if err == nil || k.cfg.Observer == nil || ctx.Err() != nil || contract.IsSentinel(err) {
		return err
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
