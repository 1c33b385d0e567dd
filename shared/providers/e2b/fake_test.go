package e2b

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/e2b/internal/e2bfake"
)

// subsetDocument is the OpenAPI subset the client is written against.
const subsetDocument = "testdata/e2b-subset.yaml"

// loadDocs reads the documents once per test binary (each fake parses its own copy).
var loadDocs = sync.OnceValues(func() (e2bfake.Docs, error) { return e2bfake.LoadDocs(subsetDocument) })

// fake is the local E2B plus what the tests here build on it.
type fake struct {
	*e2bfake.Server
	t *testing.T
}

func newFake(t *testing.T) *fake {
	t.Helper()
	docs, err := loadDocs()
	if err != nil {
		t.Fatal(err)
	}
	return &fake{Server: e2bfake.New(t, docs), t: t}
}

// config is a provider configuration aimed at the fake, with quick retries.
func (f *fake) config() Config {
	return Config{
		APIKey: e2bfake.APIKey, BaseURL: e2bfake.BaseURL, Domain: e2bfake.Domain, Template: "tmpl-test",
		DetachedTTL: 15 * time.Minute, SweepPeriod: time.Minute, HTTPClient: f.Client(),
		RequestTimeout: 5 * time.Second, Retry: Retry{Attempts: 4, Base: time.Millisecond, Max: 5 * time.Millisecond},
	}
}

func (f *fake) provider(mod ...func(*Config)) *Provider {
	f.t.Helper()
	cfg := f.config()
	for _, m := range mod {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// mustCreate creates a sandbox through p, failing the test on an error.
func mustCreate(ctx context.Context, t *testing.T, p *Provider, in contract.CreateInput) string {
	t.Helper()
	id, err := p.Create(ctx, in)
	if err != nil {
		t.Fatalf("create %s: %v", in.Name, err)
	}
	return id
}
