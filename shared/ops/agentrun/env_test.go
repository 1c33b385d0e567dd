package agentrun_test

import (
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/agenttest"
)

const dir = agenttest.Dir

// env is agenttest's world with this package's helpers.
type env struct{ *agenttest.Env }

func newEnv(t *testing.T, lease time.Duration) *env { return &env{agenttest.New(t, lease)} }

// newEnvOn is newEnv over backend b.
func newEnvOn(t *testing.T, lease time.Duration, b contract.Backend) *env {
	return &env{agenttest.NewOn(t, lease, b)}
}
