package keeper_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/keeper/keepertest"
	"github.com/sandkeep/sandkeep/shared/memstore"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// TestOpsMemstore runs every proof of the operations on the in-memory backend.
func TestOpsMemstore(t *testing.T) {
	keepertest.RunOpsSuite(t, func(t *testing.T, o keepertest.Options) sandbox.Backend {
		opts := []memstore.Option{memstore.WithLockTiming(o.Lock)}
		if o.DriverLease > 0 {
			opts = append(opts, memstore.WithDriverLease(o.DriverLease))
		}
		return memstore.New(opts...)
	})
}
