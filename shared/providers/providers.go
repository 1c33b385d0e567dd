// Package providers builds the sandbox provider a deployment names from its settings: the
// one construction shared by the Lambda functions (shared/deploy/awsfn, settings from the
// environment) and every command of cmd/sandkeep (settings from flags), so the dev server,
// `sandkeep reap` and `sandkeep runs finish --force` act on the same providers the
// deployment runs.
package providers

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/daytona"
	"github.com/sandkeep/sandkeep/shared/providers/e2b"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// Provider names a deployment may select; each is the Name() of its provider.
const (
	LocalProcess = "local-process"
	Daytona      = daytona.Name
	E2B          = "e2b"
)

// Names returns every provider name, local-process first.
func Names() []string { return []string{LocalProcess, Daytona, E2B} }

// Known reports whether name is one of Names.
func Known(name string) bool { return slices.Contains(Names(), name) }

// Hosted reports whether the provider named name is a hosted one: it needs an API key, and
// the reaper's detached TTL and sweep period to keep its sandboxes alive past a detached
// run's expiry.
func Hosted(name string) bool { return name == Daytona || name == E2B }

// DaytonaSettings are the Daytona provider's settings besides its key ("" = its default).
type DaytonaSettings struct {
	BaseURL, Target, Snapshot string
}

// E2BSettings are the E2B provider's settings besides its key ("" = its default).
type E2BSettings struct {
	Template, Domain, BaseURL string
}

// Config selects one provider and holds its settings, parsed once by the caller's main.
type Config struct {
	// Name is one of Names.
	Name string
	// APIKey is a hosted provider's key; it never appears in an error.
	APIKey string
	// SandboxDir (local-process) is where sandboxes live; New creates it (0700).
	SandboxDir string
	// BaseEnv (local-process), when set, is the environment every sandbox command starts
	// from; unset, it is localprocess.MinimalEnv of this process's (never the whole of it:
	// an operator's or a function's environment holds credentials).
	BaseEnv []string
	Daytona DaytonaSettings
	E2B     E2BSettings
	// DetachedTTL and SweepPeriod are the reaper's: a hosted provider keeps its sandboxes
	// alive past DetachedTTL + SweepPeriod, so the reaper expires a detached run first.
	DetachedTTL, SweepPeriod time.Duration
}

// New builds the provider cfg names. Errors name the provider and the setting, never the
// key; an unknown name or a refused setting wraps contract.ErrInvalid.
func New(cfg Config) (contract.Provider, error) {
	switch cfg.Name {
	case LocalProcess:
		if cfg.SandboxDir == "" {
			return nil, contract.Invalid("provider local-process", "no sandbox directory")
		}
		if err := os.MkdirAll(cfg.SandboxDir, 0o700); err != nil {
			return nil, fmt.Errorf("provider local-process: sandbox dir: %w", err)
		}
		var opts []localprocess.Option
		if cfg.BaseEnv != nil {
			opts = append(opts, localprocess.WithBaseEnv(cfg.BaseEnv))
		}
		return localprocess.New(cfg.SandboxDir, opts...), nil
	case Daytona:
		d := cfg.Daytona
		p, err := daytona.New(daytona.Config{APIKey: cfg.APIKey, BaseURL: d.BaseURL, Target: d.Target,
			Snapshot: d.Snapshot, DetachedTTL: cfg.DetachedTTL, SweepPeriod: cfg.SweepPeriod})
		if err != nil {
			return nil, fmt.Errorf("provider daytona: %w", err)
		}
		return p, nil
	case E2B:
		e := cfg.E2B
		p, err := e2b.New(e2b.Config{APIKey: cfg.APIKey, BaseURL: e.BaseURL, Domain: e.Domain, Template: e.Template,
			DetachedTTL: cfg.DetachedTTL, SweepPeriod: cfg.SweepPeriod})
		if err != nil {
			return nil, fmt.Errorf("provider e2b: %w", err)
		}
		return p, nil
	}
	return nil, contract.Invalid("provider", "%q is not a known provider (one of %s, %s, %s)", cfg.Name, LocalProcess, Daytona, E2B)
}

// Where says where cfg's provider keeps its sandboxes, for a start-up line.
func (cfg Config) Where() string {
	switch cfg.Name {
	case Daytona:
		return "daytona at " + orDefault(cfg.Daytona.BaseURL, daytona.DefaultBaseURL)
	case E2B:
		return "e2b at " + orDefault(cfg.E2B.BaseURL, e2b.DefaultBaseURL)
	}
	return cfg.Name + " sandboxes under " + cfg.SandboxDir
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// ErrBaseURL: a provider base URL is not an absolute http(s) URL without credentials or
// query. Its message never holds the value (it may carry credentials).
var ErrBaseURL = errors.New("want an absolute http(s) URL without credentials or query")

// CheckBaseURL accepts "" (the provider's default) or an absolute http(s) URL without
// credentials or query; anything else is ErrBaseURL.
func CheckBaseURL(v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return ErrBaseURL
	}
	return nil
}

// ErrDomain: an E2B sandbox domain is not a bare domain.
var ErrDomain = errors.New("want a bare domain such as e2b.app")

// CheckDomain accepts "" (E2B's default) or a bare domain (no scheme, port, user or path).
func CheckDomain(v string) error {
	if strings.ContainsAny(v, "/:@ ") {
		return ErrDomain
	}
	return nil
}
