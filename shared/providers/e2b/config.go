package e2b

import (
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Defaults for the zero fields of Config.
const (
	DefaultBaseURL        = "https://api.e2b.app"
	DefaultDomain         = "e2b.app"
	DefaultTemplate       = "base"
	DefaultUser           = "user"
	DefaultTimeout        = 5 * time.Minute
	DefaultSweepPeriod    = 5 * time.Minute
	DefaultRequestTimeout = 60 * time.Second
	DefaultMaxOutput      = 32 << 20

	// EnvdPort is the port envd listens on inside every E2B sandbox; it is part of the
	// sandbox's host name (<port>-<sandboxID>.<domain>).
	EnvdPort = 49983

	// LifetimeMargin is added to DetachedTTL + SweepPeriod: it covers one reaper run
	// budget, the destroy after it and clock skew between us and E2B.
	LifetimeMargin = 2 * time.Minute
)

// Retry bounds the retries of one operation. Delays use full jitter: a uniform draw in
// [0, min(Max, Base·2^n)], never past the ctx deadline.
type Retry struct {
	Attempts int           // total attempts per operation; 0 = 5
	Base     time.Duration // 0 = 200ms
	Max      time.Duration // 0 = 5s
}

// Config configures the E2B provider. APIKey and DetachedTTL are required.
type Config struct {
	APIKey  string // sent as X-API-Key; never logged, never in an error
	BaseURL string // control-plane API; "" = DefaultBaseURL
	// Domain is the sandbox domain: envd is reached at https://<EnvdPort>-<id>.<Domain>.
	// A domain E2B reports for a sandbox wins over this one. "" = DefaultDomain.
	Domain   string
	Template string // template id or alias to create from; "" = DefaultTemplate
	User     string // the sandbox user commands run as; "" = DefaultUser
	// Timeout is the least time to live asked for at create, resume and every probe.
	// The effective value is Lifetime(): never less than DetachedTTL + SweepPeriod +
	// LifetimeMargin, so the E2B timeout never ends a detached agent before the reaper
	// has had its chance. "" = DefaultTimeout.
	Timeout     time.Duration
	DetachedTTL time.Duration // the reaper's detached-run TTL (required)
	SweepPeriod time.Duration // how often the reaper sweeps; 0 = DefaultSweepPeriod
	// KillOnTimeout asks E2B to kill a sandbox whose time to live runs out. By default
	// (false) it is paused instead (autoPause at create): the thread's files survive a
	// time to live that ran out before sandkeep's idle stop paused it, and the next run
	// resumes them (docs/design.md §2.5).
	KillOnTimeout bool
	// HTTPClient carries every request (control plane and envd); nil = a client with
	// no overall timeout (RequestTimeout bounds each attempt instead).
	HTTPClient *http.Client
	// RequestTimeout bounds one attempt of a control-plane call; 0 = 60s. An Exec is
	// bounded by its ctx only.
	RequestTimeout time.Duration
	Retry          Retry
	MaxOutput      int          // bytes of stdout+stderr an Exec may return; 0 = 32 MiB
	Logger         *slog.Logger // nil = discard
}

// Provider is a contract.Provider over E2B's REST API, with Lookuper, StatusReader,
// Executor and EnvSetter. It is safe for concurrent use.
type Provider struct {
	cfg      Config
	base     string
	http     *http.Client
	log      *slog.Logger
	lifetime time.Duration

	mu    sync.Mutex
	conns map[string]*conn             // what envd calls need, per sandbox id
	env   map[string]map[string]string // per sandbox id, passed on every process start
}

// conn is what we know about reaching one sandbox's envd.
type conn struct {
	token       string // envd access token ("" for a sandbox created without secure)
	domain      string
	envdVersion string
	refreshed   time.Time // last time we set its time to live (monotonic)
}

// New validates cfg and returns the provider; ErrInvalid names a missing field.
func New(cfg Config) (*Provider, error) {
	if cfg.APIKey == "" {
		return nil, contract.Invalid("APIKey", "required")
	}
	if cfg.DetachedTTL <= 0 {
		return nil, contract.Invalid("DetachedTTL", "required: the reaper's detached-run TTL bounds the sandbox lifetime")
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if cfg.Domain == "" {
		cfg.Domain = DefaultDomain
	}
	if cfg.Template == "" {
		cfg.Template = DefaultTemplate
	}
	if cfg.User == "" {
		cfg.User = DefaultUser
	}
	if strings.ContainsAny(cfg.User, ":\x00\r\n") {
		return nil, contract.Invalid("User", "must not contain ':' or control characters")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.SweepPeriod <= 0 {
		cfg.SweepPeriod = DefaultSweepPeriod
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Retry.Attempts <= 0 {
		cfg.Retry.Attempts = 5
	}
	if cfg.Retry.Base <= 0 {
		cfg.Retry.Base = 200 * time.Millisecond
	}
	if cfg.Retry.Max <= 0 {
		cfg.Retry.Max = 5 * time.Second
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	life := max(cfg.Timeout, cfg.DetachedTTL+cfg.SweepPeriod+LifetimeMargin)
	if life/time.Second > math.MaxInt32 {
		return nil, contract.Invalid("DetachedTTL", "lifetime %s does not fit E2B's timeout field", life)
	}
	p := &Provider{
		cfg:      cfg,
		base:     strings.TrimRight(cfg.BaseURL, "/"),
		http:     cfg.HTTPClient,
		log:      cfg.Logger,
		lifetime: life,
		conns:    map[string]*conn{},
		env:      map[string]map[string]string{},
	}
	if p.http == nil {
		p.http = &http.Client{}
	}
	if p.log == nil {
		p.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return p, nil
}

// Name identifies the provider in sandbox keys and instance rows.
func (p *Provider) Name() string { return "e2b" }

// Lifetime is the time to live asked for on create, resume and every refresh:
// max(Timeout, DetachedTTL + SweepPeriod + LifetimeMargin).
func (p *Provider) Lifetime() time.Duration { return p.lifetime }

func (p *Provider) lifetimeSeconds() int { return int((p.lifetime + time.Second - 1) / time.Second) }

// remember records what a control-plane response told us about reaching a sandbox.
func (p *Provider) remember(id, token, domain, envdVersion string, refreshed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.conns[id]
	if c == nil {
		c = &conn{}
		p.conns[id] = c
	}
	if token != "" {
		c.token = token
	}
	if domain != "" {
		c.domain = domain
	}
	if envdVersion != "" {
		c.envdVersion = envdVersion
	}
	if refreshed {
		c.refreshed = time.Now()
	}
}

// forget drops everything held for a sandbox (it was destroyed or is gone).
func (p *Provider) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, id)
	delete(p.env, id)
}

// secrets are the strings no error or log line may carry.
func (p *Provider) secrets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []string{p.cfg.APIKey}
	for _, c := range p.conns {
		if c.token != "" {
			out = append(out, c.token)
		}
	}
	for _, m := range p.env {
		for _, v := range m {
			// Short values (flags, ports) would shred every message; a secret is longer.
			if len(v) >= 8 {
				out = append(out, v)
			}
		}
	}
	return out
}

// redactWith is redact that also removes the values of one process's own variables.
func (p *Provider) redactWith(extra map[string]string, s string) string {
	for _, v := range extra {
		if len(v) >= 8 {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return p.redact(s)
}

// redact replaces every secret in s and caps its length (s comes from a server).
func (p *Provider) redact(s string) string {
	for _, sec := range p.secrets() {
		s = strings.ReplaceAll(s, sec, "[redacted]")
	}
	const limit = 300
	if len(s) > limit {
		s = strings.ToValidUTF8(s[:limit], "") + "…"
	}
	return s
}
