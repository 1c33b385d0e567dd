package journal

import (
	"bytes"
	"context"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// ProbeBytes is the journal tail Probe reads.
const ProbeBytes = 4096

// ProbeState is what a probe concluded about a run's agent.
type ProbeState string

// The probe outcomes (docs/design.md §6).
const (
	Unknown   ProbeState = "unknown"   // the journal could not be read; act on nothing
	Producing ProbeState = "producing" // no sentinel yet: the agent may still be running
	Finished  ProbeState = "finished"  // the sentinel is there; ExitCode is the agent's
)

// ProbeResult is a probe's answer.
type ProbeResult struct {
	State    ProbeState
	ExitCode int   // when Finished
	Err      error // why Unknown
}

// Probe reads the last ProbeBytes of runID's journal and scans its complete lines from the
// end for this run's sentinel: found → Finished(code); absent → Producing; any error (the
// sandbox unreachable, the command failing) → Unknown. A missing journal is Unknown with
// ErrNoJournal: nothing proves an agent is producing. Probe only runs a command: it never
// starts a stopped sandbox (check Status first).
func Probe(ctx context.Context, ex contract.Executor, psid, dir, runID string) ProbeResult {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return ProbeResult{State: Unknown, Err: err}
	}
	res, err := ex.Exec(ctx, psid, fmt.Sprintf("test -f %[1]s || exit 3; tail -c %[2]d -- %[1]s", Quote(p.Journal), ProbeBytes+1))
	switch {
	case err != nil:
		return ProbeResult{State: Unknown, Err: fmt.Errorf("journal: probe %s: %w", runID, err)}
	case res.ExitCode == 3:
		return ProbeResult{State: Unknown, Err: fmt.Errorf("journal: probe %s: %w", runID, ErrNoJournal)}
	case res.ExitCode != 0:
		return ProbeResult{State: Unknown, Err: fmt.Errorf("journal: probe %s: tail exited %d: %s", runID, res.ExitCode, bytes.TrimSpace(res.Stderr))}
	}
	if code, ok := findSentinel(res.Stdout, ExitNonce(runID)); ok {
		return ProbeResult{State: Finished, ExitCode: code}
	}
	return ProbeResult{State: Producing}
}

// findSentinel scans the complete lines of a journal tail of up to ProbeBytes+1 bytes from
// the end. With the extra byte, a window of ProbeBytes is known to begin a line exactly when
// the byte before it is a newline; otherwise its first fragment is no line and is skipped.
func findSentinel(tail []byte, nonce string) (int, bool) {
	if len(tail) > ProbeBytes {
		_, after, found := bytes.Cut(tail, []byte{'\n'})
		if !found {
			return 0, false
		}
		tail = after
	}
	end := bytes.LastIndexByte(tail, '\n')
	if end < 0 {
		return 0, false
	}
	tail = tail[:end] // drop a partial last line: still being written
	for {
		i := bytes.LastIndexByte(tail, '\n')
		if code, ok := parseSentinel(tail[i+1:], nonce); ok {
			return code, true
		}
		if i < 0 {
			return 0, false
		}
		tail = tail[:i]
	}
}
