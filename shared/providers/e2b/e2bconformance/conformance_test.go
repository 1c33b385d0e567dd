// Package e2bconformance runs sandkeep's provider-facing conformance suites through the
// E2B provider against the local fake. It is a package of its own so the provider's
// contract tests never depend on the rest of the project building.
package e2bconformance

import (
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/e2b"
	"github.com/sandkeep/sandkeep/shared/providers/e2b/internal/e2bfake"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

var loadDocs = sync.OnceValues(func() (e2bfake.Docs, error) { return e2bfake.LoadDocs("../testdata/e2b-subset.yaml") })

// provider returns an E2B provider aimed at a fresh fake of its own.
func provider(t *testing.T) contract.Provider {
	p, _ := fakeProvider(t, nil, nil)
	return p
}

// fakeProvider returns an E2B provider aimed at a fresh fake of its own, and the fake: the
// fake on clock when not nil, mod applied to the provider's configuration when not nil.
func fakeProvider(t *testing.T, clock *manualclock.Clock, mod func(*e2b.Config)) (*e2b.Provider, *e2bfake.Server) {
	t.Helper()
	docs, err := loadDocs()
	if err != nil {
		t.Fatal(err)
	}
	f := e2bfake.New(t, docs)
	if clock != nil {
		f.SetClock(clock.Now)
	}
	cfg := e2b.Config{
		APIKey: e2bfake.APIKey, BaseURL: e2bfake.BaseURL, Domain: e2bfake.Domain,
		DetachedTTL: 15 * time.Minute, HTTPClient: f.Client(),
		Retry: e2b.Retry{Base: time.Millisecond, Max: 10 * time.Millisecond},
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, f
}

func memBackend(t *testing.T, o testkit.Options) contract.Backend {
	return memstore.New(memstore.WithLockTiming(o.Lock), memstore.WithDriverLease(o.DriverLease))
}

// TestJournalConformance runs the in-sandbox journal suite (docs/design.md §6) through the provider:
// every launch, read, follow and kill goes over envd's Connect stream to the fake,
// which runs the commands for real.
func TestJournalConformance(t *testing.T) {
	testkit.RunJournalConformance(t, provider)
}

// TestReaperConformance runs the reaper suite (docs/design.md §5) with the provider on memstore.
func TestReaperConformance(t *testing.T) {
	testkit.RunReaperConformance(t, memBackend, provider)
}

// TestTakeoverConformance runs the takeover suite with the provider on memstore.
func TestTakeoverConformance(t *testing.T) {
	testkit.RunTakeoverConformance(t, memBackend, provider)
}
