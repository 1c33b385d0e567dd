package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/driver"
	"github.com/sandkeep/sandkeep/shared/host/driver/apitransport"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// detachTimeout bounds the detach a Ctrl-C sends (the signal already ended the drive).
const detachTimeout = 10 * time.Second

// runRun is `sandkeep run`: start the run (resuming or creating the thread's sandbox),
// launch the agent, then drive it and print its events.
func runRun(ctx context.Context, cfg runConfig, std streams) error {
	c, err := cfg.api.client(ctx)
	if err != nil {
		return err
	}
	st, err := c.Start(ctx, wire.StartRequest{RunID: cfg.runID, ThreadID: cfg.thread,
		Sandbox: &wire.SetupRequest{ID: cfg.sandboxID, Provider: cfg.provider}})
	if err != nil {
		return fmt.Errorf("start run %s: %w", cfg.runID, err)
	}
	ag, err := c.Agent(ctx, cfg.runID, wire.AgentRequest{Cursor: st.Cursor, Command: cfg.command})
	if err != nil {
		return launchFailed(ctx, c, cfg.runID, st.Cursor, err, std)
	}
	launched := "agent started"
	if !ag.Launched {
		launched = "its agent was already launched"
	}
	if ag.Shipping == wire.ShippingSandbox {
		// The sandbox ships the agent's output and ends the run: this command only watches.
		fmt.Fprintf(std.err, "sandkeep: run %s on thread %s (%s sandbox %s, %s), epoch %d; %s, its sandbox ships its output. Ctrl-C stops watching (the run goes on).\n",
			cfg.runID, cfg.thread, st.Sandbox.Provider, st.Sandbox.ProviderSandboxID, st.Outcome, st.DriverEpoch, launched)
		return watchAndPrint(ctx, c, cfg.runID, cfg.retryFor, std)
	}
	fmt.Fprintf(std.err, "sandkeep: run %s on thread %s (%s sandbox %s, %s), epoch %d; %s. Ctrl-C detaches.\n",
		cfg.runID, cfg.thread, st.Sandbox.Provider, st.Sandbox.ProviderSandboxID, st.Outcome, st.DriverEpoch, launched)
	cancel := st.CancelRequested != nil && *st.CancelRequested
	return driveAndPrint(ctx, c, cfg.runID, apitransport.New(c, cfg.runID, st.Cursor), st.LeaseMs, cancel, 0, cfg.retryFor, std)
}

// watchAndPrint prints a shipped run's events (the read loop of `tail --follow`) and turns
// its end into run's exit status; Ctrl-C stops the watching only, leaving the run to its
// sandbox, and says how to watch again.
func watchAndPrint(ctx context.Context, c *apiclient.Client, runID string, retryFor time.Duration, std streams) error {
	p := &printer{out: std.out}
	closed, err := p.followRetrying(ctx, c, runID, retryFor, std)
	switch {
	case err != nil:
		return fmt.Errorf("read the events of run %s: %w", runID, err)
	case !closed:
		n := p.lastPrinted()
		fmt.Fprintf(std.err, "sandkeep: stopped watching run %s after offset %d; it goes on in its sandbox.\n", runID, n)
		fmt.Fprintf(std.err, "sandkeep: to watch it again: sandkeep tail %s --follow --after %d\n", runID, n)
		return &exitStatus{exitDetached}
	}
	return endOfRun(ctx, c, runID, std)
}

// runAttach is `sandkeep attach`: take the run over at a new epoch, print the events after
// --after, then drive it on. A run that already ended is printed to its close.
func runAttach(ctx context.Context, cfg attachConfig, std streams) error {
	c, err := cfg.api.client(ctx)
	if err != nil {
		return err
	}
	at, err := c.Attach(ctx, cfg.runID)
	if errors.Is(err, contract.ErrTerminalRun) {
		fmt.Fprintf(std.err, "sandkeep: run %s has already ended; printing its events after offset %d\n", cfg.runID, cfg.after)
		cfg.follow = true
		return runTail(ctx, cfg, std)
	}
	if errors.Is(err, contract.ErrSuperseded) {
		// Another host attached at the same moment and holds a newer epoch.
		supersededLine(std, cfg.runID, cfg.after)
		return &exitStatus{exitSuperseded}
	}
	if err != nil {
		return fmt.Errorf("attach run %s: %w", cfg.runID, err)
	}
	if at.Shipping == agentrun.ShippingSandbox {
		// Its shipper (alive, or the new one this attach started) moves the journal: this
		// side only reads (docs/design.md §8.3).
		fmt.Fprintf(std.err, "sandkeep: run %s is shipped from its sandbox (epoch %d); following its events after offset %d. Ctrl-C stops following.\n",
			cfg.runID, at.DriverEpoch, cfg.after)
		return followAndPrint(ctx, c, cfg.runID, cfg.after, cfg.retryFor, std)
	}
	fmt.Fprintf(std.err, "sandkeep: attached to run %s at epoch %d (events after offset %d follow). Ctrl-C detaches.\n",
		cfg.runID, at.DriverEpoch, cfg.after)
	return driveAndPrint(ctx, c, cfg.runID, apitransport.New(c, cfg.runID, at.Cursor), at.LeaseMs, at.CancelRequested, cfg.after, cfg.retryFor, std)
}

// driveAndPrint drives the run through tr (the one driver loop, shared/host/driver) while a
// reader prints its stored events after `after`, and turns the end into an exit status:
// completed 0, failed the agent's code, aborted 130, superseded 4, detached (ctx ended: a
// signal) 3, an error 1 (a refusal no retry heals, or transient failures past retryFor,
// met by the driver or the reader: each stops the other). The driver's own log shows
// warnings only: stderr is for status lines.
func driveAndPrint(ctx context.Context, c *apiclient.Client, runID string, tr *apitransport.Transport, leaseMs int64,
	cancelRequested bool, after int64, retryFor time.Duration, std streams) error {
	p := &printer{out: std.out, last: after}
	// The drive ends with ctx (a signal) or when the reader fails for good (errReadFailed).
	driveCtx, stopDrive := context.WithCancelCause(ctx)
	defer stopDrive(nil)
	// The reader ignores the signal until the drive has stopped, so the offset the detach
	// line names is the last one printed.
	readCtx, stopReading := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReading()
	var closed bool
	var readErr error
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		closed, readErr = p.followRetrying(readCtx, c, runID, retryFor, std)
		if readErr != nil {
			stopDrive(errReadFailed)
		}
	}()
	stopReader := func() int64 {
		stopReading()
		<-readDone
		return p.lastPrinted()
	}

	res, err := driver.Drive(driveCtx, tr, driver.Config{RunID: runID, LeaseMs: leaseMs, CancelRequested: cancelRequested, Logger: slog.New(slog.NewTextHandler(std.err, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	switch {
	case err != nil && ctx.Err() != nil:
		// Ctrl-C (or SIGTERM): leave the agent running and say how to come back.
		fmt.Fprintf(std.err, "sandkeep: detaching from run %s (a second Ctrl-C exits at once)\n", runID)
		n := stopReader()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachTimeout)
		defer cancel()
		if _, derr := c.Detach(dctx, runID, tr.Cursor()); derr != nil {
			fmt.Fprintf(std.err, "sandkeep: stopped driving run %s, but the detach failed: %v\n", runID, derr)
		} else {
			fmt.Fprintf(std.err, "sandkeep: detached from run %s after offset %d; the agent keeps running.\n", runID, n)
		}
		fmt.Fprintf(std.err, "sandkeep: to take it over again: sandkeep attach %s --after %d\n", runID, n)
		return &exitStatus{exitDetached}
	case err != nil && errors.Is(context.Cause(driveCtx), errReadFailed):
		stopReader()
		return fmt.Errorf("read the events of run %s: %w", runID, readErr)
	case err != nil:
		n := stopReader()
		if errors.Is(err, apiclient.ErrStaleCursor) {
			// The server cannot verify this driver's cursor (it restarted with a new key):
			// a new attach gets one, and --after n continues the output exactly.
			fmt.Fprintf(std.err, "sandkeep: the API cannot verify this driver's cursor (code %s: the server restarted with a new cursor key); the run was left as it was.\n", wire.CodeStaleCursor)
			fmt.Fprintf(std.err, "sandkeep: to continue: sandkeep attach %s --after %d\n", runID, n)
		} else if errors.Is(err, keeper.ErrUnavailable) {
			fmt.Fprintf(std.err, "sandkeep: to take run %s over once the API answers: sandkeep attach %s --after %d\n", runID, runID, n)
		}
		return fmt.Errorf("drive run %s: %w", runID, err)
	case res.Outcome == driver.Superseded:
		supersededLine(std, runID, stopReader())
		return &exitStatus{exitSuperseded}
	}
	// The run ended (here, or elsewhere: Ended): print the log to its close, then the
	// status; a signal meanwhile stops the printing.
	select {
	case <-readDone:
	case <-ctx.Done():
		n := stopReader()
		fmt.Fprintf(std.err, "sandkeep: stopped following run %s after offset %d (sandkeep tail %s --after %d --follow goes on)\n", runID, n, runID, n)
		return &exitStatus{exitDetached}
	}
	if readErr != nil {
		return fmt.Errorf("read the events of run %s: %w", runID, readErr)
	}
	if !closed {
		return fmt.Errorf("run %s ended but its log could not be read to the close", runID)
	}
	return endOfRun(ctx, c, runID, std)
}

// followAndPrint prints a run's stored events after `after` until its log closes, then
// turns its end into an exit status as driveAndPrint does; it drives nothing (a shipper
// does). A signal stops the following (exit 3) and says how to go on.
func followAndPrint(ctx context.Context, c *apiclient.Client, runID string, after int64, retryFor time.Duration, std streams) error {
	p := &printer{out: std.out, last: after}
	closed, err := p.followRetrying(ctx, c, runID, retryFor, std)
	switch {
	case err != nil:
		return fmt.Errorf("read the events of run %s: %w", runID, err)
	case !closed && ctx.Err() != nil:
		n := p.lastPrinted()
		fmt.Fprintf(std.err, "sandkeep: stopped following run %s after offset %d; it keeps running (sandkeep tail %s --after %d --follow goes on)\n", runID, n, runID, n)
		return &exitStatus{exitDetached}
	case !closed:
		return fmt.Errorf("run %s: its log could not be read to the close", runID)
	}
	return endOfRun(ctx, c, runID, std)
}

// errReadFailed is the cause that stops a drive whose event reader failed for good.
var errReadFailed = errors.New("the event reader failed")

// Backoff of the event reader between transient failures.
const (
	readRetryBase = 250 * time.Millisecond
	readRetryMax  = 5 * time.Second
)

// followRetrying is the one event reader of run, attach and tail --follow: it prints
// runID's events after p.last as they are stored, over the API's push subscription where
// it offers one and long polls where it does not (apiclient.Subscription), until the log
// closes (closed), ctx ends (nil error), or a refusal no retry heals (unknown-run,
// unauthenticated, a 403, invalid, …). A failure that may heal (no answer, a dropped
// connection, 429, 502-504: apiclient.Transient) is logged on stderr and retried after a
// jittered exponential backoff, resuming after the last offset printed, as long as the
// failures have lasted less than retryFor since the API last answered.
func (p *printer) followRetrying(ctx context.Context, c *apiclient.Client, runID string, retryFor time.Duration, std streams) (bool, error) {
	sub := c.Subscribe(ctx, map[string]int64{runID: p.lastPrinted()})
	defer sub.Close()
	var failingSince time.Time
	delay := readRetryBase
	for {
		u, err := sub.Next(ctx)
		if err == nil && u.Err == nil {
			if err := p.print(u.Events); err != nil {
				return false, err
			}
			p.mu.Lock()
			p.last = max(p.last, u.Next)
			p.mu.Unlock()
			if u.Closed {
				return true, nil
			}
			continue
		}
		if err == nil {
			// The run's subscription was refused: it has left the subscription.
			if err = u.Err; apiclient.Transient(err) {
				sub.Add(runID, p.lastPrinted())
			}
		}
		switch {
		case ctx.Err() != nil:
			return false, nil
		case !apiclient.Transient(err):
			return false, err
		}
		now := time.Now()
		if failingSince.IsZero() || sub.Heard().After(failingSince) {
			failingSince, delay = now, readRetryBase
		}
		if now.Sub(failingSince) >= retryFor {
			return false, fmt.Errorf("no read succeeded for %s (--retry-for): %w", retryFor, err)
		}
		fmt.Fprintf(std.err, "sandkeep: reading the events of run %s: %v (retrying)\n", runID, err)
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-t.C:
		}
		delay = min(2*delay, readRetryMax)
	}
}

// supersededLine says that another driver holds the run and how to watch it from offset n.
func supersededLine(std streams, runID string, n int64) {
	fmt.Fprintf(std.err, "sandkeep: run %s was taken over by another driver; this one stopped and wrote nothing more.\n", runID)
	fmt.Fprintf(std.err, "sandkeep: to watch it: sandkeep tail %s --after %d --follow\n", runID, n)
}

// launchFailed reports an agent the API refused to launch. A refusal no retry changes (the
// provider cannot exec, a bad command or env) fails the run at once, so it does not stay
// running with nothing to drive until the reaper expires it; anything else leaves it be.
func launchFailed(ctx context.Context, c *apiclient.Client, runID, cursor string, err error, std streams) error {
	if errors.Is(err, apiclient.ErrUnsupported) || errors.Is(err, contract.ErrInvalid) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachTimeout)
		defer cancel()
		_, ferr := c.Finish(fctx, runID, wire.FinishRequest{Cursor: cursor, Status: string(contract.StatusFailed),
			Error: &contract.RunError{Code: "launch-failed", Message: err.Error()}})
		if ferr == nil {
			fmt.Fprintf(std.err, "sandkeep: run %s failed: its agent could not be launched\n", runID)
		}
	}
	return fmt.Errorf("launch the agent of run %s: %w", runID, err)
}
