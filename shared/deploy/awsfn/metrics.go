package awsfn

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Metric names of docs/design.md §9 recorded here (Requests and Superseded: the adapter;
// ReapOutcome: the reaper handler).
const (
	MetricLeaseLost      = "LeaseLost"
	MetricProviderErrors = "ProviderErrors" // dimension Provider
	MetricThrottles      = "Throttles"
)

// KeeperObserver returns the keeper observer that records LeaseLost and
// ProviderErrors{Provider} on m (nil m: nil, i.e. nothing observed).
func KeeperObserver(m *emf.Recorder) keeper.Observer {
	if m == nil {
		return nil
	}
	return metricsObserver{m}
}

// metricsObserver turns keeper events into EMF lines; one line per event.
type metricsObserver struct{ m *emf.Recorder }

func (o metricsObserver) LeaseLost(context.Context) { o.m.Count(MetricLeaseLost, 1) }

func (o metricsObserver) ProviderError(_ context.Context, provider string, _ error) {
	o.m.Count(MetricProviderErrors, 1, "Provider", provider)
}

// CountThrottles returns a DynamoDB client option that records Throttles on m once for
// every call that ends, after the SDK's own retries, in a throttling error
// (ThrottlingException, ProvisionedThroughputExceededException, RequestLimitExceeded,
// ... as retry.DefaultThrottles classifies them): a throttle that reaches our code.
func CountThrottles(m *emf.Recorder) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		if m == nil {
			return
		}
		o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
			// Initialize runs outside the retry loop (Finalize): it sees the final error only.
			return s.Initialize.Add(middleware.InitializeMiddlewareFunc("sandkeepThrottles",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					out, md, err := next.HandleInitialize(ctx, in)
					if err != nil && IsThrottle(err) {
						m.Count(MetricThrottles, 1)
					}
					return out, md, err
				}), middleware.Before)
		})
	}
}

// IsThrottle reports whether err (however wrapped) is a throttling error of an AWS API.
func IsThrottle(err error) bool {
	return retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err) == aws.TrueTernary
}
