package providers_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers"
)

// TestNewBuildsEveryNamedProvider: each name builds the provider of that name; a hosted one
// gets the reaper's timing (E2B's lifetime outlasts TTL + period) and its settings.
func TestNewBuildsEveryNamedProvider(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sb")
	for _, name := range providers.Names() {
		cfg := providers.Config{Name: name, APIKey: "k_0123456789", SandboxDir: dir,
			DetachedTTL: 20 * time.Minute, SweepPeriod: time.Minute}
		p, err := providers.New(cfg)
		if err != nil || p.Name() != name {
			t.Fatalf("New(%s) = %v, %v", name, p, err)
		}
		if providers.Hosted(name) == (name == providers.LocalProcess) || !providers.Known(name) {
			t.Fatalf("%s: Hosted %v, Known %v", name, providers.Hosted(name), providers.Known(name))
		}
		if name == providers.E2B {
			if lt := p.(interface{ Lifetime() time.Duration }).Lifetime(); lt < 21*time.Minute {
				t.Fatalf("e2b lifetime %v, want past the 20m TTL + 1m period", lt)
			}
		}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("local-process sandbox dir: %v %v", fi, err)
	}
	cfg := providers.Config{Name: providers.E2B, E2B: providers.E2BSettings{BaseURL: "http://127.0.0.1:9"}}
	if w := cfg.Where(); w != "e2b at http://127.0.0.1:9" {
		t.Fatalf("Where %q", w)
	}
	if w := (providers.Config{Name: providers.Daytona}).Where(); !strings.Contains(w, "app.daytona.io") {
		t.Fatalf("Where %q", w)
	}
}

// TestNewRefuses: an unknown name, a missing directory or key is refused, naming what is
// wrong and never the key.
func TestNewRefuses(t *testing.T) {
	const key = "secret_never_echoed"
	for _, cfg := range []providers.Config{
		{Name: "docker"},
		{Name: providers.LocalProcess},
		{Name: providers.Daytona},
		{Name: providers.E2B, APIKey: key}, // no detached TTL
	} {
		_, err := providers.New(cfg)
		if err == nil || !errors.Is(err, contract.ErrInvalid) || strings.Contains(err.Error(), key) {
			t.Errorf("New(%+v) = %v, want an ErrInvalid that hides the key", cfg.Name, err)
		}
	}
	for v, ok := range map[string]bool{"": true, "https://x.example/api": true, "http://127.0.0.1:9": true,
		"x.example": false, "ftp://x.example": false, "https://u:p@x.example": false, "https://x.example?a=1": false} {
		if err := providers.CheckBaseURL(v); (err == nil) != ok || (err != nil && strings.Contains(err.Error(), v)) {
			t.Errorf("CheckBaseURL(%q) = %v", v, err)
		}
	}
	for v, ok := range map[string]bool{"": true, "e2b.app": true, "https://e2b.app": false, "e2b.app:443": false} {
		if err := providers.CheckDomain(v); (err == nil) != ok {
			t.Errorf("CheckDomain(%q) = %v", v, err)
		}
	}
}
