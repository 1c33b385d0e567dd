package dynamostore_test

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestRetryPolicyTotalTries: a store call that keeps failing sends its request exactly
// storecall.Attempts × storecall.SDKAttempts times — the documented total of the one retry
// policy (docs/design.md §2.1) — because dynamostore.Retries caps the SDK's own retryer
// even when that retryer would allow more (here 10 tries, with a fast backoff so the test
// takes milliseconds).
func TestRetryPolicyTotalTries(t *testing.T) {
	proxy := dynamotest.NewProxy("http://127.0.0.1:1") // every request is answered by the fault
	defer proxy.Close()
	generous := func(o *dynamodb.Options) {
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = 10
			so.RateLimiter = ratelimit.None
			so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return time.Millisecond, nil })
		})
	}
	store := dynamostore.New(dynamostore.Config{Client: dynamostore.LocalClient(proxy.URL(), generous), Table: "t"})
	r := proxy.Inject(dynamotest.Fault{Kind: dynamotest.ServerError, Op: "GetItem"})
	ctx := contract.WithTenant(t.Context(), "tenant")
	_, err := storecall.Do(ctx, storecall.Policy{}, func() (*contract.InstanceRow, error) {
		return store.Instances().GetRow(ctx, "key")
	})
	if want := int64(storecall.Attempts * storecall.SDKAttempts); err == nil || r.Hits() != want {
		t.Fatalf("GetRow: %v after %d tries; want an error after %d", err, r.Hits(), want)
	}
}
