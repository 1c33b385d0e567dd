package testkit_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// localProvider is the provider factory of the negative controls of the takeover and reaper
// suites: a local-process provider (real /bin/sh) rooted in the case's temp dir. The suites
// themselves run through testkit.RunAll in memstore's and dynamostore's conformance tests.
func localProvider(t *testing.T) contract.Provider {
	return localprocess.New(t.TempDir())
}
