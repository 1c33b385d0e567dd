// Package callcount counts the DynamoDB calls of an SDK client, per operation: the
// middleware behind the call-budget assertions of the tests and the `sandkeep bench` report
// (docs/design.md §11). It is production code, so the operator binary can count without
// linking test scaffolding.
package callcount

import (
	"context"
	"errors"
	"sort"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
)

// Counter is an SDK middleware counting DynamoDB calls per operation (one per API call,
// SDK retries not counted separately), conditional-check failures per operation, and the
// items read (ScannedCount of Query/Scan outputs). Safe for concurrent use.
type Counter struct {
	mu       sync.Mutex
	calls    map[string]int
	failed   map[string]int
	scanned  int64
	actions  map[string]struct{} // every operation ever seen; Reset keeps it
	disabled bool
}

// New returns an empty Counter; attach it with Attach.
func New() *Counter {
	return &Counter{calls: map[string]int{}, failed: map[string]int{}, actions: map[string]struct{}{}}
}

// Attach is a client option installing the counter on every operation of the client.
func (c *Counter) Attach(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("sandkeepCounter", c.handle), middleware.Before)
	})
}

func (c *Counter) handle(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
	op := middleware.GetOperationName(ctx)
	out, md, err := next.HandleInitialize(ctx, in)
	var scanned int64
	switch r := out.Result.(type) {
	case *dynamodb.QueryOutput:
		scanned = int64(r.ScannedCount)
	case *dynamodb.ScanOutput:
		scanned = int64(r.ScannedCount)
	}
	var ccf *types.ConditionalCheckFailedException
	c.mu.Lock()
	c.actions[op] = struct{}{}
	if !c.disabled {
		c.calls[op]++
		c.scanned += scanned
		if errors.As(err, &ccf) {
			c.failed[op]++
		}
	}
	c.mu.Unlock()
	return out, md, err
}

// Calls returns the number of calls of operation op (e.g. "UpdateItem") since Reset.
func (c *Counter) Calls(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[op]
}

// ConditionFailures returns how many calls of op failed their condition since Reset.
func (c *Counter) ConditionFailures(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed[op]
}

// Total returns the number of calls of every operation since Reset.
func (c *Counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.calls {
		n += v
	}
	return n
}

// Scanned returns the items read by Query/Scan calls (sum of ScannedCount) since Reset.
func (c *Counter) Scanned() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.scanned
}

// Snapshot returns a copy of the calls per operation since Reset.
func (c *Counter) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.calls))
	for k, v := range c.calls {
		m[k] = v
	}
	return m
}

// Reset zeroes the counts and resumes counting; the action set is kept.
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls, c.failed, c.scanned, c.disabled = map[string]int{}, map[string]int{}, 0, false
}

// Pause stops counting calls (setup traffic) until Reset; actions are still recorded.
func (c *Counter) Pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.disabled = true
}

// Actions returns the IAM action names ("dynamodb:GetItem", ...) of every operation the
// client issued since the counter was made, sorted.
func (c *Counter) Actions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.actions))
	for op := range c.actions {
		out = append(out, "dynamodb:"+op)
	}
	sort.Strings(out)
	return out
}
