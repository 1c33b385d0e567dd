package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// TestAttachEndsARunWhoseAgentNeverLaunched: `sandkeep dev --launch-deadline 2s`, a run
// started with POST /v1/runs and no agent (its host died between the two calls), then
// `sandkeep attach RUN`: the attach (or its first pump past the deadline) ends the run
// failed with agent-not-launched, and the command says so and exits 1 instead of pumping
// and heartbeating for ever.
func TestAttachEndsARunWhoseAgentNeverLaunched(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		res, err := http.Post(dev.URL+"/v1/runs", "application/json",
			strings.NewReader(`{"runId":"run-nl","threadId":"thread-nl","sandbox":{"id":"default","provider":"local-process"}}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("start: %d %s", res.StatusCode, b)
		}
		code, _, stderr := sk(t, dev, "attach", "run-nl")
		if code != 1 || !strings.Contains(stderr, keeper.CodeAgentNotLaunched) {
			t.Fatalf("attach exited %d; stderr:\n%s\nwant 1, naming %s", code, stderr, keeper.CodeAgentNotLaunched)
		}
		code, out, stderr := sk(t, dev, "runs", "get", "run-nl")
		if code != 0 || !strings.Contains(out, `"status": "failed"`) && !strings.Contains(out, `"status":"failed"`) ||
			!strings.Contains(out, keeper.CodeAgentNotLaunched) {
			t.Fatalf("runs get exited %d: %s %s", code, out, stderr)
		}
	}, "--launch-deadline", "2s")
}
