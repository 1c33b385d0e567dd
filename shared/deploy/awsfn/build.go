package awsfn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
)

// Deps are what a function is built from besides its Config; tests supply them, Main
// builds them from the environment.
type Deps struct {
	DynamoDB *dynamodb.Client // required
	Logger   *slog.Logger     // default: JSON to stdout
	Metrics  *emf.Recorder    // default: none
	Now      func() time.Time // default time.Now
	// Provider, when set, is the provider of every function, whether or not its routes use
	// one (tests: which functions call the provider is then observed, not assumed). Unset,
	// only functions that use one (Function.UsesProvider) build NewProvider(cfg).
	Provider contract.Provider
	// PushPoster posts to the WebSocket API's connections (required with
	// Config.PushEndpoint; Main builds the SigV4 management poster).
	PushPoster push.Poster
}

func (d Deps) withDefaults() (Deps, error) {
	if d.DynamoDB == nil {
		return d, errors.New("awsfn: a DynamoDB client is required")
	}
	if d.Logger == nil {
		d.Logger = NewLogger(os.Stdout, "")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return d, nil
}

// NewDynamoDB returns the DynamoDB client of cfg: the SDK's default chain, or, with
// SANDKEEP_DYNAMODB_ENDPOINT (tests, the emulator), that endpoint without response
// checksum validation (local engines send none).
func NewDynamoDB(cfg Config, awsCfg aws.Config, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	if cfg.DynamoDBEndpoint != "" {
		opts = append([]func(*dynamodb.Options){func(o *dynamodb.Options) {
			o.BaseEndpoint = aws.String(cfg.DynamoDBEndpoint)
			o.DisableValidateResponseChecksum = true
		}}, opts...)
	}
	return dynamodb.NewFromConfig(awsCfg, append([]func(*dynamodb.Options){dynamostore.Retries}, opts...)...)
}

// provider returns d.Provider, else the provider cfg selects.
func (d Deps) provider(cfg Config) (contract.Provider, error) {
	if d.Provider != nil {
		return d.Provider, nil
	}
	return NewProvider(cfg)
}

// NewBackend returns the DynamoDB backend of cfg over client.
func NewBackend(cfg Config, client *dynamodb.Client, now func() time.Time) *dynamostore.Store {
	return dynamostore.New(dynamostore.Config{
		Client:       client,
		Table:        cfg.Table,
		DriverLease:  cfg.DriverLease,
		Lock:         contract.LockTiming{Lease: cfg.LockLease, Renew: cfg.LockLease / 3},
		LogRetention: cfg.LogRetention,
		Now:          now,
	})
}

// NewProvider returns the sandbox provider cfg selects (Load has validated its settings),
// built by shared/providers as every CLI command builds it. Hosted providers get the
// reaper's detached TTL and sweep period, so their sandboxes outlive a detached run until
// the reaper has expired it.
func NewProvider(cfg Config) (contract.Provider, error) {
	p, err := providers.New(providers.Config{
		Name: cfg.Provider, APIKey: cfg.ProviderSecret, SandboxDir: cfg.SandboxDir,
		// Commands in a sandbox never inherit the function's environment: it holds the
		// execution role's credentials.
		BaseEnv: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"},
		Daytona: cfg.Daytona, E2B: cfg.E2B, DetachedTTL: cfg.DetachedTTL, SweepPeriod: cfg.SweepPeriod,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return p, nil
}

// NewAPI builds an API function of cfg: backend, provider, keeper, the shared handler
// set and the adapter restricted to cfg.Function's routes.
func NewAPI(cfg Config, d Deps) (*API, error) {
	if len(Routes(cfg.Function)) == 0 {
		return nil, fmt.Errorf("awsfn: %s is not an API function", cfg.Function)
	}
	d, err := d.withDefaults()
	if err != nil {
		return nil, err
	}
	// A function none of whose routes calls the provider holds none (and so no API key).
	var provs []contract.Provider
	if cfg.Function.UsesProvider() || d.Provider != nil {
		prov, err := d.provider(cfg)
		if err != nil {
			return nil, err
		}
		provs = append(provs, prov)
	}
	backend := NewBackend(cfg, d.DynamoDB, d.Now)
	dl, err := d.deliverer(cfg, backend)
	if err != nil {
		return nil, err
	}
	k, err := keeper.New(keeper.Config{
		Backend:     backend,
		Push:        logPush(dl),
		Providers:   provs,
		DriverLease: cfg.DriverLease,
		// Every function applies the launch deadline it meets (docs/design.md §4.2).
		LaunchDeadline: cfg.LaunchDeadline,
		IdleStop:       cfg.IdleStop,
		Now:            d.Now,
		Logger:         d.Logger,
		Observer:       KeeperObserver(d.Metrics),
	})
	if err != nil {
		return nil, fmt.Errorf("awsfn: %w", err)
	}
	var auth httpapi.Authenticator = httpapi.IAMAuth{}
	if cfg.AuthMode == AuthJWT {
		auth = httpapi.JWTAuth{Claim: cfg.TenantClaim}
	}
	// A function never runs a caller's command outside a provider sandbox: local-process
	// would run it on the function's own host, beside its role's credentials.
	h := httpapi.New(httpapi.Config{Keeper: k, Auth: auth, CursorKey: cfg.CursorKey, Logger: d.Logger, Now: d.Now,
		HostProviders: []string{ProviderLocalProcess}, MaxWaiting: cfg.MaxWaiting, PublicURL: cfg.PublicURL,
		// Without PublicUrl the sandboxes use the stage's own URL (the adapter's StageURL).
		RequestPublicURL: true, PushTicketURL: cfg.PushURL})
	return NewAPIAdapter(cfg.Function, h, Auth{Mode: cfg.AuthMode, Trusted: cfg.TrustedRoles}, d.Logger, d.Metrics), nil
}

// NewLogger returns the functions' JSON logger: level from level ("DEBUG", "INFO",
// "WARN", "ERROR"; Lambda's AWS_LAMBDA_LOG_LEVEL), and every line carries the Lambda
// request id of its invocation.
func NewLogger(w io.Writer, level string) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(strings.ToUpper(level))); err != nil || level == "" {
		lv = slog.LevelInfo
	}
	return slog.New(lambdaIDHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lv})})
}

// lambdaIDHandler adds awsRequestId from the invocation's context to every record.
type lambdaIDHandler struct{ slog.Handler }

func (h lambdaIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if lc, ok := lambdacontext.FromContext(ctx); ok && lc.AwsRequestID != "" {
		r.AddAttrs(slog.String("awsRequestId", lc.AwsRequestID))
	}
	return h.Handler.Handle(ctx, r)
}

func (h lambdaIDHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return lambdaIDHandler{h.Handler.WithAttrs(attrs)}
}

func (h lambdaIDHandler) WithGroup(name string) slog.Handler {
	return lambdaIDHandler{h.Handler.WithGroup(name)}
}
