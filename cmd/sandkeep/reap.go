package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers"
)

// reapUsage documents the reaper's operator commands.
const reapUsage = `  sandkeep reap --once [--dry-run] --detached-ttl 15m [--idle-stop 10m] [--reap-every 1m] --table NAME [--dynamodb-endpoint URL] [--driver-lease 1m]
               [provider flags]
  sandkeep runs list --stuck --table NAME [--dynamodb-endpoint URL] [--driver-lease 1m] [--limit 100]
  sandkeep runs finish --force RUN_ID --tenant T --table NAME [--dynamodb-endpoint URL] [--driver-lease 1m] [provider flags]
` + providerUsage

// devReaper returns the dev server's sweep through its keeper k (so its backend and
// provider, and its appends wake the server's long polls): a real reaper
// (docs/design.md §5), each report kept in hist (the viewer's reaper page); a sweep that
// finds another in progress is not an error.
func devReaper(ttl, idleStop time.Duration, k *keeper.Keeper, hist *reaper.History, ship *agentrun.ShipConfig) (reapFunc, error) {
	rp, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: ttl, IdleStop: idleStop, Ship: ship})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		start := time.Now()
		rep, err := rp.Sweep(ctx)
		if errors.Is(err, reaper.ErrBusy) {
			return nil
		}
		if hist != nil {
			rec := reaper.SweepRecord{StartedAt: start.UnixMilli(), FinishedAt: time.Now().UnixMilli(), Report: rep}
			if err != nil {
				rec.Error = err.Error()
			}
			hist.Add(rec)
		}
		return err
	}, nil
}

// dispatchReaper runs the reaper's commands; handled=false for any other command.
func dispatchReaper(ctx context.Context, args []string, std streams, logger *slog.Logger) (handled bool, err error) {
	switch {
	case len(args) >= 1 && args[0] == "reap":
		return true, runReap(ctx, args[1:], std, logger)
	case len(args) >= 2 && args[0] == "runs" && args[1] == "list":
		return true, runRunsList(ctx, args[2:], std.out, std.err)
	case len(args) >= 2 && args[0] == "runs" && args[1] == "finish":
		return true, runRunsFinish(ctx, args[2:], std, logger)
	}
	return false, nil
}

func runReap(ctx context.Context, args []string, std streams, logger *slog.Logger) error {
	var (
		d           dynamoFlags
		pf          providerFlags
		once, dry   bool
		ttl, period time.Duration
		idleStop    time.Duration
	)
	fs := newFlags("sandkeep reap", std.err)
	d.register(fs)
	d.registerLease(fs)
	pf.register(fs)
	fs.BoolVar(&once, "once", false, "run one sweep and exit (required)")
	fs.BoolVar(&dry, "dry-run", false, "report what a sweep would do now (runs and their outcomes; pending reclaims, idle rows, stale intents under \"planned\"): no lock, no write, no destroy")
	fs.DurationVar(&ttl, "detached-ttl", 0, "how long a detached run may wait for its viewer (required)")
	fs.DurationVar(&idleStop, "idle-stop", keeper.DefaultIdleStop, "stop a sandbox whose thread has no live run this long after its latest run ended")
	fs.DurationVar(&period, "reap-every", 0, "the deployment's sweep period: hosted sandboxes are kept alive past TTL + period (default: the provider's)")
	if err := fs.Parse(args); err != nil {
		return usageErr("%v", err)
	}
	switch {
	case !once:
		return usageErr("reap needs --once (schedule it, or use the dev server's ticker)")
	case ttl <= 0:
		return usageErr("--detached-ttl is required")
	case period < 0:
		return usageErr("--reap-every must not be negative")
	case idleStop <= 0:
		return usageErr("--idle-stop must be positive")
	}
	pcfg, err := pf.config(fs, std.env, ttl, period)
	if err != nil {
		return err
	}
	k, err := cliKeeper(ctx, d, pcfg, logger)
	if err != nil {
		return err
	}
	// The report goes to stdout below; the reaper need not log it as well.
	rp, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: ttl, IdleStop: idleStop, QuietReport: true})
	if err != nil {
		return err
	}
	sweep := rp.Sweep
	if dry {
		sweep = rp.DryRun
	}
	rep, err := sweep(ctx)
	if e := json.NewEncoder(std.out).Encode(rep); e != nil {
		return e
	}
	return err
}

func runRunsList(ctx context.Context, args []string, out, errw io.Writer) error {
	var (
		d     dynamoFlags
		stuck bool
		limit int
	)
	fs := newFlags("sandkeep runs list", errw)
	d.register(fs)
	d.registerLease(fs)
	fs.BoolVar(&stuck, "stuck", false, "non-terminal runs whose driver lease lapsed, or detached or cancelled (required)")
	fs.IntVar(&limit, "limit", 100, "at most this many runs")
	if err := fs.Parse(args); err != nil {
		return usageErr("%v", err)
	}
	if !stuck || limit <= 0 {
		return usageErr("runs list needs --stuck and a positive --limit")
	}
	b, err := cliBackend(ctx, d)
	if err != nil {
		return err
	}
	runs, err := reaper.Stuck(ctx, b, time.Now().UnixMilli(), d.driverLease.Milliseconds(), limit)
	enc := json.NewEncoder(out)
	for _, r := range runs {
		if e := enc.Encode(r); e != nil {
			return e
		}
	}
	return err
}

func runRunsFinish(ctx context.Context, args []string, std streams, logger *slog.Logger) error {
	var (
		d      dynamoFlags
		pf     providerFlags
		force  bool
		tenant string
	)
	fs := newFlags("sandkeep runs finish", std.err)
	d.register(fs)
	d.registerLease(fs)
	pf.register(fs)
	fs.BoolVar(&force, "force", false, "claim the run, abort it with code forced, close its log and reclaim (required)")
	fs.StringVar(&tenant, "tenant", "", "the run's tenant (required)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	switch {
	case !force:
		return usageErr("runs finish needs --force")
	case len(pos) != 1:
		return usageErr("runs finish takes exactly one RUN_ID")
	case tenant == "":
		return usageErr("--tenant is required")
	}
	// A forced finish ends the run and destroys its sandbox, so the detached TTL hosted
	// sandboxes are kept alive past does not matter; E2B requires one.
	pcfg, err := pf.config(fs, std.env, time.Hour, 0)
	if err != nil {
		return err
	}
	k, err := cliKeeper(ctx, d, pcfg, logger)
	if err != nil {
		return err
	}
	e, err := reaper.ForceFinish(contract.WithTenant(ctx, storeTenant(tenant)), k, "", pos[0])
	if err != nil {
		return fmt.Errorf("force finish: %w", err)
	}
	return json.NewEncoder(std.out).Encode(e)
}

// cliKeeper is the keeper an operator command works through: the table's backend and the
// provider its flags name, built as the deployment builds it (shared/providers).
func cliKeeper(ctx context.Context, d dynamoFlags, pcfg providers.Config, logger *slog.Logger) (*keeper.Keeper, error) {
	b, err := cliBackend(ctx, d)
	if err != nil {
		return nil, err
	}
	prov, err := providers.New(pcfg)
	if err != nil {
		return nil, err
	}
	return keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{prov}, DriverLease: d.driverLease, Logger: logger})
}

// cliBackend opens the DynamoDB table of an operator command, its flags checked first.
func cliBackend(ctx context.Context, d dynamoFlags) (contract.Backend, error) {
	if err := d.check(true); err != nil {
		return nil, err
	}
	client, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	return newDynamoBackend(client, d)
}
