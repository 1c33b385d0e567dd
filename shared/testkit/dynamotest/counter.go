package dynamotest

import "github.com/sandkeep/sandkeep/shared/store/dynamostore/callcount"

// Counter counts a client's DynamoDB calls per operation; it lives in callcount (the
// operator binary's benchmark counts with it too) and is named here for the tests.
type Counter = callcount.Counter

// NewCounter returns an empty Counter; attach it with Attach.
func NewCounter() *Counter { return callcount.New() }
