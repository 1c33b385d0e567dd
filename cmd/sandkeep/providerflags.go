package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/providers"
)

// The environment variables holding the API keys of the hosted providers (never a flag: a
// flag is visible to every user in ps).
const (
	envDaytonaAPIKey = "SANDKEEP_DAYTONA_API_KEY"
	envE2BAPIKey     = "SANDKEEP_E2B_API_KEY"
)

// providerUsage documents the provider flags of every command that acts on sandboxes.
const providerUsage = `      provider flags (dev, reap, runs finish): [--provider local-process] [--sandbox-dir DIR]
        [--provider daytona] [--base-url URL] [--target REGION] [--snapshot NAME]  (key in $` + envDaytonaAPIKey + `)
        [--provider e2b] [--base-url URL] [--template NAME] [--domain DOMAIN]      (key in $` + envE2BAPIKey + `)
`

// defaultSandboxDir is where the local-process provider of the CLI keeps sandboxes (the dev
// server's default too).
func defaultSandboxDir() string { return filepath.Join(os.TempDir(), "sandkeep-sandboxes") }

// providerFlags are the provider flags of every command that acts on sandboxes (dev, reap,
// runs finish), so each builds its provider the way the deployment does (shared/providers).
type providerFlags struct {
	name, sandboxDir, baseURL          string
	target, snapshot, template, domain string
}

func (p *providerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.name, "provider", providers.LocalProcess, "sandbox provider: local-process, daytona ($"+envDaytonaAPIKey+") or e2b ($"+envE2BAPIKey+")")
	fs.StringVar(&p.sandboxDir, "sandbox-dir", defaultSandboxDir(), "directory of the local-process provider's sandboxes")
	fs.StringVar(&p.baseURL, "base-url", "", "daytona or e2b: the provider's API base URL (default: its hosted API)")
	fs.StringVar(&p.target, "target", "", "daytona: the region new sandboxes are created in (default: the organization's)")
	fs.StringVar(&p.snapshot, "snapshot", "", "daytona: the snapshot new sandboxes are created from (default: Daytona's)")
	fs.StringVar(&p.template, "template", "", "e2b: the template new sandboxes are created from (default: base)")
	fs.StringVar(&p.domain, "domain", "", "e2b: the sandbox domain (default: e2b.app)")
}

// config validates the parsed flags of fs (flags that belong to another provider are
// refused) and returns the provider's settings: a hosted provider's API key from getenv,
// and the reaper timing its sandboxes must outlive (detached TTL + sweep period).
func (p *providerFlags) config(fs *flag.FlagSet, getenv func(string) string, ttl, period time.Duration) (providers.Config, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	only := func(name, provider string) error {
		if set[name] && p.name != provider {
			return usageErr("--%s applies to --provider %s only", name, provider)
		}
		return nil
	}
	cfg := providers.Config{Name: p.name, DetachedTTL: ttl, SweepPeriod: period}
	var keyEnv string
	switch p.name {
	case providers.LocalProcess:
		if set["base-url"] {
			return cfg, usageErr("--base-url applies to --provider daytona or e2b only")
		}
		if p.sandboxDir == "" {
			return cfg, usageErr("--sandbox-dir must not be empty")
		}
		cfg.SandboxDir = p.sandboxDir
	case providers.Daytona:
		keyEnv = envDaytonaAPIKey
		cfg.Daytona = providers.DaytonaSettings{BaseURL: p.baseURL, Target: p.target, Snapshot: p.snapshot}
	case providers.E2B:
		keyEnv = envE2BAPIKey
		cfg.E2B = providers.E2BSettings{BaseURL: p.baseURL, Template: p.template, Domain: p.domain}
	default:
		return cfg, usageErr("--provider %q: want local-process, daytona or e2b", p.name)
	}
	for _, err := range []error{only("sandbox-dir", providers.LocalProcess), only("target", providers.Daytona),
		only("snapshot", providers.Daytona), only("template", providers.E2B), only("domain", providers.E2B)} {
		if err != nil {
			return cfg, err
		}
	}
	if err := providers.CheckBaseURL(p.baseURL); err != nil {
		return cfg, usageErr("--base-url: %v", err)
	}
	if err := providers.CheckDomain(p.domain); err != nil {
		return cfg, usageErr("--domain: %v", err)
	}
	if keyEnv != "" {
		if getenv != nil {
			cfg.APIKey = strings.TrimSpace(getenv(keyEnv))
		}
		if cfg.APIKey == "" {
			return cfg, usageErr("--provider %s needs its API key in $%s (never a flag: flags show in ps)", p.name, keyEnv)
		}
	}
	return cfg, nil
}
