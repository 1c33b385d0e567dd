package agentrun

import (
	"context"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// AbortInput ends a run whose cancel was honoured before its agent exited.
func AbortInput() keeper.FinishInput {
	return keeper.FinishInput{Status: contract.StatusAborted, Error: &contract.RunError{Message: "cancelled", Code: "cancelled"}}
}

// ExitInput is how a run ends once its agent exited with code and its stderr tail was
// read, as a drive ends it: aborted when a cancel was requested, else completed (0) or
// failed "exit-<code>" with the tail in the message. The ship end route uses it.
func ExitInput(code int, tail []byte, cancelled bool) keeper.FinishInput {
	switch {
	case cancelled:
		return AbortInput()
	case code == 0:
		return keeper.FinishInput{Status: contract.StatusCompleted}
	}
	return keeper.FinishInput{Status: contract.StatusFailed, Error: ExitTailError(code, tail)}
}

// ExitRunError is the error a drive ends a run with whose agent exited with code: code
// "exit-<code>"; Service.Finish adds the agent's stderr tail to the message.
func ExitRunError(code int) *contract.RunError {
	return &contract.RunError{Message: "agent exited with code " + strconv.Itoa(code), Code: "exit-" + strconv.Itoa(code)}
}

// ExitError is the error a run that exited with code ends with: code "exit-<code>", and
// the message carrying the first 1000 bytes of the stderr sidecar's tail when readable.
func ExitError(ctx context.Context, ex contract.Executor, psid, dir, runID string, code int) *contract.RunError {
	tail, err := journal.StderrTail(ctx, ex, psid, dir, runID, 0)
	if err != nil {
		tail = nil
	}
	return ExitTailError(code, tail)
}

// ExitTailError is the error a run that exited with code ends with, given the stderr
// sidecar's tail (read through the provider, or sent by the run's shipper): code
// "exit-<code>", the message carrying the tail's last 1000 bytes.
func ExitTailError(code int, tail []byte) *contract.RunError {
	msg := "agent exited with code " + strconv.Itoa(code)
	if s := strings.TrimSpace(strings.ToValidUTF8(string(tail), "\uFFFD")); s != "" {
		if len(s) > 1000 {
			s = s[len(s)-1000:]
		}
		msg += ": " + strings.ToValidUTF8(s, "")
	}
	return &contract.RunError{Message: msg, Code: "exit-" + strconv.Itoa(code)}
}
