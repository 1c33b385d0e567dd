package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/bench"
)

// runBench is `sandkeep bench`: the docs/design.md §11 benchmark against a running DynamoDB endpoint
// (dynalite: `make bench` starts one). It starts nothing itself, creates and deletes its
// own tables, prints the Markdown report on out and progress lines on progress. Timing never
// makes it fail; only failing operations do.
func runBench(ctx context.Context, args []string, out, progress io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(progress)
	var cfg bench.Config
	fs.StringVar(&cfg.Endpoint, "dynamodb-endpoint", "", "DynamoDB endpoint URL (required), e.g. http://127.0.0.1:8000")
	fs.IntVar(&cfg.Ops, "ops", bench.DefaultOps, "measured iterations per operation")
	fs.IntVar(&cfg.Warmup, "warmup", bench.DefaultWarmup, "unmeasured iterations first")
	fs.IntVar(&cfg.Contention, "contention", bench.DefaultContention, "concurrent starts on one new thread (0 skips)")
	fs.IntVar(&cfg.Reap, "reap", bench.DefaultReap, "detached runs the reaper drains (0 skips)")
	fs.IntVar(&cfg.ReapBatch, "reap-batch", bench.DefaultReapBatch, "the reaper's maxRuns per sweep")
	fs.IntVar(&cfg.Deliveries, "deliveries", bench.DefaultDeliveries, "long-poll deliveries measured per backend (0 skips)")
	fs.IntVar(&cfg.AppendBytes, "append-bytes", bench.DefaultAppendBytes, "bytes of the one event of each append (≤ 256 KiB)")
	fs.IntVar(&cfg.AgentLines, "agent-lines", bench.DefaultAgentLines, "lines of the agent delivery section's agent, per backend (0 skips)")
	fs.DurationVar(&cfg.AgentSilent, "agent-silent", bench.DefaultAgentSilent, "window of the agent delivery section's silent drive")
	fs.IntVar(&cfg.PushLines, "push-lines", bench.DefaultPushLines, "lines of the push section's agent to a subscribed watcher, per backend (0 skips the push section)")
	fs.IntVar(&cfg.PushWatchers, "push-watchers", bench.DefaultPushWatchers, "idle watchers the push section holds on one server (0 skips them)")
	fs.DurationVar(&cfg.PushIdle, "push-idle", bench.DefaultPushIdle, "window over which the push section counts an idle watcher's cost")
	fs.IntVar(&cfg.ShipLines, "ship-lines", bench.DefaultShipLines, "lines of the shipper section's agent, shipped through one server and read on another, and through the deployed push path (0 skips both)")
	fs.IntVar(&cfg.ShipChatty, "ship-chatty", bench.DefaultShipChatty, "lines of the shipper section's chatty agent (one every 10 ms)")
	fs.DurationVar(&cfg.ShipSilent, "ship-silent", bench.DefaultShipSilent, "how long the shipper section's silent agent runs")
	fs.IntVar(&cfg.ShipLaunches, "ship-launches", bench.DefaultShipLaunches, "launches the shipper section times with a shipper and without")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("bench: unexpected argument %q", fs.Arg(0))
	case cfg.Endpoint == "":
		return errors.New("bench: --dynamodb-endpoint is required (run `make bench` to start dynalite)")
	case cfg.Ops < 1:
		return errors.New("bench: --ops must be at least 1")
	}
	// In Config zero means "default"; on the command line 0 means "skip the section".
	if cfg.Contention == 0 {
		cfg.Contention = -1
	}
	if cfg.Reap == 0 {
		cfg.Reap = -1
	}
	if cfg.Deliveries == 0 {
		cfg.Deliveries = -1
	}
	if cfg.AgentLines == 0 {
		cfg.AgentLines = -1
	}
	if cfg.PushLines == 0 {
		cfg.PushLines = -1
	}
	if cfg.PushWatchers == 0 {
		cfg.PushWatchers = -1
	}
	if cfg.ShipLines == 0 {
		cfg.ShipLines = -1
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = -1
	}
	cfg.Progress = progress
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	return rep.Markdown(out)
}
