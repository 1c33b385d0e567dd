package bench

import (
	"context"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
)

// callTimes collects the duration of each DynamoDB call made under a context carrying it,
// so one operation's time can be split into its calls and the rest.
type callTimes struct {
	mu    sync.Mutex
	calls []timedCall
}

type timedCall struct {
	op string
	d  time.Duration
}

type callTimesKey struct{}

// withCallTimes returns ctx whose DynamoDB calls (through a client with attachTimer) are
// recorded in ct.
func withCallTimes(ctx context.Context, ct *callTimes) context.Context {
	return context.WithValue(ctx, callTimesKey{}, ct)
}

// first returns the duration of the first recorded call of op; ok=false when none.
func (ct *callTimes) first(op string) (time.Duration, bool) {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for _, c := range ct.calls {
		if c.op == op {
			return c.d, true
		}
	}
	return 0, false
}

// attachTimer is a client option: every call whose context carries callTimes is timed
// over the whole SDK call (serialize, sign, send, retries, deserialize), as the bare calls
// are timed from outside.
func attachTimer(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("sandkeepBenchTimer",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				ct, _ := ctx.Value(callTimesKey{}).(*callTimes)
				if ct == nil {
					return next.HandleInitialize(ctx, in)
				}
				t0 := time.Now()
				out, md, err := next.HandleInitialize(ctx, in)
				d := time.Since(t0)
				ct.mu.Lock()
				ct.calls = append(ct.calls, timedCall{op: middleware.GetOperationName(ctx), d: d})
				ct.mu.Unlock()
				return out, md, err
			}), middleware.Before)
	})
}
