package keeper_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/idlerace"
)

// TestIdleStopSerializesWithStart: a start that meets the reaper's idle stop half way (row
// marked stopping, provider stop pending) waits for the sandbox lock the stop holds and
// resumes the stopped sandbox: it never gets a sandbox that is stopping under it. The same
// race against a sweep whose stop skips the lock leaves the new run's sandbox stopped,
// which the test detects — on both backends, with local-process sandboxes (the Daytona
// and E2B stand-ins run the same race in their packages).
func TestIdleStopSerializesWithStart(t *testing.T) {
	t.Parallel()
	idlerace.Test(t, func(t *testing.T, gate *idlerace.Gate) idlerace.Provider {
		return idlerace.HeldStop{Provider: localprocess.New(t.TempDir()), Gate: gate}
	})
}
