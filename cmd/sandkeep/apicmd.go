package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/apiclient/sigv4auth"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// Exit statuses of run, attach and tail (0 completed; a failed run exits with its agent's
// code, or 1 when it has none).
const (
	exitFailure    = 1
	exitDetached   = 3
	exitSuperseded = 4
	exitAborted    = 130
)

// exitStatus is a command's chosen exit status, with the line (if any) already printed.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return "exit status " + strconv.Itoa(e.code) }

// readTimeout bounds one read of the stored events (its retries included): a server that
// vanished without closing the connection is a transient failure, not a wait for ever.
const readTimeout = 30 * time.Second

// defaultRetryFor is how long run, attach and tail --follow keep retrying transient
// failures (no answer, 429, 502-504) before they give up (--retry-for).
const defaultRetryFor = 2 * time.Minute

// client returns the API client the flags describe.
func (a apiFlags) client(ctx context.Context) (*apiclient.Client, error) {
	cfg := apiclient.Config{BaseURL: a.api, Tenant: a.tenant, PushURL: a.pushURL}
	switch a.auth {
	case authIAM:
		s, err := sigv4auth.New(ctx, a.api)
		if err != nil {
			return nil, err
		}
		cfg.Auth = s
	case authJWT:
		cfg.Auth = apiclient.StaticToken(a.token)
	}
	return apiclient.New(cfg)
}

// eventLine is one line of the event output.
type eventLine struct {
	Offset int64           `json:"offset"`
	Data   json.RawMessage `json:"data"`
}

// printer writes a run's stored events to out as JSON lines, each offset once, in order.
type printer struct {
	mu   sync.Mutex
	out  io.Writer
	last int64 // the highest offset printed (or the --after it started from)
}

func (p *printer) print(events []contract.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range events {
		if e.Offset <= p.last {
			continue
		}
		b, err := json.Marshal(eventLine{Offset: e.Offset, Data: e.Data})
		if err != nil {
			return err
		}
		if _, err := p.out.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("write events: %w", err)
		}
		p.last = e.Offset
	}
	return nil
}

// lastPrinted is the highest offset printed so far.
func (p *printer) lastPrinted() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// printStored prints the events after p.last that are stored now (tail without --follow);
// closed says the log is complete.
func (p *printer) printStored(ctx context.Context, c *apiclient.Client, runID string) (closed bool, err error) {
	for {
		rctx, cancel := context.WithTimeout(ctx, readTimeout)
		page, err := c.ReadEvents(rctx, runID, apiclient.ReadOptions{After: p.lastPrinted(), Limit: wire.MaxReadLimit})
		cancel()
		if err != nil {
			return false, err
		}
		if err := p.print(page.Events); err != nil {
			return false, err
		}
		p.mu.Lock()
		p.last = max(p.last, page.Next)
		p.mu.Unlock()
		if page.Closed || len(page.Events) == 0 {
			return page.Closed, nil
		}
	}
}

// finalStatus maps a terminal run to the exit status of run, attach and tail, and the
// status line to print.
func finalStatus(run contract.RunRecord) (int, string) {
	switch run.Status {
	case contract.StatusCompleted:
		return 0, fmt.Sprintf("run %s completed", run.RunID)
	case contract.StatusAborted:
		return exitAborted, fmt.Sprintf("run %s aborted", run.RunID)
	case contract.StatusFailed:
		code := exitFailure
		msg := ""
		if run.Error != nil {
			msg = ": " + run.Error.Message
			if n, err := strconv.Atoi(strings.TrimPrefix(run.Error.Code, "exit-")); err == nil && strings.HasPrefix(run.Error.Code, "exit-") && n > 0 && n < 256 {
				code = n
			}
		}
		return code, fmt.Sprintf("run %s failed%s", run.RunID, msg)
	}
	return exitFailure, fmt.Sprintf("run %s is %s", run.RunID, run.Status)
}

// runTail prints a run's events (read only: no epoch), following with --follow until the
// log closes; then it exits as run does for the run's final status.
func runTail(ctx context.Context, cfg attachConfig, std streams) error {
	c, err := cfg.api.client(ctx)
	if err != nil {
		return err
	}
	if _, err := c.GetRun(ctx, cfg.runID); err != nil {
		return fmt.Errorf("run %s: %w", cfg.runID, err)
	}
	p := &printer{out: std.out, last: cfg.after}
	var closed bool
	if cfg.follow {
		closed, err = p.followRetrying(ctx, c, cfg.runID, cfg.retryFor, std)
	} else {
		closed, err = p.printStored(ctx, c, cfg.runID)
	}
	if ctx.Err() != nil {
		fmt.Fprintf(std.err, "sandkeep: stopped following run %s after offset %d (sandkeep tail %s --after %d --follow goes on)\n",
			cfg.runID, p.lastPrinted(), cfg.runID, p.lastPrinted())
		return &exitStatus{exitDetached}
	}
	if err != nil {
		return fmt.Errorf("read the events of run %s: %w", cfg.runID, err)
	}
	if !closed {
		return nil
	}
	return endOfRun(ctx, c, cfg.runID, std)
}

// endOfRun reads the finished run, prints its status line and returns its exit status.
func endOfRun(ctx context.Context, c *apiclient.Client, runID string, std streams) error {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), detachTimeout)
	defer cancel()
	run, err := c.GetRun(gctx, runID)
	if err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	code, line := finalStatus(run)
	fmt.Fprintln(std.err, "sandkeep: "+line)
	if code == 0 {
		return nil
	}
	return &exitStatus{code}
}

// runCancel asks a run (or the thread's running run) to stop.
func runCancel(ctx context.Context, cfg cancelConfig, std streams) error {
	c, err := cfg.api.client(ctx)
	if err != nil {
		return err
	}
	var run contract.RunRecord
	if cfg.thread != "" {
		run, err = c.CancelThread(ctx, cfg.thread)
		if errors.Is(err, contract.ErrUnknownRun) {
			return fmt.Errorf("thread %s has no running run: %w", cfg.thread, err)
		}
	} else {
		run, err = c.Cancel(ctx, cfg.runID)
	}
	if err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	fmt.Fprintf(std.err, "sandkeep: cancel requested for run %s (status %s); its driver stops it at its next step\n", run.RunID, run.Status)
	return nil
}

// runGetAPIOutput is what `runs get` prints over the API: the record and its sandbox as
// the instance row tells it now, lifecycle included (what it costs: docs/design.md §5).
type runGetAPIOutput struct {
	Run     contract.RunRecord `json:"run"`
	Sandbox *wire.ViewSandbox  `json:"sandbox,omitempty"`
}

// runRunsGetAPI prints the run's record and its sandbox as JSON, read through the API.
func runRunsGetAPI(ctx context.Context, a apiFlags, runID string, out io.Writer) error {
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	v, err := c.ViewRun(ctx, runID)
	if err != nil {
		return fmt.Errorf("run %s: %w", runID, err)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(runGetAPIOutput{Run: v.RunRecord, Sandbox: v.Sandbox})
}
