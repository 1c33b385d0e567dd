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
	for name, nb := range idlerace.Backends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			race := func(broken bool) idlerace.Result {
				gate := idlerace.NewGate()
				prov := idlerace.HeldStop{Provider: localprocess.New(t.TempDir()), Gate: gate}
				return idlerace.Run(t, idlerace.Race{Backend: nb(t), Provider: prov, Gate: gate, Broken: broken})
			}
			if res := race(false); !res.Serialized() {
				t.Fatalf("the start got a sandbox that was stopped under it: %+v", res)
			}
			if res := race(true); res.Serialized() {
				t.Fatalf("the broken variant (a stop that skips the lock) was not caught: %+v", res)
			}
		})
	}
}
