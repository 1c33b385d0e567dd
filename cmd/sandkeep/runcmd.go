package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/apiclient"
	"github.com/sandkeep/sandkeep/shared/driver"
	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/wire"
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
	fmt.Fprintf(std.err, "sandkeep: run %s on thread %s (%s sandbox %s, %s), epoch %d; %s. Ctrl-C detaches.\n",
		cfg.runID, cfg.thread, st.Sandbox.Provider, st.Sandbox.ProviderSandboxID, st.Outcome, st.DriverEpoch, launched)
	cancel := st.CancelRequested != nil && *st.CancelRequested
	return driveAndPrint(ctx, c, cfg.runID, c.Transport(cfg.runID, st.Cursor), st.LeaseMs, cancel, 0, std)
}

// runAttach is `sandkeep attach`: take the run over at a new epoch, print the events after
// --after, then drive it on. A run that already ended is printed to its close.
func runAttach(ctx context.Context, cfg attachConfig, std streams) error {
	c, err := cfg.api.client(ctx)
	if err != nil {
		return err
	}
	at, err := c.Attach(ctx, cfg.runID)
	if errors.Is(err, sandbox.ErrTerminalRun) {
		fmt.Fprintf(std.err, "sandkeep: run %s has already ended; printing its events after offset %d\n", cfg.runID, cfg.after)
		cfg.follow = true
		return runTail(ctx, cfg, std)
	}
	if errors.Is(err, sandbox.ErrSuperseded) {
		// Another host attached at the same moment and holds a newer epoch.
		supersededLine(std, cfg.runID, cfg.after)
		return &exitStatus{exitSuperseded}
	}
	if err != nil {
		return fmt.Errorf("attach run %s: %w", cfg.runID, err)
	}
	fmt.Fprintf(std.err, "sandkeep: attached to run %s at epoch %d (events after offset %d follow). Ctrl-C detaches.\n",
		cfg.runID, at.DriverEpoch, cfg.after)
	return driveAndPrint(ctx, c, cfg.runID, c.Transport(cfg.runID, at.Cursor), at.LeaseMs, at.CancelRequested, cfg.after, std)
}

// driveAndPrint drives the run through tr (the one driver loop, shared/driver) while a
// reader prints its stored events after `after`, and turns the end into an exit status:
// completed 0, failed the agent's code, aborted 130, superseded 4, detached (ctx ended: a
// signal) 3. The driver's own log shows warnings only: stderr is for status lines.
func driveAndPrint(ctx context.Context, c *apiclient.Client, runID string, tr *apiclient.Transport, leaseMs int64,
	cancelRequested bool, after int64, std streams) error {
	p := &printer{out: std.out, last: after}
	readCtx, stopReading := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReading()
	var wg sync.WaitGroup
	var closed bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		closed = p.followRetrying(readCtx, c, runID, std)
	}()
	stopReader := func() int64 {
		stopReading()
		wg.Wait()
		return p.lastPrinted()
	}

	res, err := driver.Drive(ctx, tr, driver.Config{RunID: runID, LeaseMs: leaseMs, CancelRequested: cancelRequested, Logger: slog.New(slog.NewTextHandler(std.err, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	switch {
	case err != nil && ctx.Err() != nil:
		// Ctrl-C (or SIGTERM): leave the agent running and say how to come back.
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
	case err != nil:
		stopReader()
		return fmt.Errorf("drive run %s: %w", runID, err)
	case res.Outcome == driver.Superseded:
		supersededLine(std, runID, stopReader())
		return &exitStatus{exitSuperseded}
	}
	// The run ended (here, or elsewhere: Ended): print the log to its close, then the status.
	wg.Wait()
	if !closed {
		return fmt.Errorf("run %s ended but its log could not be read to the close", runID)
	}
	return endOfRun(ctx, c, runID, std)
}

// followRetrying is follow with a long poll that outlives transient failures (logged on
// stderr, retried every second) until the log closes or ctx ends.
func (p *printer) followRetrying(ctx context.Context, c *apiclient.Client, runID string, std streams) bool {
	for {
		closed, err := p.follow(ctx, c, runID, true)
		if err == nil || ctx.Err() != nil {
			return closed
		}
		fmt.Fprintf(std.err, "sandkeep: reading the events of run %s: %v (retrying)\n", runID, err)
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
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
	if errors.Is(err, keeper.ErrUnsupported) || errors.Is(err, sandbox.ErrInvalid) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachTimeout)
		defer cancel()
		_, ferr := c.Finish(fctx, runID, wire.FinishRequest{Cursor: cursor, Status: string(sandbox.StatusFailed),
			Error: &sandbox.RunError{Code: "launch-failed", Message: err.Error()}})
		if ferr == nil {
			fmt.Fprintf(std.err, "sandkeep: run %s failed: its agent could not be launched\n", runID)
		}
	}
	return fmt.Errorf("launch the agent of run %s: %w", runID, err)
}
