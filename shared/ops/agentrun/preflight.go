package agentrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
)

// ErrJournalUnavailable: an attach found no journal to resume; Unavailable.Reason says why.
var ErrJournalUnavailable = errors.New("driver: journal unavailable for attach")

// The reasons of an Unavailable error (the reference's attach preflight).
const (
	ReasonUnknownRun     = "unknown-run"     // no such run: nothing will ever write the journal
	ReasonTerminalRun    = "terminal-run"    // the run ended; its log holds everything
	ReasonJournalTimeout = "journal-timeout" // a live run whose journal did not appear in time
)

// Unavailable is the error of AwaitJournal; errors.Is(err, ErrJournalUnavailable).
type Unavailable struct {
	RunID  string
	Reason string
	Wait   time.Duration
}

// Error names the run and the reason (and the wait, for a timeout).
func (e *Unavailable) Error() string {
	if e.Reason == ReasonJournalTimeout {
		return fmt.Sprintf("driver: journal of run %q did not appear within %dms (%s)", e.RunID, e.Wait.Milliseconds(), e.Reason)
	}
	return fmt.Sprintf("driver: no journal for run %q (%s)", e.RunID, e.Reason)
}

// Is makes every Unavailable match ErrJournalUnavailable, whatever its reason.
func (e *Unavailable) Is(target error) bool { return target == ErrJournalUnavailable }

// Defaults of AwaitJournal.
const (
	DefaultAttachWait     = 10 * time.Second
	DefaultAttachInterval = 100 * time.Millisecond
)

// AwaitJournal is the attach preflight, run only on attach (never for a fresh run): the
// journal exists → nil. Otherwise the run record decides without waiting: unknown →
// unknown-run, terminal → terminal-run; a live run (or an unreadable record) is re-probed
// every interval until wait → journal-timeout. A ctx that ends returns its error.
func AwaitJournal(ctx context.Context, ex contract.Executor, psid, dir, runID string,
	get func(ctx context.Context) (*contract.RunRecord, error), wait, interval time.Duration) error {
	p, err := journal.PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return err
	}
	if wait <= 0 {
		wait = DefaultAttachWait
	}
	if interval <= 0 {
		interval = DefaultAttachInterval
	}
	exists := func() bool {
		// Bounded by the wait: a hanging Exec must not hold the attach past it.
		pctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		res, err := ex.Exec(pctx, psid, "test -f "+journal.Quote(p.Journal))
		return err == nil && res.ExitCode == 0
	}
	if exists() {
		return nil
	}
	rec, err := get(ctx)
	switch {
	case err == nil && rec == nil, errors.Is(err, contract.ErrUnknownRun):
		return &Unavailable{RunID: runID, Reason: ReasonUnknownRun}
	case err == nil && rec.Status.Terminal():
		return &Unavailable{RunID: runID, Reason: ReasonTerminalRun}
	}
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return &Unavailable{RunID: runID, Reason: ReasonJournalTimeout, Wait: wait}
		}
		t := time.NewTimer(min(interval, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		if exists() {
			return nil
		}
	}
}
