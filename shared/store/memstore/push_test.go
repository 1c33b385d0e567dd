package memstore_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit"
)

// TestPushStoreConformance proves memstore's model of the deployed push's items
// (testkit.RunPushStoreConformance), the same suite dynalite passes.
func TestPushStoreConformance(t *testing.T) {
	testkit.RunPushStoreConformance(t, factory())
}
