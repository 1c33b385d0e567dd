package awsfn

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
)

// ExitConfig is the exit status of a function refusing to start on a bad setting.
const ExitConfig = 2

// coldStartTimeout bounds reading the configuration and its secrets at cold start.
const coldStartTimeout = 8 * time.Second

// Main runs API function fn: it reads and validates the configuration once, builds
// clients, stores, provider and handler once per container, and starts the Lambda
// runtime. A bad or missing setting exits with ExitConfig and a message naming it.
func Main(fn Function) {
	start(fn, func(cfg Config, d Deps) (any, error) {
		api, err := NewAPI(cfg, d)
		if err != nil {
			return nil, err
		}
		return api.Handle, nil
	})
}

// MainReaper runs the reaper function with the sweep factory (the seam to shared/ops/reaper).
func MainReaper(factory SweepFactory) {
	start(Reaper, func(cfg Config, d Deps) (any, error) {
		h, err := NewReaper(cfg, d, factory)
		if err != nil {
			return nil, err
		}
		return h.Handle, nil
	})
}

func start(fn Function, build func(Config, Deps) (any, error)) {
	handler, err := coldStart(fn, os.Getenv, os.Stdout, build)
	if err != nil {
		fail(os.Stderr, fn, err)
	}
	lambda.Start(handler)
}

// coldStart loads the AWS SDK configuration and fn's settings and builds its handler.
func coldStart(fn Function, getenv func(string) string, stdout io.Writer, build func(Config, Deps) (any, error)) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), coldStartTimeout)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	cfg, err := Load(ctx, fn, getenv, AWSSecrets{Config: awsCfg})
	if err != nil {
		return nil, err
	}
	metrics := emf.New(stdout)
	d := Deps{
		DynamoDB: NewDynamoDB(cfg, awsCfg, CountThrottles(metrics)),
		Logger:   NewLogger(stdout, getenv("AWS_LAMBDA_LOG_LEVEL")),
		Metrics:  metrics,
	}
	if cfg.PushEndpoint != "" {
		// PostToConnection signed with the role's own credentials (docs/design.md §8.1).
		if d.PushPoster, err = push.NewManagement(cfg.PushEndpoint, awsCfg.Region, awsCfg.Credentials, nil); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, EnvPushEndpoint, err)
		}
	}
	return build(cfg, d)
}

// fail reports a refused start and exits non-zero (Lambda reports Runtime.ExitError and
// logs the message).
func fail(w io.Writer, fn Function, err error) {
	fmt.Fprintf(w, "sandkeep %s: refusing to start: %v\n", fn, err)
	os.Exit(ExitConfig)
}
