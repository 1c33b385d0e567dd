package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/viewer"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// devSweepsKept is how many sweep reports the dev server keeps for GET /v1/reaper/sweeps.
const devSweepsKept = 20

// shutdownGrace bounds a graceful shutdown: waiting long polls are woken at once (they
// answer what they have), other in-flight requests get this long, then are cut — so the
// server is gone within 2 s of the signal.
const shutdownGrace = 1500 * time.Millisecond

// reapFunc runs one reaper sweep; the dev server calls it on every tick.
type reapFunc func(ctx context.Context) error

// devConfig is the configuration of `sandkeep dev`.
type devConfig struct {
	addr        string
	dynamo      dynamoFlags
	provider    providers.Config // hosted providers get the reaper's TTL and period
	reapEvery   time.Duration
	detachedTTL time.Duration
	idleStop    time.Duration // the reaper's idle grace (docs/design.md §5)
	// launchDeadline: a run with no agent this long after its creation is ended failed
	// (agent-not-launched) by whichever of pump, attach or the reaper meets it first.
	launchDeadline time.Duration
	// driverLease is the keeper's driver lease (docs/design.md §4.2): a run whose driver (a
	// host, a shipper) goes silent this long is lapsed by the reaper, and a dead shipper
	// replaced (docs/design.md §8.3).
	driverLease time.Duration
	pushPoll    time.Duration // docs/design.md §8.1: a DynamoDB backend's poll for others' writes
	noPush      bool          // serve no push endpoint (GET /v1/subscribe is 404): watchers long-poll
	reap        reapFunc      // nil: the reaper of docs/design.md §5 over the dev backend (devReaper)
	// allowOrigins are the origins (besides its own) whose pages may call the API.
	allowOrigins []string
	// maxWaiting bounds each tenant's concurrently waiting requests (httpapi.Config).
	maxWaiting int
	// publicURL is the API's address as sandboxes reach it, for their shippers
	// (docs/design.md §6); "" = the listen address.
	publicURL string
	// noShip: launch no shipper, so every run is pumped by its host (the fallback of
	// docs/design.md §6, as when a sandbox cannot reach the API).
	noShip bool
	// cursorKey signs cursors and ship tokens: SANDKEEP_CURSOR_KEY when set, so several dev
	// servers on one table act as one deployment; nil = random per process.
	cursorKey []byte
}

// minDevDriverLease is the shortest --driver-lease: a quiet shipper beats every quarter of
// the lease in whole seconds (at least 1 s, agentrun.ShipBeat), so a shorter lease would
// lapse live shippers.
const minDevDriverLease = 3 * time.Second

// envCursorKey names the dev server's cursor and ship-token key (awsfn's setting of the
// same name).
const envCursorKey = "SANDKEEP_CURSOR_KEY"

// parseDev parses the dev command's flags; getenv supplies the provider's API key.
func parseDev(args []string, getenv func(string) string, w io.Writer) (devConfig, error) {
	cfg := devConfig{}
	var prov providerFlags
	fs := newFlags("sandkeep dev", w)
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "listen address, loopback only (port 0 picks a free port)")
	prov.register(fs)
	fs.DurationVar(&cfg.reapEvery, "reap-every", 30*time.Second, "reaper sweep period")
	fs.DurationVar(&cfg.detachedTTL, "detached-ttl", 15*time.Minute, "how long a detached run may wait for its viewer before the reaper expires it")
	fs.DurationVar(&cfg.idleStop, "idle-stop", keeper.DefaultIdleStop, "stop a sandbox whose thread has no live run this long after its latest run ended (files kept; the next run resumes it)")
	fs.DurationVar(&cfg.launchDeadline, "launch-deadline", keeper.DefaultLaunchDeadline, "how long a run may go without an agent after its creation before it is failed (agent-not-launched)")
	fs.DurationVar(&cfg.driverLease, "driver-lease", contract.DefaultDriverLease*time.Millisecond, "the driver lease: a run whose host or shipper is silent this long is lapsed by the reaper (host drivers heartbeat every third of it, quiet shippers every quarter)")
	fs.DurationVar(&cfg.pushPoll, "push-poll", 2*time.Second, "with --table: how often an idle push subscription reads the log for writes another process made (0: never)")
	fs.BoolVar(&cfg.noPush, "no-push", false, "serve no push endpoint (GET /v1/subscribe answers 404): watchers and the viewer long-poll")
	fs.Func("allow-origin", "also admit browser requests (with CORS) from this origin, e.g. http://localhost:5173; repeatable", func(v string) error {
		o, err := httpapi.ParseOrigin(v)
		if err == nil {
			cfg.allowOrigins = append(cfg.allowOrigins, o)
		}
		return err
	})
	fs.IntVar(&cfg.maxWaiting, "max-waiting", httpapi.DefaultMaxWaiting, "per tenant, how many requests (long polls, waiting pumps) may wait at once; past it 429 too-many-waiting")
	fs.StringVar(&cfg.publicURL, "public-url", "", "the API's base URL as sandboxes reach it, for their shippers (default: the listen address)")
	fs.BoolVar(&cfg.noShip, "no-ship", false, "start no shipper beside agents: every run's output is pumped by its host (sandkeep run drives it)")
	cfg.dynamo.register(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return cfg, err
	}
	switch {
	case len(pos) > 0:
		return cfg, usageErr("unexpected argument %q", pos[0])
	case cfg.reapEvery <= 0:
		return cfg, usageErr("--reap-every must be positive")
	case cfg.detachedTTL <= 0:
		return cfg, usageErr("--detached-ttl must be positive")
	case cfg.idleStop <= 0:
		return cfg, usageErr("--idle-stop must be positive")
	case cfg.launchDeadline <= 0:
		return cfg, usageErr("--launch-deadline must be positive")
	case cfg.driverLease < minDevDriverLease:
		return cfg, usageErr("--driver-lease must be at least %s", minDevDriverLease)
	case cfg.pushPoll < 0:
		return cfg, usageErr("--push-poll must not be negative")
	case cfg.maxWaiting < 1:
		return cfg, usageErr("--max-waiting must be at least 1")
	case cfg.noShip && cfg.publicURL != "":
		return cfg, usageErr("--no-ship and --public-url exclude each other")
	}
	if cfg.publicURL != "" {
		u, err := url.Parse(cfg.publicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return cfg, usageErr("--public-url %q: want an absolute http(s) URL such as http://127.0.0.1:8080", cfg.publicURL)
		}
		cfg.publicURL = strings.TrimRight(cfg.publicURL, "/")
	}
	if k := lookup(getenv, envCursorKey); k != "" {
		if len(k) < httpapi.MinCursorKeyLen {
			return cfg, usageErr("%s is %d bytes; at least %d", envCursorKey, len(k), httpapi.MinCursorKeyLen)
		}
		cfg.cursorKey = []byte(k)
	}
	// Hosted sandboxes are kept alive past the detached TTL plus one sweep period, so the
	// reaper expires a detached run first.
	if cfg.provider, err = prov.config(fs, getenv, cfg.detachedTTL, cfg.reapEvery); err != nil {
		return cfg, err
	}
	if err := cfg.dynamo.check(false); err != nil {
		return cfg, err
	}
	if err := checkLoopback(cfg.addr); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// checkLoopback refuses a listen address off the loopback interface: the dev server trusts
// the tenant header, so it must never be reachable from another machine.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usageErr("--addr %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return usageErr("--addr %q: the dev server trusts the tenant header and listens on loopback only (e.g. 127.0.0.1:8080)", addr)
}

// runDev serves the whole API on cfg.addr until ctx ends, then shuts down gracefully.
func runDev(ctx context.Context, cfg devConfig, out io.Writer, logger *slog.Logger) error {
	backend, describe, err := openBackend(ctx, cfg.dynamo, cfg.driverLease)
	if err != nil {
		return err
	}
	prov, err := providers.New(cfg.provider)
	if err != nil {
		return err
	}
	if cfg.dynamo.table == "" {
		// The runs live in this process's memory: once it exits nothing can reach, finish or
		// take over the agents it launched, so they go with it (after the last request).
		if s, ok := prov.(agentStopper); ok {
			defer stopAgents(s, out, logger)
		}
	}
	k, err := keeper.New(keeper.Config{
		Backend:        backend,
		Providers:      []contract.Provider{prov},
		LaunchDeadline: cfg.launchDeadline,
		DriverLease:    cfg.driverLease,
		IdleStop:       cfg.idleStop,
		Logger:         logger,
	})
	if err != nil {
		return err
	}
	sweeps := reaper.NewHistory(devSweepsKept) // the viewer's reaper page
	// Random per process unless set (docs/design.md §8): cursors of a previous dev server are
	// refused with 409.
	key := cfg.cursorKey
	if key == nil {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
	}

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	publicURL := cfg.publicURL
	if publicURL == "" {
		publicURL = "http://" + ln.Addr().String()
	}
	if cfg.reap == nil {
		// The reaper replaces a dead shipper as the agent route starts one (docs/design.md §8.3).
		ship := &agentrun.ShipConfig{URL: publicURL, Key: key}
		if cfg.reap, err = devReaper(cfg.detachedTTL, cfg.idleStop, k, sweeps, ship); err != nil {
			_ = ln.Close()
			return err
		}
	}
	// Watchers are pushed to (GET /v1/subscribe); every write this process lands wakes
	// them, and memstore wakes on its own, so only a table shared with others polls.
	push := &httpapi.PushConfig{PollEvery: cfg.pushPoll}
	if cfg.noPush {
		push = nil
	}
	shipURL := publicURL
	if cfg.noShip {
		shipURL = ""
	}
	// The viewer's pages are static; every API request behind them is held to the Host rule.
	handler := viewer.Wrap(httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{AllowOrigins: cfg.allowOrigins}, CursorKey: key, Logger: logger,
		MaxWaiting: cfg.maxWaiting,
		PublicURL:  shipURL,
		Sweeps:     &httpapi.Sweeps{Source: sweeps, Every: cfg.reapEvery, DetachedTTL: cfg.detachedTTL},
		AllowHost:  httpapi.LoopbackHost(port),
		Push:       push}))
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      httpapi.MaxWaitMs*time.Millisecond + 30*time.Second, // above the longest long poll
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	// A request net/http cannot parse (a bad %-escape in the path) is answered as
	// problem+json, like every other refusal.
	go func() { served <- srv.Serve(httpapi.ProblemListener(ln, logger)) }()

	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "listening on %s\n", base)
	fmt.Fprintf(out, "run viewer: %s/ (the tenant of the X-Sandkeep-Tenant rule: local, or %s/?tenant=NAME)\n", base, base)
	fmt.Fprintf(out, "backend: %s; provider: %s; reaper every %s (detached TTL %s)\n\n",
		describe, cfg.provider.Where(), cfg.reapEvery, cfg.detachedTTL)
	fmt.Fprint(out, curlExample(base, prov.Name()))

	reapCtx, stopReap := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		reapLoop(reapCtx, cfg.reapEvery, cfg.reap, logger)
	}()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	k.Drain() // every waiting long poll answers now instead of waiting out its waitMs
	stopReap()
	defer wg.Wait()
	if serveErr != nil {
		return fmt.Errorf("serve: %w", serveErr)
	}
	logger.Info("dev: shutting down", slog.String("addr", ln.Addr().String()))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("dev: cutting requests still in flight after the shutdown grace",
			slog.Duration("grace", shutdownGrace), slog.String("error", err.Error()))
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// agentStopper is a provider that can stop every agent it launched (local-process).
type agentStopper interface {
	StopStarted() (agents, shippers int, err error)
}

// stopAgents stops the agents s launched, and their runs' shippers, and says how many of
// each: a shipper is not an agent the user launched.
func stopAgents(s agentStopper, out io.Writer, logger *slog.Logger) {
	n, ships, err := s.StopStarted()
	also := ""
	if ships > 0 {
		also = fmt.Sprintf(" (and %d shipper(s))", ships)
	}
	fmt.Fprintf(out, "stopped %d agent(s) launched by this server%s: their runs were in memory only\n", n, also)
	if err != nil {
		logger.Warn("dev: stopping the agents", slog.String("error", err.Error()))
	}
}

// reapLoop calls reap every period until ctx ends; a failed sweep is logged, never fatal.
func reapLoop(ctx context.Context, every time.Duration, reap reapFunc, logger *slog.Logger) {
	if reap == nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := reap(ctx); err != nil && ctx.Err() == nil {
				logger.Error("reap: sweep failed", slog.String("error", err.Error()))
			}
		}
	}
}

// openBackend returns the in-memory backend, or the DynamoDB one when a table is named
// (creating the table if it is missing), deriving reclaimAt with the keeper's driver lease
// (contract.ReclaimAt: its step), so the reaper meets a lapse as early as that lease allows.
func openBackend(ctx context.Context, d dynamoFlags, driverLease time.Duration) (contract.Backend, string, error) {
	if d.table == "" {
		return memstore.New(memstore.WithDriverLease(driverLease)), "in-memory (lost on exit)", nil
	}
	client, err := d.client(ctx)
	if err != nil {
		return nil, "", err
	}
	created, err := ensureTable(ctx, client, d.table)
	if err != nil {
		return nil, "", err
	}
	b := dynamostore.New(dynamostore.Config{Client: client, Table: d.table, DriverLease: driverLease})
	what := fmt.Sprintf("DynamoDB table %q at %s", d.table, d.endpointOrDefault())
	if created {
		what += " (created)"
	}
	return b, what, nil
}

// curlExample is the copy-paste session printed at start (README.md's Quickstart has the
// whole walk-through).
func curlExample(base, provider string) string {
	return fmt.Sprintf(`try:
  curl -s -X POST %[1]s/v1/runs -H 'Content-Type: application/json' \
    -d '{"runId":"run-1","threadId":"thread-1","sandbox":{"id":"default","provider":"%[2]s"}}'
  curl -s %[1]s/v1/runs/run-1
  curl -s %[1]s/v1/threads/thread-1/active-run
(add -H 'X-Sandkeep-Tenant: NAME' to act as another tenant; the default is "local")
`, base, provider)
}

// lookup is getenv(name), "" without a getenv.
func lookup(getenv func(string) string, name string) string {
	if getenv == nil {
		return ""
	}
	return getenv(name)
}
