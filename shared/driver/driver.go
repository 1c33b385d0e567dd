// Package driver is the in-host driver loop of SPEC §4.2 and §6: it tails a run's journal
// inside the sandbox, translates each line into one event carrying its byte position (Src),
// appends the events fenced by the driver's epoch, heartbeats every third of the driver
// lease, honours cancel, and ends the run from the agent's exit code. A successor (attach,
// takeover) resumes at the log's highest Src, so every line is delivered exactly once, and
// the agent may be written in any language.
package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/journal"
	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Ops are the keeper operations a driver uses; *keeper.Keeper implements them.
type Ops interface {
	// Append appends events at cursor at, fenced by at.Epoch.
	Append(ctx context.Context, runID string, at sandbox.Cursor, events []sandbox.Event) (sandbox.AppendResult, error)
	// Heartbeat extends the driver lease of epoch; refused: ErrSuperseded/ErrTerminalRun.
	Heartbeat(ctx context.Context, runID string, epoch int64) (keeper.HeartbeatResult, error)
	// Finish writes the terminal status fenced by at.Epoch, then closes the log.
	Finish(ctx context.Context, runID string, at sandbox.Cursor, in keeper.FinishInput) (sandbox.RunRecord, error)
}

var _ Ops = (*keeper.Keeper)(nil)

// Defaults of Config.
const (
	DefaultPollInterval = 250 * time.Millisecond
	DefaultBatchEvents  = 256     // events per append at most
	DefaultBatchBytes   = 1 << 20 // event bytes per append at most (the log splits into items)
	finishTimeout       = 20 * time.Second
)

// Config is one drive of one run.
type Config struct {
	Ops       Ops
	Executor  sandbox.Executor
	SandboxID string // the provider sandbox id the journal lives in
	Dir       string // journal directory in the sandbox ("" = the provider's, journal.DirFor)
	RunID     string
	// Driver is what Start/Attach returned: epoch, cursor (with the log's highest Src),
	// lease and the cancel flag as seen then.
	Driver keeper.Driver
	// HeartbeatEvery defaults to a third of Driver.LeaseMs.
	HeartbeatEvery time.Duration
	// PollInterval is the wait between journal reads that found nothing new.
	PollInterval time.Duration
	BatchEvents  int
	BatchBytes   int
	Logger       *slog.Logger
	// BeforeAppend is a TEST HOOK called before every append with the batch about to go;
	// a test uses it to hold a driver at a chosen point. Never set it in production.
	BeforeAppend func(ctx context.Context, events []sandbox.Event)
}

// Outcome says how a drive ended.
type Outcome string

// Drive outcomes.
const (
	Completed  Outcome = "completed"  // the agent exited 0; run completed
	Failed     Outcome = "failed"     // the agent exited non-zero; run failed with the code
	Aborted    Outcome = "aborted"    // a cancel was honoured; the agent was killed
	Superseded Outcome = "superseded" // another driver owns the run: this one wrote nothing more
	Ended      Outcome = "ended"      // the run was already terminal or its log closed
)

// Result is a drive's answer.
type Result struct {
	Outcome  Outcome
	Run      sandbox.RunRecord // the terminal record (when this drive finished the run)
	ExitCode int               // the agent's exit code, when its sentinel was reached
	Events   int               // events this drive appended
	Src      int64             // journal position delivered up to
}

// ErrNoPID: cancel was requested but the agent's pid file was missing, so nothing was killed.
var ErrNoPID = errors.New("driver: agent pid file missing")

// Drive runs the loop until the run ends, this driver is superseded, or ctx ends (a
// cancelled ctx stops the drive silently, leaving the run to a successor or the reaper).
// The journal is deleted only after the terminal write and the close succeeded.
func Drive(ctx context.Context, cfg Config) (Result, error) {
	d, err := newDrive(cfg)
	if err != nil {
		return Result{}, err
	}
	return d.run(ctx)
}

type drive struct {
	cfg      Config
	cur      sandbox.Cursor
	pos      int64 // journal position delivered (the highest Src stored)
	tr       *journal.Translator
	cancel   bool
	nextBeat time.Time
	res      Result
}

func newDrive(cfg Config) (*drive, error) {
	if cfg.Ops == nil || cfg.Executor == nil || cfg.SandboxID == "" {
		return nil, errors.New("driver: Ops, Executor and SandboxID are required")
	}
	if err := journal.CheckRunID(cfg.RunID); err != nil {
		return nil, err
	}
	if cfg.HeartbeatEvery <= 0 {
		lease := cfg.Driver.LeaseMs
		if lease <= 0 {
			lease = sandbox.DefaultDriverLease
		}
		cfg.HeartbeatEvery = time.Duration(lease) * time.Millisecond / 3
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.BatchEvents <= 0 {
		cfg.BatchEvents = DefaultBatchEvents
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cur := cfg.Driver.Cursor
	if cur.Epoch == 0 {
		cur.Epoch = cfg.Driver.Epoch
	}
	return &drive{
		cfg:      cfg,
		cur:      cur,
		pos:      max(cfg.Driver.Src, cur.Src),
		tr:       journal.NewTranslator(cfg.RunID),
		cancel:   cfg.Driver.CancelRequested,
		nextBeat: time.Now().Add(cfg.HeartbeatEvery),
	}, nil
}

// errStop ends the read loop when the drive learnt it must stop (superseded, ended).
var errStop = errors.New("driver: stop")

func (d *drive) run(ctx context.Context) (Result, error) {
	for {
		if d.cancel {
			return d.abort(ctx)
		}
		end, err := d.readOnce(ctx)
		switch {
		case errors.Is(err, errStop):
			return d.result(), nil
		case err != nil && ctx.Err() != nil:
			return d.result(), fmt.Errorf("driver: %s: %w", d.cfg.RunID, context.Cause(ctx))
		case err != nil:
			return d.result(), err
		}
		if end.Finished {
			return d.finish(ctx, end.ExitCode)
		}
		if d.cancel {
			continue
		}
		if err := d.beatIfDue(ctx); errors.Is(err, errStop) {
			return d.result(), nil
		} else if err != nil {
			return d.result(), err
		}
		t := time.NewTimer(d.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return d.result(), fmt.Errorf("driver: %s: %w", d.cfg.RunID, context.Cause(ctx))
		case <-t.C:
		}
	}
}

func (d *drive) result() Result {
	d.res.Src = d.pos
	return d.res
}

// readOnce reads the journal from the delivered position to its current end, appending
// every line in batches; lines are counted as delivered only once their append landed.
// Heartbeats ride along a long read, so a big journal never lapses the lease.
func (d *drive) readOnce(ctx context.Context) (journal.End, error) {
	return Pump(ctx, d.cfg.Executor, d.cfg.SandboxID, d.cfg.Dir, d.cfg.RunID, d.pos, d.tr,
		d.cfg.BatchEvents, d.cfg.BatchBytes,
		func(events []sandbox.Event) error { return d.append(ctx, events) },
		func() error { return d.beatIfDue(ctx) })
}

// append stores one batch at the cursor; a cancel seen in-band is noted, a superseded or
// closed log stops the drive without another write.
func (d *drive) append(ctx context.Context, events []sandbox.Event) error {
	if d.cfg.BeforeAppend != nil {
		d.cfg.BeforeAppend(ctx, events)
	}
	res, err := d.cfg.Ops.Append(ctx, d.cfg.RunID, d.cur, events)
	if err != nil {
		return d.refused("append", err)
	}
	d.cur = res.Cursor
	d.pos = sandbox.MaxSrc(d.pos, events)
	d.res.Events += len(events)
	if res.CancelRequested {
		d.cancel = true
	}
	return nil
}

// refused turns an answer that ends this driver's ownership into errStop (and the outcome);
// anything else is returned as an error.
func (d *drive) refused(what string, err error) error {
	switch {
	case errors.Is(err, sandbox.ErrSuperseded):
		d.res.Outcome = Superseded
	case errors.Is(err, sandbox.ErrLogClosed), errors.Is(err, sandbox.ErrTerminalRun), errors.Is(err, sandbox.ErrUnknownRun):
		d.res.Outcome = Ended
	default:
		return fmt.Errorf("driver: %s %s: %w", what, d.cfg.RunID, err)
	}
	d.cfg.Logger.Info("driver: stopping", "runId", d.cfg.RunID, "epoch", d.cur.Epoch, "on", what, "outcome", d.res.Outcome)
	return errStop
}

// beatIfDue heartbeats when a third of the lease has passed since the last one.
func (d *drive) beatIfDue(ctx context.Context) error {
	if time.Now().Before(d.nextBeat) {
		return nil
	}
	hb, err := d.cfg.Ops.Heartbeat(ctx, d.cfg.RunID, d.cur.Epoch)
	if err != nil {
		if stop := d.refused("heartbeat", err); errors.Is(stop, errStop) {
			return stop
		}
		// A failed heartbeat is retried at the next poll; the lease has slack for two.
		d.cfg.Logger.Warn("driver: heartbeat failed", "runId", d.cfg.RunID, "err", err)
		d.nextBeat = time.Now().Add(d.cfg.PollInterval)
		return nil
	}
	d.nextBeat = time.Now().Add(d.cfg.HeartbeatEvery)
	if hb.CancelRequested {
		d.cancel = true
	}
	return nil
}

// abort honours a cancel: kill the agent's process group, deliver what the journal holds,
// then end the run aborted (or from the exit code when the sentinel was already there).
func (d *drive) abort(ctx context.Context) (Result, error) {
	killErr := journal.KillAgent(ctx, d.cfg.Executor, d.cfg.SandboxID, d.cfg.Dir, d.cfg.RunID)
	if killErr != nil {
		d.cfg.Logger.Warn("driver: killing the agent failed", "runId", d.cfg.RunID, "err", killErr)
	}
	end, err := d.readOnce(ctx)
	switch {
	case errors.Is(err, errStop):
		return d.result(), nil
	case err != nil:
		return d.result(), err
	}
	if end.Finished {
		return d.finish(ctx, end.ExitCode)
	}
	in := keeper.FinishInput{Status: sandbox.StatusAborted, Error: &sandbox.RunError{Message: "cancelled", Code: "cancelled"}}
	return d.end(ctx, in, Aborted)
}

// finish ends the run from the agent's exit code: 0 → completed, else failed with the code.
func (d *drive) finish(ctx context.Context, code int) (Result, error) {
	d.res.ExitCode = code
	if code == 0 {
		return d.end(ctx, keeper.FinishInput{Status: sandbox.StatusCompleted}, Completed)
	}
	return d.end(ctx, keeper.FinishInput{Status: sandbox.StatusFailed, Error: ExitError(ctx, d.cfg.Executor, d.cfg.SandboxID, d.cfg.Dir, d.cfg.RunID, code)}, Failed)
}

// end writes the terminal status and closes the log (keeper.Finish), then deletes the
// journal — only after both succeeded (§6).
func (d *drive) end(ctx context.Context, in keeper.FinishInput, o Outcome) (Result, error) {
	// The terminal write must land even when the caller's ctx ends right now.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	rec, err := d.cfg.Ops.Finish(fctx, d.cfg.RunID, d.cur, in)
	if err != nil {
		if stop := d.refused("finish", err); errors.Is(stop, errStop) {
			return d.result(), nil
		}
		return d.result(), fmt.Errorf("driver: finish %s: %w", d.cfg.RunID, err)
	}
	d.res.Outcome, d.res.Run = o, rec
	if err := journal.Delete(fctx, d.cfg.Executor, d.cfg.SandboxID, d.cfg.Dir, d.cfg.RunID); err != nil {
		// The run is finished; a leftover journal is swept later (§6 journal sweep).
		d.cfg.Logger.Warn("driver: deleting the journal failed", "runId", d.cfg.RunID, "err", err)
	}
	return d.result(), nil
}

// ExitError is the error a run that exited with code ends with: code "exit-<code>", and
// the message carrying the first 1000 bytes of the stderr sidecar's tail when readable.
func ExitError(ctx context.Context, ex sandbox.Executor, psid, dir, runID string, code int) *sandbox.RunError {
	msg := "agent exited with code " + strconv.Itoa(code)
	if tail, err := journal.StderrTail(ctx, ex, psid, dir, runID, 0); err == nil {
		if s := strings.TrimSpace(strings.ToValidUTF8(string(tail), "\uFFFD")); s != "" {
			if len(s) > 1000 {
				s = s[len(s)-1000:]
			}
			msg += ": " + strings.ToValidUTF8(s, "")
		}
	}
	return &sandbox.RunError{Message: msg, Code: "exit-" + strconv.Itoa(code)}
}
