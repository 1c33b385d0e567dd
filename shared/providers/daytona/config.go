package daytona

import (
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// DefaultBaseURL is Daytona's hosted API.
const DefaultBaseURL = "https://app.daytona.io/api"

// Defaults of the zero Config fields.
const (
	DefaultRequestTimeout = 30 * time.Second
	DefaultExecTimeout    = 5 * time.Minute
	DefaultDestroyTimeout = 20 * time.Second
	DefaultPollInterval   = time.Second
	DefaultRetryBase      = 250 * time.Millisecond
	DefaultRetryMax       = 5 * time.Second
	DefaultMaxAttempts    = 8
	DefaultWaitTimeout    = 10 * time.Minute
	// AutoStopMargin is added to DetachedTTL + SweepPeriod before an auto-stop interval is
	// accepted: the reaper must have expired a detached run before Daytona could stop it.
	AutoStopMargin = time.Minute
)

// Config configures a Provider. Only APIKey is required.
type Config struct {
	// APIKey is sent as a bearer token; it never appears in a log line or an error.
	APIKey string
	// BaseURL is the management API (default DefaultBaseURL).
	BaseURL string
	// OrganizationID, when set, is sent as X-Daytona-Organization-ID (needed with JWTs only).
	OrganizationID string
	// Target is the region new sandboxes are created in ("" = the organization default).
	Target string
	// Snapshot is the snapshot (image) fresh sandboxes are created from ("" = Daytona's default).
	Snapshot string
	// HTTPClient sends every request (default: a client without a global timeout; every
	// attempt is bounded by RequestTimeout and the caller's context instead).
	HTTPClient *http.Client
	// Logger gets retry and state lines at debug level (default: discarded).
	Logger *slog.Logger

	// AutoStop is the idle time after which Daytona stops a sandbox; 0 (the default)
	// disables auto-stop. Daytona counts API activity, not processes, so a detached agent
	// producing output nobody reads is "idle": a non-zero AutoStop must exceed
	// DetachedTTL + SweepPeriod + AutoStopMargin, so the reaper expires the run first.
	AutoStop time.Duration
	// DetachedTTL is the reaper's detached-run TTL; SweepPeriod its sweep interval.
	DetachedTTL, SweepPeriod time.Duration

	// RequestTimeout bounds one management API attempt (default DefaultRequestTimeout).
	RequestTimeout time.Duration
	// ExecTimeout bounds a foreground command when the context has no deadline
	// (default DefaultExecTimeout); it is sent to the toolbox as the command's timeout.
	ExecTimeout time.Duration
	// DestroyTimeout bounds the clean-up of a sandbox whose create failed half way.
	DestroyTimeout time.Duration
	// PollInterval is how often a state transition (start, create, snapshot) is polled.
	PollInterval time.Duration
	// RetryBase and RetryMax shape the jittered exponential backoff of retried requests.
	RetryBase, RetryMax time.Duration
	// MaxAttempts caps the attempts of one request (default DefaultMaxAttempts), so a
	// caller without a deadline still gets its transient error.
	MaxAttempts int
	// WaitTimeout caps a wait for a state (started, snapshot taken, delete accepted) when
	// the caller's context allows longer (default DefaultWaitTimeout).
	WaitTimeout time.Duration
}

// withDefaults validates c and fills its zero fields; errors wrap contract.ErrInvalid and
// name the field, never its value.
func (c Config) withDefaults() (Config, error) {
	if strings.TrimSpace(c.APIKey) == "" {
		return c, contract.Invalid("daytona.APIKey", "required")
	}
	if strings.ContainsAny(c.APIKey, "\r\n") {
		return c, contract.Invalid("daytona.APIKey", "contains a line break")
	}
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return c, contract.Invalid("daytona.BaseURL", "must be an absolute http(s) URL without query or credentials")
	}
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"AutoStop", c.AutoStop}, {"DetachedTTL", c.DetachedTTL}, {"SweepPeriod", c.SweepPeriod},
		{"RequestTimeout", c.RequestTimeout}, {"ExecTimeout", c.ExecTimeout}, {"DestroyTimeout", c.DestroyTimeout},
		{"PollInterval", c.PollInterval}, {"RetryBase", c.RetryBase}, {"RetryMax", c.RetryMax},
		{"WaitTimeout", c.WaitTimeout},
	} {
		if d.v < 0 {
			return c, contract.Invalid("daytona."+d.name, "negative")
		}
	}
	if c.MaxAttempts < 0 {
		return c, contract.Invalid("daytona.MaxAttempts", "negative")
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.AutoStop > 0 {
		if c.DetachedTTL == 0 || c.SweepPeriod == 0 {
			return c, contract.Invalid("daytona.AutoStop",
				"a non-zero auto-stop needs DetachedTTL and SweepPeriod to prove it never stops a detached run")
		}
		if need := c.DetachedTTL + c.SweepPeriod + AutoStopMargin; c.AutoStop < need {
			return c, contract.Invalid("daytona.AutoStop",
				"%v would stop a detached run before the reaper expires it; use 0 (disabled) or at least %v", c.AutoStop, need)
		}
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.RequestTimeout, DefaultRequestTimeout)
	def(&c.ExecTimeout, DefaultExecTimeout)
	def(&c.DestroyTimeout, DefaultDestroyTimeout)
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.RetryBase, DefaultRetryBase)
	def(&c.RetryMax, DefaultRetryMax)
	def(&c.WaitTimeout, DefaultWaitTimeout)
	if c.RetryMax < c.RetryBase {
		c.RetryMax = c.RetryBase
	}
	return c, nil
}

// autoStopMinutes is the autoStopInterval sent to Daytona: whole minutes, rounded up, so
// the validated bound still holds (0 = disabled).
func (c Config) autoStopMinutes() int {
	if c.AutoStop <= 0 {
		return 0
	}
	return int((c.AutoStop + time.Minute - 1) / time.Minute)
}
