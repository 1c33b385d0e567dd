package storetest

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// FetchCounter wraps an executor and counts the commands that start with Prefix (the
// journal reader's fetch is "tail -c +") and the stdout bytes they returned, so a test can
// hold a reader to "each byte fetched once".
type FetchCounter struct {
	contract.Executor
	Prefix       string
	Calls, Bytes atomic.Int64
}

// Exec runs cmd, counting it when it is a fetch.
func (f *FetchCounter) Exec(ctx context.Context, id, cmd string) (contract.ExecResult, error) {
	res, err := f.Executor.Exec(ctx, id, cmd)
	if strings.HasPrefix(cmd, f.Prefix) {
		f.Calls.Add(1)
		f.Bytes.Add(int64(len(res.Stdout)))
	}
	return res, err
}
