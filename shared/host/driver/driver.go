// Package driver is the driver loop of docs/design.md: it pumps a run's journal from inside
// the sandbox into the run's log (each line one event carrying its byte position, Src,
// fenced by the driver's epoch), heartbeats every third of the driver lease, honours
// cancel, and ends the run from the agent's exit code. A successor (attach, takeover)
// resumes at the log's highest Src, so every line is delivered exactly once, and the agent
// may be written in any language. One loop (Drive) runs over a Transport: in-process
// (Local: the keeper and the provider of this process) or the API (shared/host/driver/apitransport),
// whose pump route runs the same pump step (agentrun.Step) through the same agentrun.Service.
package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Defaults of Config.
const (
	DefaultRetryPause = 250 * time.Millisecond
	finishTimeout     = 20 * time.Second
)

// Config is one drive of one run.
type Config struct {
	RunID string
	// LeaseMs is the driver lease Start/Attach answered (default contract.DefaultDriverLease);
	// the drive heartbeats every third of it.
	LeaseMs        int64
	HeartbeatEvery time.Duration // default a third of LeaseMs
	// CancelRequested is the cancel flag Start/Attach answered.
	CancelRequested bool
	// PumpWait is how long one pump waits for new journal bytes (default and at most
	// agentrun.MaxPumpWait, and never past the next heartbeat).
	PumpWait time.Duration
	// RetryPause is the pause after a pump that failed transiently (default
	// DefaultRetryPause). A drive gives up when nothing succeeded for a whole lease: by
	// then the run is a successor's or the reaper's.
	RetryPause time.Duration
	Logger     *slog.Logger
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
	Run      contract.RunRecord // the terminal record (when this drive finished the run)
	ExitCode int                // the agent's exit code, when its sentinel was reached
	Events   int                // events this drive appended
	Src      int64              // journal position delivered up to
}

// Drive runs the loop over t until the run ends, this driver is superseded, or ctx ends (a
// cancelled ctx stops the drive silently, leaving the run to a successor or the reaper).
func Drive(ctx context.Context, t Transport, cfg Config) (Result, error) {
	if t == nil {
		return Result{}, errors.New("driver: a Transport is required")
	}
	if err := journal.CheckRunID(cfg.RunID); err != nil {
		return Result{}, err
	}
	lease := time.Duration(cfg.LeaseMs) * time.Millisecond
	if lease <= 0 {
		lease = contract.DefaultDriverLease * time.Millisecond
	}
	if cfg.HeartbeatEvery <= 0 {
		cfg.HeartbeatEvery = lease / 3
	}
	if cfg.PumpWait <= 0 || cfg.PumpWait > agentrun.MaxPumpWait {
		cfg.PumpWait = agentrun.MaxPumpWait
	}
	if cfg.RetryPause <= 0 {
		cfg.RetryPause = DefaultRetryPause
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	now := time.Now()
	d := &drive{t: t, cfg: cfg, lease: lease, cancel: cfg.CancelRequested,
		nextBeat: now.Add(cfg.HeartbeatEvery), lastOK: now}
	return d.run(ctx)
}

type drive struct {
	t        Transport
	cfg      Config
	lease    time.Duration
	cancel   bool
	nextBeat time.Time
	lastOK   time.Time // the last call that succeeded
	res      Result
}

// errStop ends the loop when the drive learnt it must stop (superseded, ended).
var errStop = errors.New("driver: stop")

func (d *drive) run(ctx context.Context) (Result, error) {
	for {
		if d.cancel {
			return d.abort(ctx)
		}
		wait := min(d.cfg.PumpWait, max(time.Until(d.nextBeat), 0))
		pr, err := d.t.Pump(ctx, wait)
		d.took(pr)
		switch {
		case err == nil:
			d.lastOK = time.Now()
		case ctx.Err() != nil:
			return d.res, fmt.Errorf("driver: %s: %w", d.cfg.RunID, context.Cause(ctx))
		default:
			if stop := d.refused("pump", err); stop != nil {
				return d.res, d.stopped(stop)
			}
		}
		if err == nil && pr.Exited {
			return d.finish(ctx, pr.ExitCode)
		}
		if err := d.beatIfDue(ctx); err != nil {
			return d.res, d.stopped(err)
		}
		if err != nil && !d.cancel {
			if err := d.pause(ctx); err != nil {
				return d.res, err
			}
		}
	}
}

// took records what a pump stored (also when it failed after storing some).
func (d *drive) took(pr PumpResult) {
	d.res.Events += pr.Appended
	d.res.Src = max(d.res.Src, pr.Src)
	d.cancel = d.cancel || pr.CancelRequested
}

// stopped turns errStop into the drive's quiet end; any other error is returned.
func (d *drive) stopped(err error) error {
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

// pause waits RetryPause after a transient failure; a drive with no success for a whole
// lease gives up (the run belongs to a successor or the reaper by now).
func (d *drive) pause(ctx context.Context) error {
	if time.Since(d.lastOK) > d.lease {
		return fmt.Errorf("driver: %s: no call succeeded for a whole lease (%s): %w", d.cfg.RunID, d.lease, keeper.ErrUnavailable)
	}
	t := time.NewTimer(d.cfg.RetryPause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("driver: %s: %w", d.cfg.RunID, context.Cause(ctx))
	case <-t.C:
		return nil
	}
}

// refused turns an answer that ends this driver's ownership into errStop (and the outcome);
// a refusal no retry can change is returned as an error; nil means a transient failure
// (logged; the loop retries).
func (d *drive) refused(what string, err error) error {
	switch {
	case errors.Is(err, contract.ErrSuperseded):
		d.res.Outcome = Superseded
	case errors.Is(err, contract.ErrLogClosed), errors.Is(err, contract.ErrTerminalRun), errors.Is(err, contract.ErrUnknownRun):
		d.res.Outcome = Ended
	case errors.Is(err, contract.ErrInvalid), errors.Is(err, contract.ErrSandboxGone), errors.Is(err, keeper.ErrUnsupported),
		errors.Is(err, contract.ErrConflict):
		return fmt.Errorf("driver: %s %s: %w", what, d.cfg.RunID, err)
	default:
		d.cfg.Logger.Warn("driver: call failed; retrying", "runId", d.cfg.RunID, "on", what, "err", err)
		return nil
	}
	d.cfg.Logger.Info("driver: stopping", "runId", d.cfg.RunID, "on", what, "outcome", d.res.Outcome)
	return errStop
}

// beatIfDue heartbeats when a third of the lease has passed since the last one.
func (d *drive) beatIfDue(ctx context.Context) error {
	if time.Now().Before(d.nextBeat) {
		return nil
	}
	hb, err := d.t.Heartbeat(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("driver: %s: %w", d.cfg.RunID, context.Cause(ctx))
		}
		if stop := d.refused("heartbeat", err); stop != nil {
			return stop
		}
		// Retried at the next turn; the lease has slack for two misses.
		d.nextBeat = time.Now().Add(d.cfg.RetryPause)
		return nil
	}
	d.lastOK = time.Now()
	d.nextBeat = time.Now().Add(d.cfg.HeartbeatEvery)
	d.cancel = d.cancel || hb.CancelRequested
	return nil
}

// abort honours a cancel: one last pump delivers what the journal holds; then the run
// ends from the exit code when the agent has exited, else aborted (Finish kills the
// agent's process group).
func (d *drive) abort(ctx context.Context) (Result, error) {
	pr, err := d.t.Pump(ctx, 0)
	d.took(pr)
	if err != nil {
		if stop := d.refused("pump", err); errors.Is(stop, errStop) {
			return d.res, nil
		}
	} else if pr.Exited {
		return d.finish(ctx, pr.ExitCode)
	}
	return d.end(ctx, agentrun.AbortInput(), Aborted)
}

// finish ends the run from the agent's exit code: 0 → completed, else failed with code
// "exit-<code>" (the service adds the agent's stderr tail to the message).
func (d *drive) finish(ctx context.Context, code int) (Result, error) {
	d.res.ExitCode = code
	if code == 0 {
		return d.end(ctx, keeper.FinishInput{Status: contract.StatusCompleted}, Completed)
	}
	return d.end(ctx, keeper.FinishInput{Status: contract.StatusFailed, Error: agentrun.ExitRunError(code)}, Failed)
}

// end writes the terminal status through the transport (which closes the log and removes
// the journal after it).
func (d *drive) end(ctx context.Context, in keeper.FinishInput, o Outcome) (Result, error) {
	// The terminal write must land even when the caller's ctx ends right now.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	rec, err := d.t.Finish(fctx, in)
	if err != nil {
		if stop := d.refused("finish", err); errors.Is(stop, errStop) {
			return d.res, nil
		}
		return d.res, fmt.Errorf("driver: finish %s: %w", d.cfg.RunID, err)
	}
	d.res.Outcome, d.res.Run = o, rec
	return d.res, nil
}
