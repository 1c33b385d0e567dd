package e2b

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/testkit"
)

// TestJournalConformance runs the in-sandbox journal suite (§6) through this provider:
// every launch, read, follow and kill goes over the envd Connect stream to the fake,
// which runs the commands for real.
func TestJournalConformance(t *testing.T) {
	f := newFake(t)
	testkit.RunJournalConformance(t, func(t *testing.T) sandbox.Provider { return f.provider() })
}
