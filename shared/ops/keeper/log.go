package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Read sizing and long-poll pacing.
const (
	DefaultReadLimit = 100
	// ReadPollEvery paces a long poll on a backend that cannot wake its readers
	// (contract.LogWaker): an idle read of DynamoDB costs two calls (the page query and the
	// run's terminal check), so a waiting reader costs 1.6 reads per second, and a whole
	// idle long poll of W ≥ 4 s — its first answer's three reads included (the empty page
	// and the run's resolution, docs/design.md §11) — at most 2 per second of W.
	ReadPollEvery = 1250 * time.Millisecond
)

// Append appends events at the driver's cursor (fenced by its epoch).
func (k *Keeper) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	if err := contract.CheckEvents(events); err != nil {
		return contract.AppendResult{}, err
	}
	// A repeated Append of the same batch at the same cursor stores it once (docs/design.md §2.4).
	res, err := k.st.Log().Append(ctx, runID, at, events)
	k.landed(ctx, runID, appended(at, events, res, err))
	if err != nil {
		return contract.AppendResult{}, fmt.Errorf("keeper: append to %q at epoch %d: %w", runID, at.Epoch, err)
	}
	return res, nil
}

// Read returns events after `after`, waiting up to wait while none exist and the log is
// open. A backend with contract.LogWaker is read again only when the log changed; any other
// is read every ReadPollEvery — and, on every backend, at once when this keeper lands a
// write to the run's log (Config.Wake). Drain ends every wait at once with the page in hand.
func (k *Keeper) Read(ctx context.Context, runID string, after int64, limit int, wait time.Duration) (ReadResult, error) {
	return k.read(ctx, runID, after, limit, wait, true)
}

// Await is Read for a caller that has just read an empty, open page after `after`: on a
// polled backend it waits ReadPollEvery, or this keeper's next write to the run's log,
// before reading again (no read repeated at once).
func (k *Keeper) Await(ctx context.Context, runID string, after int64, limit int, wait time.Duration) (ReadResult, error) {
	return k.read(ctx, runID, after, limit, wait, false)
}

// Drain wakes every waiting long poll and makes later ones answer at once (a shutdown:
// readers get what there is, then reconnect to another server). Idempotent.
func (k *Keeper) Drain() { k.drainOnce.Do(func() { close(k.drain) }) }

// Drained is closed by Drain: the push connections of this process end at it.
func (k *Keeper) Drained() <-chan struct{} { return k.drain }

func (k *Keeper) read(ctx context.Context, runID string, after int64, limit int, wait time.Duration, readFirst bool) (ReadResult, error) {
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	tenant, err := contract.Tenant(ctx) // the wake key's; refused before any wait
	if err != nil {
		return ReadResult{}, fmt.Errorf("keeper: read log of %q: %w", runID, err)
	}
	// The wait runs on the monotonic clock: cfg.Now may be a test's frozen wall clock.
	deadline := time.Now().Add(wait)
	waker, _ := k.cfg.Backend.(contract.LogWaker)
	res, readNow := ReadResult{Next: after}, readFirst
	for first := true; ; first = false {
		var (
			changed <-chan struct{}
			woken   <-chan struct{} // this keeper's own writes (Config.Wake)
			stop    = func() {}
		)
		if wait > 0 {
			// Subscribed before reading (as below), so a write landing in between wakes it.
			// A write between an Await caller's read and this subscription waits a period.
			var unwake func()
			woken, unwake = k.cfg.Wake.Wait(RunKey{Tenant: tenant, RunID: runID})
			stop = unwake
		}
		if waker != nil && wait > 0 {
			// Subscribe before reading, so a change between the read and the wait wakes it.
			ch, unchange, err := waker.LogChanged(ctx, runID)
			if err != nil {
				stop()
				return ReadResult{}, fmt.Errorf("keeper: read log of %q: %w", runID, err)
			}
			unwake := stop
			changed, stop = ch, func() { unchange(); unwake() }
			// The caller's own empty read came before the subscription: read once more.
			readNow = readNow || first
		}
		if readNow {
			evs, next, closed, err := k.st.Log().Read(ctx, runID, after, limit)
			p := ReadResult{Events: evs, Next: next, Closed: closed}
			if err != nil {
				stop()
				return ReadResult{}, fmt.Errorf("keeper: read log of %q after %d: %w", runID, after, err)
			}
			if res = p; len(res.Events) > 0 || res.Closed {
				stop()
				return res, nil
			}
		}
		left := time.Until(deadline)
		if left <= 0 || k.draining() {
			stop()
			return res, nil
		}
		pause := left
		if changed == nil {
			// Polled: read only at whole periods, never faster (the budget); when no period
			// fits before the deadline, wait it out and answer what there is.
			pause = min(ReadPollEvery, left)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			stop()
			return res, fmt.Errorf("keeper: read log of %q: %w", runID, context.Cause(ctx))
		case <-k.drain:
			readNow = false // answer what there is
		case <-changed:
			readNow = true
		case <-woken:
			readNow = true
		case <-t.C:
			readNow = changed == nil && pause == ReadPollEvery // a whole poll period, not the deadline
		}
		t.Stop()
		stop()
	}
}

// draining reports whether Drain was called.
func (k *Keeper) draining() bool {
	select {
	case <-k.drain:
		return true
	default:
		return false
	}
}

// Finish writes the terminal status fenced by the cursor's epoch, then closes the log;
// interrupted writes no finishedAt and leaves the log open. A retried finish is idempotent.
func (k *Keeper) Finish(ctx context.Context, runID string, at contract.Cursor, in FinishInput) (contract.RunRecord, error) {
	p, err := k.finishPatch(in)
	if err != nil {
		return contract.RunRecord{}, err
	}
	st, err := k.st.Runs().UpdateFenced(ctx, runID, at.Epoch, p)
	k.landed(ctx, runID, Landing{After: max(at.Next-1, 0)}) // a terminal write: a reader at the tail answers closed
	if errors.Is(err, contract.ErrTerminalRun) {
		// A retried finish whose first attempt landed (possibly with another status, or
		// whose close was lost): the run is terminal at this very epoch, so it was ours.
		cur, rerr := k.st.Runs().State(ctx, runID)
		if rerr == nil && cur != nil && cur.Status.Terminal() && cur.Epoch() == at.Epoch {
			st, err = *cur, nil
		}
	}
	if err != nil {
		// Never close on a refusal: the log may belong to a successor.
		return contract.RunRecord{}, fmt.Errorf("keeper: finish %q at epoch %d: %w", runID, at.Epoch, err)
	}
	if !st.Status.Terminal() {
		return st.RunRecord, nil // interrupted: a pause, the log stays open
	}
	err = k.st.Log().Close(ctx, runID, at)
	k.landed(ctx, runID, Landing{After: max(at.Next-1, 0)})
	if err != nil && !errors.Is(err, contract.ErrLogClosed) {
		return contract.RunRecord{}, fmt.Errorf("keeper: close log of %q at epoch %d: %w", runID, at.Epoch, err)
	}
	return st.RunRecord, nil
}

// finishPatch builds Finish's fenced write: the status, finishedAt unless interrupted,
// and the error and usage when given.
func (k *Keeper) finishPatch(in FinishInput) (contract.RunPatch, error) {
	if in.Status != contract.StatusInterrupted && !in.Status.Terminal() {
		return contract.RunPatch{}, contract.Invalid("status", "must be completed, failed, aborted or interrupted, not %q", in.Status)
	}
	p := contract.RunPatch{Status: contract.Set(in.Status)}
	if in.Status.Terminal() {
		p.FinishedAt = contract.Set(k.nowMs())
	}
	if in.Error != nil {
		p.Error = contract.Set(*in.Error)
	}
	if in.CancelRequested {
		p.CancelRequested = contract.Set(true)
	}
	if len(in.Usage) > 0 {
		if !json.Valid(in.Usage) {
			return contract.RunPatch{}, contract.Invalid("usage", "not a JSON document")
		}
		p.Usage = contract.Set(in.Usage)
	}
	return p, nil
}
