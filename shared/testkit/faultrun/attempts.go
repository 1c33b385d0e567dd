package faultrun

import (
	"context"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
)

// attempts counts the DynamoDB write calls of one store call and their attempts.
type attempts struct{ calls, tries atomic.Int32 }

type attemptsKey struct{}

// retries returns how many write attempts were retries of an earlier attempt.
func (a *attempts) retries() int { return int(a.tries.Load() - a.calls.Load()) }

// isWrite reports whether op is a DynamoDB write (a retry of it may apply it again).
func isWrite(op string) bool { return op == "PutItem" || op == "UpdateItem" || op == "DeleteItem" }

// CountAttempts is a DynamoDB client option for the replicas of a fault run: it counts,
// per recorded store call, the write calls and their attempts, so the history knows when
// the SDK retried a write whose first attempt may have landed.
func CountAttempts(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		err := s.Initialize.Add(middleware.InitializeMiddlewareFunc("faultrunCalls", func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			if a, ok := ctx.Value(attemptsKey{}).(*attempts); ok && isWrite(middleware.GetOperationName(ctx)) {
				a.calls.Add(1)
			}
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
		if err != nil {
			return err
		}
		// After the retry middleware: runs once per attempt.
		return s.Finalize.Insert(middleware.FinalizeMiddlewareFunc("faultrunAttempts", func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if a, ok := ctx.Value(attemptsKey{}).(*attempts); ok && isWrite(middleware.GetOperationName(ctx)) {
				a.tries.Add(1)
			}
			return next.HandleFinalize(ctx, in)
		}), "Retry", middleware.After)
	})
}
