package keeper

import "github.com/sandkeep/sandkeep/shared/contract"

// LeaseFresh reports whether st has a driver holding it now: not detached and its driver
// lease not yet run out. A shipped run's lease is renewed by its shipper's requests, so a
// fresh one is the first sign its shipper lives (docs/design.md §8.3).
func (k *Keeper) LeaseFresh(st contract.RunState) bool {
	return st.HeldAt(k.nowMs())
}
