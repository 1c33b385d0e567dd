package e2bconformance

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m) }

// TestHostWithoutProviderKey: a `sandkeep run` process given only the API's URL drives an
// E2B run to completion; the key and the fake stay with the API.
func TestHostWithoutProviderKey(t *testing.T) {
	api := clitest.ServeAPI(t, provider(t))
	code, out, errOut := clitest.Run(t, clitest.HostEnv(api), clitest.Binary(t),
		"run", "--thread", "th-e2b", "--run", "run-e2b", "--provider", "e2b", "--",
		`for i in 1 2 3; do echo "{\"n\":$i}"; done`)
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(out, `{"offset":`) || !strings.Contains(out, `"data":{"n":3}`) {
		t.Fatalf("run on e2b: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "run run-e2b completed") {
		t.Fatalf("stderr: %s", errOut)
	}
}
