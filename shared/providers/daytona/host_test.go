package daytona_test

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m) }

// TestHostWithoutProviderKey: a `sandkeep run` process given only the API's URL drives a
// Daytona run to completion; the key and the fake stay with the API.
func TestHostWithoutProviderKey(t *testing.T) {
	prov, _ := newProvider(t, newFake(t, testKey))
	api := clitest.ServeAPI(t, prov)
	code, out, errOut := clitest.Run(t, clitest.HostEnv(api), clitest.Binary(t),
		"run", "--thread", "th-daytona", "--run", "run-daytona", "--provider", "daytona", "--",
		`for i in 1 2 3; do echo "{\"n\":$i}"; done`)
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(out, `"data":{"n":3}`) {
		t.Fatalf("run on daytona: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "run run-daytona completed") {
		t.Fatalf("stderr: %s", errOut)
	}
}
