package awsfn

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers"
)

// Environment settings every function reads once at cold start (template.yaml sets them).
const (
	EnvTable              = "SANDKEEP_TABLE"
	EnvStage              = "SANDKEEP_STAGE"
	EnvCursorKeyARN       = "SANDKEEP_CURSOR_KEY_ARN"
	EnvCursorKey          = "SANDKEEP_CURSOR_KEY" // tests and the emulator only: used when no ARN is set
	EnvAuthMode           = "SANDKEEP_AUTH_MODE"
	EnvTenantClaim        = "SANDKEEP_TENANT_CLAIM"
	EnvTrustedRoleARNs    = "SANDKEEP_TRUSTED_ROLE_ARNS" // IAM mode: required, the roles that may name tenants
	EnvProvider           = "SANDKEEP_PROVIDER"
	EnvProviderSecretARN  = "SANDKEEP_PROVIDER_SECRET_ARN"
	EnvProviderAPIKey     = "SANDKEEP_PROVIDER_API_KEY" // tests and the emulator only: used when no ARN is set
	EnvSandboxDir         = "SANDKEEP_SANDBOX_DIR"      // local-process only
	EnvLockLeaseMs        = "SANDKEEP_LOCK_LEASE_MS"
	EnvDriverLeaseMs      = "SANDKEEP_DRIVER_LEASE_MS"
	EnvLaunchDeadlineMs   = "SANDKEEP_LAUNCH_DEADLINE_MS"
	EnvLogRetentionDays   = "SANDKEEP_LOG_RETENTION_DAYS"
	EnvDetachedTTLSeconds = "SANDKEEP_DETACHED_TTL_SECONDS"       // reaper, daytona, e2b: required
	EnvReapSchedule       = "SANDKEEP_REAP_SCHEDULE"              // daytona, e2b: required (the reaper's rate expression)
	EnvInstanceRetention  = "SANDKEEP_INSTANCE_RETENTION_SECONDS" // reaper
	EnvIdleStop           = "SANDKEEP_IDLE_STOP_SECONDS"          // the idle grace (docs/design.md §5)
	EnvDynamoDBEndpoint   = "SANDKEEP_DYNAMODB_ENDPOINT"          // tests and the emulator only
	// EnvPublicURL is the API's base URL as sandboxes reach it (the functions that launch
	// and replace shippers); "" = each request's own stage URL (StageURL, docs/design.md §9).
	EnvPublicURL = "SANDKEEP_PUBLIC_URL"
	// EnvMaxWaitingPerTenant bounds each tenant's waiting requests in one container (API
	// functions; default httpapi.DefaultMaxWaiting).
	EnvMaxWaitingPerTenant = "SANDKEEP_MAX_WAITING_PER_TENANT"

	// Provider settings; empty means the provider's default.
	EnvDaytonaBaseURL  = "SANDKEEP_DAYTONA_BASE_URL"
	EnvDaytonaTarget   = "SANDKEEP_DAYTONA_TARGET"
	EnvDaytonaSnapshot = "SANDKEEP_DAYTONA_SNAPSHOT"
	EnvE2BTemplate     = "SANDKEEP_E2B_TEMPLATE"
	EnvE2BDomain       = "SANDKEEP_E2B_DOMAIN"
	EnvE2BBaseURL      = "SANDKEEP_E2B_BASE_URL"
)

// EnvProviderSecret is the former name of EnvProviderAPIKey.
//
// Deprecated: use EnvProviderAPIKey.
const EnvProviderSecret = EnvProviderAPIKey

// Provider names a deployment may select (shared/providers).
const (
	ProviderLocalProcess = providers.LocalProcess
	ProviderDaytona      = providers.Daytona
	ProviderE2B          = providers.E2B
)

// DefaultSandboxDir is where the local-process provider keeps sandboxes in a Lambda (the
// only writable directory there is /tmp).
const DefaultSandboxDir = "/tmp/sandkeep-sandboxes"

// Auth modes of the HTTP API.
const (
	AuthIAM = "IAM"
	AuthJWT = "JWT"
)

// ErrConfig marks a setting that is missing or malformed; the message names the setting.
var ErrConfig = errors.New("invalid configuration")

// Config is one function's validated configuration.
type Config struct {
	Function Function
	Table    string
	Stage    string
	// CursorKey signs cursors (API functions) and mints ship tokens (those and the reaper,
	// which replaces dead shippers; nil for a reaper that starts none).
	CursorKey   []byte
	AuthMode    string // AuthIAM or AuthJWT
	TenantClaim string // JWT claim naming the tenant
	// TrustedRoles are the roles whose sessions may name the tenant (IAM mode only;
	// required there).
	TrustedRoles TrustedRoles
	// Provider names the sandbox provider; "" for a function that never calls it
	// (Function.UsesProvider).
	Provider string
	// ProviderSecret is the provider's API key when the provider needs one.
	ProviderSecret string
	SandboxDir     string // local-process only
	// Daytona and E2B are the settings of those providers (zero values: their defaults).
	Daytona     DaytonaSettings
	E2B         E2BSettings
	LockLease   time.Duration
	DriverLease time.Duration
	// LaunchDeadline: a run with no agent this long after its creation is ended failed
	// (keeper.Config.LaunchDeadline; default keeper.DefaultLaunchDeadline).
	LaunchDeadline time.Duration
	LogRetention   time.Duration
	// DetachedTTL is the reaper's detached-run TTL: required by the reaper and by every
	// function of a daytona or e2b deployment (their sandboxes must outlive it).
	DetachedTTL time.Duration
	// SweepPeriod is the reaper's schedule period (SANDKEEP_REAP_SCHEDULE); required with
	// daytona and e2b, for the same reason.
	SweepPeriod time.Duration
	// InstanceRetention is the reaper's (zero for API functions).
	InstanceRetention time.Duration
	// IdleStop is the idle grace: the reaper stops a sandbox whose key has no live run this
	// long after its latest run ended; an API function's run end lists a setup's shorter
	// grace against it (keeper.Config.IdleStop).
	IdleStop time.Duration
	// DynamoDBEndpoint overrides the DynamoDB endpoint (tests and the emulator).
	DynamoDBEndpoint string
	// MaxWaiting bounds each tenant's concurrently waiting requests in this container
	// (httpapi.Config.MaxWaiting; API functions only).
	MaxWaiting int
	// PublicURL is httpapi.Config.PublicURL (SANDKEEP_PUBLIC_URL).
	PublicURL string
	// PushEndpoint is the WebSocket API's management endpoint (EnvPushEndpoint; "" none):
	// a function that stores events pushes them to the run's subscribers through it.
	PushEndpoint string
	// PushURL is the WebSocket API's URL (EnvPushURL; JWT deployments, the resolve
	// function): POST /v1/push/ticket issues tickets for it (httpapi.Config.PushTicketURL).
	PushURL string
	// PushMaxConnections and PushMaxSubscriptions bound the push function's tenants and
	// connections (EnvPushMaxConnections, EnvPushMaxSubscriptions).
	PushMaxConnections, PushMaxSubscriptions int
}

// DaytonaSettings are the Daytona provider's settings besides its key.
type DaytonaSettings = providers.DaytonaSettings

// E2BSettings are the E2B provider's settings besides its key.
type E2BSettings = providers.E2BSettings

// SecretSource reads a secret by ARN (Secrets Manager secret or SSM parameter).
type SecretSource interface {
	// Secret returns the secret's value; an empty value is an error.
	Secret(ctx context.Context, arn string) (string, error)
}

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// Load reads and validates fn's settings from getenv; secrets named by ARN are read
// through secrets (only when an ARN is set). Every error wraps ErrConfig and names the
// setting, so a function refusing to start says exactly what to fix.
func Load(ctx context.Context, fn Function, getenv func(string) string, secrets SecretSource) (Config, error) {
	if !fn.valid() {
		return Config{}, configErr("unknown function %q", fn)
	}
	get := func(k string) string { return strings.TrimSpace(getenv(k)) }
	cfg := Config{
		Function:         fn,
		Table:            get(EnvTable),
		Stage:            get(EnvStage),
		AuthMode:         get(EnvAuthMode),
		TenantClaim:      get(EnvTenantClaim),
		Provider:         get(EnvProvider),
		DynamoDBEndpoint: get(EnvDynamoDBEndpoint),
	}
	if cfg.Table == "" {
		return Config{}, configErr("%s is not set (the DynamoDB table name)", EnvTable)
	}
	if u := get(EnvPublicURL); u != "" {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" || pu.RawQuery != "" || pu.Fragment != "" {
			return Config{}, configErr("%s %q is not an absolute http(s) URL", EnvPublicURL, u)
		}
		cfg.PublicURL = strings.TrimRight(u, "/")
	}
	var err error
	if cfg.LockLease, err = millis(get, EnvLockLeaseMs, contract.DefaultLockLease, 2*time.Second); err != nil {
		return Config{}, err
	}
	if cfg.DriverLease, err = millis(get, EnvDriverLeaseMs, contract.DefaultDriverLease*time.Millisecond, 5*time.Second); err != nil {
		return Config{}, err
	}
	if cfg.LaunchDeadline, err = millis(get, EnvLaunchDeadlineMs, keeper.DefaultLaunchDeadline, time.Second); err != nil {
		return Config{}, err
	}
	days, err := integer(get, EnvLogRetentionDays, 30, 1)
	if err != nil {
		return Config{}, err
	}
	cfg.LogRetention = time.Duration(days) * 24 * time.Hour
	idle, err := integer(get, EnvIdleStop, int64(keeper.DefaultIdleStop/time.Second), 1)
	if err != nil {
		return Config{}, err
	}
	cfg.IdleStop = time.Duration(idle) * time.Second

	// A function that never calls the provider ignores its settings and never reads its
	// key: the secret stays out of its memory and its role.
	if fn.UsesProvider() {
		if err := cfg.loadProvider(ctx, get, secrets); err != nil {
			return Config{}, err
		}
	} else {
		cfg.Provider = ""
	}
	if err := cfg.loadPush(get); err != nil {
		return Config{}, err
	}

	if fn == Reaper {
		if cfg.DetachedTTL == 0 {
			return Config{}, configErr("%s is not set (how long a detached run may wait before the reaper expires it; no default)", EnvDetachedTTLSeconds)
		}
		ret, err := integer(get, EnvInstanceRetention, 7*24*3600, 1)
		if err != nil {
			return Config{}, err
		}
		cfg.InstanceRetention = time.Duration(ret) * time.Second
		// Told where sandboxes reach the API, the reaper replaces dead shippers too
		// (docs/design.md §8.3) and needs the key that mints their tokens; without that
		// address it starts none and the next attach replaces them.
		if cfg.PublicURL != "" {
			if cfg.CursorKey, err = cursorKey(ctx, get, secrets); err != nil {
				return Config{}, fmt.Errorf("%w (the reaper starts shippers at %s)", err, EnvPublicURL)
			}
		}
		return cfg, nil
	}

	if fn == Ship {
		// The ship routes take a run's ship token as their only credential (no IAM, no
		// JWT, no tenant header): the function reads the key that verifies the token and
		// no authentication setting (docs/design.md §9).
		cfg.AuthMode, cfg.TenantClaim = "", ""
		if cfg.CursorKey, err = cursorKey(ctx, get, secrets); err != nil {
			return Config{}, err
		}
		return cfg, nil
	}

	// API functions: authentication and the cursor key.
	switch cfg.AuthMode {
	case "":
		cfg.AuthMode = AuthIAM
	case AuthIAM, AuthJWT:
	default:
		return Config{}, configErr("%s=%q: want %s or %s", EnvAuthMode, cfg.AuthMode, AuthIAM, AuthJWT)
	}
	if cfg.TenantClaim == "" {
		cfg.TenantClaim = httpapi.DefaultTenantClaim
	}
	maxWaiting, err := integer(get, EnvMaxWaitingPerTenant, httpapi.DefaultMaxWaiting, 1)
	if err != nil {
		return Config{}, err
	}
	cfg.MaxWaiting = int(maxWaiting)
	if cfg.AuthMode == AuthIAM {
		// Without it any principal allowed to invoke the API could name any tenant.
		roles, err := ParseTrustedRoles(get(EnvTrustedRoleARNs))
		if err != nil {
			return Config{}, configErr("%s %v: IAM mode needs the role ARNs (comma-separated) whose sessions may name the tenant in %s",
				EnvTrustedRoleARNs, err, httpapi.TenantHeader)
		}
		cfg.TrustedRoles = roles
	}
	if fn == Push && cfg.AuthMode == AuthIAM {
		return cfg, nil // it signs no cursor; a JWT deployment's verifies push tickets with the key
	}
	if cfg.CursorKey, err = cursorKey(ctx, get, secrets); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// cursorKey reads the cursor key (by ARN, or the key itself for tests and the emulator).
func cursorKey(ctx context.Context, get func(string) string, secrets SecretSource) ([]byte, error) {
	key, err := secretSetting(ctx, get, secrets, EnvCursorKeyARN, EnvCursorKey, "the cursor signing key")
	if err != nil {
		return nil, err
	}
	if len(key) < httpapi.MinCursorKeyLen {
		return nil, configErr("the cursor key (%s or %s) is %d bytes; at least %d are required",
			EnvCursorKeyARN, EnvCursorKey, len(key), httpapi.MinCursorKeyLen)
	}
	return []byte(key), nil
}

// loadProvider validates the provider selection, reads its API key and settings, and the
// reaper's timing (optional here, required by hosted providers: providers.Hosted).
func (cfg *Config) loadProvider(ctx context.Context, get func(string) string, secrets SecretSource) error {
	hosted := providers.Hosted(cfg.Provider)
	switch {
	case cfg.Provider == "":
		return configErr("%s is not set (one of %s)", EnvProvider, strings.Join(providers.Names(), ", "))
	case !providers.Known(cfg.Provider):
		return configErr("%s=%q is not a known provider (one of %s)", EnvProvider, cfg.Provider, strings.Join(providers.Names(), ", "))
	}
	if hosted {
		s, err := secretSetting(ctx, get, secrets, EnvProviderSecretARN, EnvProviderAPIKey, "the "+cfg.Provider+" API key")
		if err != nil {
			return err
		}
		cfg.ProviderSecret = s
	}
	if err := cfg.loadReaperTiming(get, hosted); err != nil {
		return err
	}
	switch cfg.Provider {
	case ProviderLocalProcess:
		dir := get(EnvSandboxDir)
		if dir == "" {
			dir = DefaultSandboxDir
		}
		dir = filepath.Clean(dir)
		if !strings.HasPrefix(dir, "/tmp/") {
			return configErr("%s=%q: the local-process provider keeps sandboxes under /tmp (the only writable directory of a Lambda)", EnvSandboxDir, dir)
		}
		cfg.SandboxDir = dir
	case ProviderDaytona:
		cfg.Daytona = DaytonaSettings{BaseURL: get(EnvDaytonaBaseURL), Target: get(EnvDaytonaTarget), Snapshot: get(EnvDaytonaSnapshot)}
		return checkBaseURL(EnvDaytonaBaseURL, cfg.Daytona.BaseURL)
	case ProviderE2B:
		cfg.E2B = E2BSettings{Template: get(EnvE2BTemplate), Domain: get(EnvE2BDomain), BaseURL: get(EnvE2BBaseURL)}
		if err := providers.CheckDomain(cfg.E2B.Domain); err != nil {
			return configErr("%s=%q: %v", EnvE2BDomain, cfg.E2B.Domain, err)
		}
		return checkBaseURL(EnvE2BBaseURL, cfg.E2B.BaseURL)
	}
	return nil
}

// loadReaperTiming reads the detached-run TTL and the reaper's period; required says both
// must be set (a hosted provider sizes its sandboxes' lifetime by them).
func (cfg *Config) loadReaperTiming(get func(string) string, required bool) error {
	why := "the " + cfg.Provider + " provider keeps sandboxes alive past the reaper's detached TTL + sweep period"
	if get(EnvDetachedTTLSeconds) == "" && required {
		return configErr("%s is not set (%s)", EnvDetachedTTLSeconds, why)
	}
	ttl, err := integer(get, EnvDetachedTTLSeconds, 0, 1)
	if err != nil {
		return err
	}
	cfg.DetachedTTL = time.Duration(ttl) * time.Second
	sched := get(EnvReapSchedule)
	if sched == "" {
		if required {
			return configErr("%s is not set (the reaper's schedule, e.g. \"rate(1 minute)\"; %s)", EnvReapSchedule, why)
		}
		return nil
	}
	if cfg.SweepPeriod, err = SchedulePeriod(sched); err != nil {
		return configErr("%s=%q: %v", EnvReapSchedule, sched, err)
	}
	return nil
}

// SchedulePeriod returns the period of an EventBridge rate expression such as
// "rate(5 minutes)" (units minute(s), hour(s), day(s); singular exactly for 1).
func SchedulePeriod(expr string) (time.Duration, error) {
	inner, okPrefix := strings.CutPrefix(expr, "rate(")
	inner, okSuffix := strings.CutSuffix(inner, ")")
	if !okPrefix || !okSuffix {
		return 0, errors.New("want a rate expression such as rate(1 minute)")
	}
	num, unit, ok := strings.Cut(inner, " ")
	n, err := strconv.Atoi(num)
	if !ok || err != nil || n < 1 || num != strconv.Itoa(n) {
		return 0, errors.New("want a positive whole number before the unit")
	}
	units := map[string]time.Duration{"minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour}
	base, plural := strings.CutSuffix(unit, "s")
	d, known := units[base]
	if !known || plural != (n != 1) {
		return 0, fmt.Errorf("unit %q: want minute, hour or day, plural exactly when the number is not 1", unit)
	}
	return time.Duration(n) * d, nil
}

// checkBaseURL accepts "" (the provider's default) or an absolute http(s) URL without
// credentials or query (providers.CheckBaseURL); the value is never echoed.
func checkBaseURL(key, v string) error {
	if err := providers.CheckBaseURL(v); err != nil {
		return configErr("%s: %v", key, err)
	}
	return nil
}

// secretSetting reads a secret from arnKey (through secrets) or, when no ARN is set, the
// plain value of plainKey.
func secretSetting(ctx context.Context, get func(string) string, secrets SecretSource, arnKey, plainKey, what string) (string, error) {
	if arn := get(arnKey); arn != "" {
		if !strings.HasPrefix(arn, "arn:") {
			return "", configErr("%s=%q is not an ARN (%s)", arnKey, arn, what)
		}
		if secrets == nil {
			return "", configErr("%s is set but no secret reader is configured", arnKey)
		}
		v, err := secrets.Secret(ctx, arn)
		if err != nil {
			return "", fmt.Errorf("%w: %s: reading %s: %w", ErrConfig, arnKey, what, err)
		}
		return v, nil
	}
	if v := get(plainKey); v != "" {
		return v, nil
	}
	return "", configErr("%s is not set (%s; %s is accepted for tests and the emulator)", arnKey, what, plainKey)
}

// millis parses an optional millisecond setting (default def, at least lo).
func millis(get func(string) string, key string, def, lo time.Duration) (time.Duration, error) {
	n, err := integer(get, key, int64(def/time.Millisecond), int64(lo/time.Millisecond))
	return time.Duration(n) * time.Millisecond, err
}

// integer parses an optional integer setting (default def, at least lo).
func integer(get func(string) string, key string, def, lo int64) (int64, error) {
	v := get(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, configErr("%s=%q is not an integer", key, v)
	}
	if n < lo {
		return 0, configErr("%s=%d is below the minimum %d", key, n, lo)
	}
	return n, nil
}
