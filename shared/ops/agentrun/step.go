package agentrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Log is what the pump step writes through; *keeper.Keeper implements it.
type Log interface {
	// Append appends events at cursor at, fenced by at.Epoch: ErrSuperseded, ErrLogClosed,
	// ErrConflict (another batch at that cursor) as contract.EventLog.Append.
	Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error)
	// Fence makes epoch the log's owner again and returns where the log stands for it.
	Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error)
	// Get returns the run record, read consistently; unknown is ErrUnknownRun.
	Get(ctx context.Context, runID string) (contract.RunRecord, error)
}

var _ Log = (*keeper.Keeper)(nil)

// The pump step's batches by default.
const (
	DefaultBatchEvents = 256     // events per append at most
	DefaultBatchBytes  = 1 << 20 // event bytes per append at most (the log splits into items)
)

// Pump step bounds and pacing.
const (
	// MaxPumpWait bounds a pump's wait for new journal bytes (the pump route's waitMs).
	MaxPumpWait = 10 * time.Second
	// MaxPumpBytes bounds the journal bytes one pump step fetches and the event bytes it
	// stores; the rest waits for the next step (which starts at once), so one request
	// stays short.
	MaxPumpBytes = 4 << 20
	// DefaultPumpPollMin and DefaultPumpPollMax pace a waiting pump's journal reads: the
	// pause doubles from the first to the second, so a silent agent costs at most about
	// five provider calls a second and a line written after a pause is seen within 200 ms.
	DefaultPumpPollMin = 20 * time.Millisecond
	DefaultPumpPollMax = 200 * time.Millisecond
	// conflictRounds bounds how often one step re-learns the log's position after another
	// writer stored a batch at its cursor.
	conflictRounds = 8
)

// StepInput is one pump step of one run.
type StepInput struct {
	Log       Log
	Executor  contract.Executor
	SandboxID string // the provider sandbox the journal lives in
	Dir       string // journal directory ("" = the provider's, journal.DirFor)
	// Source, when set, is where the journal's bytes come from instead of the sandbox
	// (Executor, SandboxID and Dir unused): the bytes a shipper sent (journal.Bytes).
	Source journal.Source
	RunID  string
	At     contract.Cursor // the driver's cursor: epoch and the journal position (Src) stored
	// Wait is how long to wait for new journal bytes when there are none (at most
	// MaxPumpWait); 0 reads once.
	Wait             time.Duration
	PollMin, PollMax time.Duration // defaults DefaultPumpPollMin/Max
	BatchEvents      int           // default DefaultBatchEvents
	BatchBytes       int           // default DefaultBatchBytes
}

// StepResult is a pump step's answer.
type StepResult struct {
	Cursor          contract.Cursor // the driver's cursor after the step
	Appended        int             // events this step stored (an own retried batch counts)
	Exited          bool            // the exit sentinel was reached and every line before it is stored
	ExitCode        int             // when Exited
	CancelRequested bool            // a cancel was seen (in-band, on a fence, or on the run)
}

// errBudget ends a step's read once it stored MaxPumpBytes.
var errBudget = errors.New("driver: pump budget spent")

// errConflict ends a read whose append met another writer's batch at the cursor.
var errConflict = errors.New("driver: another writer stored at the cursor")

// Step is the pump step both transports use (the pump route and the in-process drive): it
// reads the journal from the cursor's Src, appends its new lines (one line, one event with
// its Src) fenced by the cursor's epoch, and waits up to Wait for bytes when there are none,
// re-reading at a bounded pace. Exactly once whatever happens around it: a retried step at
// the same cursor meets its own batches (stored once, by digest) or another batch at the
// cursor (ErrConflict); then the log is fenced again at the epoch, which answers the
// position really stored, and the step reads on from there — so a lost answer, two racing
// pumpers of one epoch and a stale cursor never store a line twice or skip one. A later
// epoch's fence refuses every append (ErrSuperseded). A step that stored nothing reads the
// run once, so a pumper learns of a cancel, a successor or the run's end while the agent
// is silent.
func Step(ctx context.Context, in StepInput) (StepResult, error) {
	if in.Log == nil || in.Source == nil && (in.Executor == nil || in.SandboxID == "") {
		return StepResult{}, errors.New("driver: step: Log, and a Source or an Executor and SandboxID, are required")
	}
	in.Wait = min(max(in.Wait, 0), MaxPumpWait)
	if in.PollMin <= 0 {
		in.PollMin = DefaultPumpPollMin
	}
	if in.PollMax < in.PollMin {
		in.PollMax = max(DefaultPumpPollMax, in.PollMin)
	}
	if in.BatchEvents <= 0 {
		in.BatchEvents = DefaultBatchEvents
	}
	if in.BatchBytes <= 0 {
		in.BatchBytes = DefaultBatchBytes
	}
	s := &step{in: in, res: StepResult{Cursor: in.At}}
	deadline := time.Now().Add(in.Wait)
	pause := in.PollMin
	for {
		end, err := s.read(ctx)
		if err != nil {
			return s.res, err
		}
		if end.Finished {
			s.res.Exited, s.res.ExitCode = true, end.ExitCode
			return s.res, nil
		}
		if s.res.Appended > 0 || s.spent {
			return s.res, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return s.res, fmt.Errorf("driver: pump %s: %w", in.RunID, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, in.PollMax)
	}
	// Nothing new: the run itself says whether this driver should go on.
	rec, err := in.Log.Get(ctx, in.RunID)
	if err != nil {
		return s.res, err
	}
	if err := s.judge(rec); err != nil {
		return s.res, err
	}
	return s.res, nil
}

type step struct {
	in      StepInput
	res     StepResult
	bytes   int             // event bytes stored by this step
	fetched int64           // journal bytes this step fetched
	spent   bool            // MaxPumpBytes reached
	rd      *journal.Reader // at the cursor's Src; kept while the step waits, so no byte is fetched twice
}

// reader returns the journal reader at the cursor's Src: the step's own while it is
// there, a new one after a conflict, an error or a spent budget moved the cursor.
func (s *step) reader(ctx context.Context) (*journal.Reader, error) {
	if s.rd != nil && s.rd.Pos() == s.res.Cursor.Src {
		return s.rd, nil
	}
	var rd *journal.Reader
	var err error
	if s.in.Source != nil {
		rd, err = journal.NewSourceReader(s.in.Source, s.in.RunID, s.res.Cursor.Src)
	} else {
		rd, err = journal.NewReader(ctx, s.in.Executor, s.in.SandboxID, s.in.Dir, s.in.RunID, s.res.Cursor.Src)
	}
	s.rd = rd
	return rd, err
}

// read pumps the journal from the cursor's Src to its end (or MaxPumpBytes), re-learning the
// position after a conflict.
func (s *step) read(ctx context.Context) (journal.End, error) {
	for round := 0; ; round++ {
		rd, err := s.reader(ctx)
		if err != nil {
			return journal.End{}, err
		}
		limit := MaxPumpBytes - s.fetched
		if limit <= 0 {
			s.spent = true
			return journal.End{Pos: s.res.Cursor.Src}, nil
		}
		before := rd.Fetched()
		end, err := PumpFrom(ctx, rd, limit, journal.NewTranslator(s.in.RunID),
			s.in.BatchEvents, s.in.BatchBytes, s.flush(ctx), nil)
		s.fetched += rd.Fetched() - before
		if err != nil {
			s.rd = nil // it may have read past what was stored
		}
		switch {
		case err == nil && end.Limited:
			s.spent = true
			return end, nil
		case errors.Is(err, errBudget):
			s.spent = true
			return journal.End{Pos: s.res.Cursor.Src}, nil
		case errors.Is(err, errConflict) && round < conflictRounds:
			if err := s.refence(ctx); err != nil {
				return journal.End{}, err
			}
			continue
		case errors.Is(err, errConflict):
			return journal.End{}, fmt.Errorf("driver: pump %s: %d conflicts in one step: %w", s.in.RunID, round, keeper.ErrUnavailable)
		}
		return end, err
	}
}

// flush appends one batch at the cursor.
func (s *step) flush(ctx context.Context) func([]contract.Event) error {
	return func(events []contract.Event) error {
		res, err := s.in.Log.Append(ctx, s.in.RunID, s.res.Cursor, events)
		switch {
		case errors.Is(err, contract.ErrConflict):
			return errConflict
		case errors.Is(err, contract.ErrLogClosed):
			return fmt.Errorf("driver: pump %s: log closed: %w", s.in.RunID, contract.ErrTerminalRun)
		case err != nil:
			return err
		}
		s.res.Cursor = res.Cursor
		s.res.Appended += len(events)
		s.res.CancelRequested = s.res.CancelRequested || res.CancelRequested
		for _, e := range events {
			s.bytes += len(e.Data)
		}
		if s.bytes >= MaxPumpBytes {
			return errBudget
		}
		return nil
	}
}

// refence learns where the log stands for the cursor's epoch after another writer stored at
// the cursor (a racing pumper, or this cursor's own earlier answer that was lost): the
// fence answers the highest Src stored, and the run says whether a cancel came meanwhile.
func (s *step) refence(ctx context.Context) error {
	res, err := s.in.Log.Fence(ctx, s.in.RunID, s.res.Cursor.Epoch)
	if errors.Is(err, contract.ErrLogClosed) {
		return fmt.Errorf("driver: pump %s: log closed: %w", s.in.RunID, contract.ErrTerminalRun)
	}
	if err != nil {
		return err
	}
	s.res.Cursor = res.Cursor
	rec, err := s.in.Log.Get(ctx, s.in.RunID)
	if err != nil {
		return err
	}
	return s.judge(rec)
}

// judge refuses a step whose run moved on (a later epoch, or terminal) and notes a cancel.
func (s *step) judge(rec contract.RunRecord) error {
	switch {
	case rec.Epoch() > s.res.Cursor.Epoch:
		return fmt.Errorf("driver: pump %s: epoch %d superseded by %d: %w", s.in.RunID, s.res.Cursor.Epoch, rec.Epoch(), contract.ErrSuperseded)
	case rec.Status.Terminal():
		return fmt.Errorf("driver: pump %s: run is %s: %w", s.in.RunID, rec.Status, contract.ErrTerminalRun)
	}
	s.res.CancelRequested = s.res.CancelRequested || rec.Cancelled()
	return nil
}
