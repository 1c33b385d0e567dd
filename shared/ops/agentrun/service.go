// Package agentrun is the server side of running an agent (docs/design.md §13), where the
// keeper and the providers are: it launches a run's agent in its sandbox, pumps its journal
// into its log (Step), ends the run from the agent's exit (the exit rules), and replaces a
// shipper that died (docs/design.md §8.3). The API's routes and the reaper call it; a host's loop
// (shared/host/driver) reaches it through the API or in process.
package agentrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Service is the side of a drive that runs where the keeper and the providers are: it
// launches a run's agent in its sandbox, pumps its journal into its log (Step) and ends it
// (killing the agent on abort). The API's agent, pump and finish routes call it, and so
// does the in-process transport (driver.Local), so both share one implementation. Safe for
// concurrent use.
type Service struct {
	cfg ServiceConfig
	// sandboxes caches each run's sandbox (its provider and id never change while it runs),
	// so a pump costs no store read to find it.
	mu        sync.Mutex
	sandboxes map[runRef]runBox
}

// ServiceConfig configures a Service.
type ServiceConfig struct {
	Keeper *keeper.Keeper
	Dir    string // journal directory inside sandboxes ("" = the provider's, journal.DirFor)
	// HostProviders names providers whose commands run on this very host (local-process):
	// the agent route refuses them (ErrUnsupported), so a deployed function never runs a
	// caller's command outside a provider sandbox.
	HostProviders    []string
	PollMin, PollMax time.Duration // a waiting pump's pacing (defaults DefaultPumpPollMin/Max)
	Logger           *slog.Logger  // default slog.Default()
	// Ship, when set, has each launched agent's sandbox ship its own journal
	// (docs/design.md §6): nil, every run is pumped by its host.
	Ship *ShipConfig
}

// ShipConfig is how launched agents' shippers reach the API.
type ShipConfig struct {
	// URL is the API's base URL as a sandbox reaches it (the operator's PublicUrl, or the
	// dev server's --public-url); "" = each request's own (WithShipURL).
	URL string
	// Key mints the ship tokens (shiptoken): the cursor key, so every replica that verifies
	// a cursor verifies a token.
	Key []byte
	// Options pace the shipper; a zero Beat is ShipBeat of the driver lease and a zero GiveUp
	// the token's lifetime.
	Options journal.ShipOptions
}

// shipURLKey carries a request's own API address (WithShipURL).
type shipURLKey struct{}

// WithShipURL returns ctx carrying url, the API's base URL as the request that ctx serves
// reached it (the Lambda adapter: the stage's own URL, from API Gateway's request context,
// docs/design.md §9): the shippers a ShipConfig without a URL starts use it.
func WithShipURL(ctx context.Context, url string) context.Context {
	return context.WithValue(ctx, shipURLKey{}, url)
}

// urlFor is the base URL shippers started for ctx's request use: the configured URL (the
// operator's, so it overrides), else the request's own (WithShipURL), else "" (no
// shipper: the host pumps). A nil config ships nothing.
func (c *ShipConfig) urlFor(ctx context.Context) string {
	if c == nil {
		return ""
	}
	if c.URL != "" {
		return c.URL
	}
	u, _ := ctx.Value(shipURLKey{}).(string)
	return u
}

// The agent route's answer on who moves a run's journal into its log.
const (
	ShippingSandbox = "sandbox" // the sandbox's shipper
	ShippingHost    = "host"    // the caller's pumps (driver.Drive)
)

// ShipTokenLeases is a ship token's lifetime in driver leases: the ship route renews it
// with the lease, so it only has to outlast a shipper's retries through an outage.
const ShipTokenLeases = 3

// A shipped run's lease (docs/design.md §8.2): the ship route renews it once half of it
// has passed since the last renewal (ShipRenewAfter), and a quiet shipper beats every
// quarter of it (ShipBeat), so two beats in a row can fail before it ends. Each renewal
// is a run write, and one in two moves the reclaim index: half a lease keeps both few.

// ShipRenewAfter is how long after a lease renewal a ship request renews it again.
func ShipRenewAfter(lease time.Duration) time.Duration { return lease / 2 }

// ShipBeat is a quiet shipper's heartbeat period for lease.
func ShipBeat(lease time.Duration) time.Duration { return lease / 4 }

type runRef struct{ tenant, runID string }

// refOf is runID's cache key in ctx's tenant; a context without one has none (ErrNoTenant).
func refOf(ctx context.Context, runID string) (runRef, error) {
	t, err := contract.Tenant(ctx)
	return runRef{t, runID}, err
}

type runBox struct {
	ex   contract.Executor
	prov string
	psid string
	// beatDue is when a pump of this run next heartbeats for its driver (a third of the
	// lease after the lease was last renewed, as far as this process knows).
	beatDue time.Time
	// launchBy is the run's launch deadline (ms) while no agent is known here; 0: none.
	launchBy int64
}

// maxCachedSandboxes bounds the cache; a full cache is dropped whole (it only saves reads).
const maxCachedSandboxes = 4096

// NewService returns a Service over cfg.Keeper; a missing keeper is an error.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.Keeper == nil {
		return nil, errors.New("driver: NewService: Keeper is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{cfg: cfg, sandboxes: map[runRef]runBox{}}, nil
}

// Config returns s's configuration (the logger defaulted).
func (s *Service) Config() ServiceConfig { return s.cfg }

// LaunchResult is the agent route's answer.
type LaunchResult struct {
	// Launched is false when the run's agent was launched before: nothing more started.
	Launched bool
	// Shipping says who moves the journal into the log: ShippingSandbox or ShippingHost.
	Shipping string
}

// LaunchInput is the agent route's request.
type LaunchInput struct {
	RunID   string
	At      contract.Cursor
	Command string            // shell text, run under the journal wrapper
	Env     map[string]string // for the agent only: never stored or logged
}

// launchConfirmWait bounds the wait for a launched script's pid file (which tells the
// launch that won a race from the one that found the journal made).
const launchConfirmWait = 5 * time.Second

// Launch starts the run's agent (launchAgent) and, with ShipConfig set, its shipper beside
// it: a ship token for (tenant, run, at.Epoch) and the URL go to the shipper's environment
// alone; a sandbox that cannot run it (no EnvStarter, no curl, the URL unreachable) leaves
// the run to its host (Shipping host). A retried launch ships when the run's shipper is
// alive.
func (s *Service) Launch(ctx context.Context, in LaunchInput) (LaunchResult, error) {
	launched, err := s.launchAgent(ctx, in)
	if err != nil {
		return LaunchResult{}, err
	}
	res := LaunchResult{Launched: launched, Shipping: ShippingHost}
	url := s.cfg.Ship.urlFor(ctx)
	if url == "" {
		return res, nil
	}
	box := s.cached(ctx, in.RunID)
	if box == nil {
		return res, nil
	}
	if !launched {
		if alive, err := journal.ShipperAlive(ctx, box.ex, box.psid, s.cfg.Dir, in.RunID); err == nil && alive {
			res.Shipping = ShippingSandbox
		}
		return res, nil
	}
	started, err := s.cfg.Ship.Start(ctx, s.cfg.Keeper, box.ex, box.psid, s.cfg.Dir, in.RunID, in.At)
	switch {
	case err != nil:
		s.cfg.Logger.WarnContext(ctx, "driver: the shipper did not start; the host pumps", "runId", in.RunID, "err", err)
	case started:
		res.Shipping = ShippingSandbox
	default:
		s.cfg.Logger.InfoContext(ctx, "driver: the sandbox cannot reach the API; the host pumps", "runId", in.RunID, "url", url)
	}
	return res, nil
}

// launchAgent starts the run's agent in its sandbox under the journal wrapper (own process group,
// pid file, exit sentinel), fenced by at.Epoch. Idempotent per run: when the run's journal
// exists (a retry, a second call, a racing launch) nothing more runs and launched is false.
// Refusals: ErrSuperseded (a later epoch claimed the run), ErrTerminalRun, ErrUnsupported
// (the provider cannot exec, or runs commands on this host), ErrSandboxGone.
func (s *Service) launchAgent(ctx context.Context, in LaunchInput) (launched bool, err error) {
	if err := contract.CheckEnv(in.Env); err != nil {
		return false, err
	}
	rs, err := s.cfg.Keeper.RunSandbox(ctx, in.RunID)
	if err != nil {
		return false, err
	}
	if err := fenced(rs.State.RunRecord, in.At.Epoch); err != nil {
		return false, err
	}
	if slices.Contains(s.cfg.HostProviders, rs.Sandbox.Provider) {
		return false, fmt.Errorf("driver: provider %q runs commands on this host, not in a sandbox: %w", rs.Sandbox.Provider, keeper.ErrUnsupported)
	}
	ex, ok := rs.Provider.(contract.Executor)
	if !ok {
		return false, fmt.Errorf("driver: provider %q cannot run commands: %w", rs.Sandbox.Provider, keeper.ErrUnsupported)
	}
	psid := rs.Sandbox.ProviderSandboxID
	// Past the launch deadline with no agent, the run has ended: this launch comes too late.
	if _, err := s.checkLaunch(ctx, ex, psid, rs.State, in.At); errors.Is(err, contract.ErrTerminalRun) || errors.Is(err, contract.ErrSuperseded) {
		return false, err
	}
	s.remember(ctx, in.RunID, runBox{ex: ex, prov: rs.Sandbox.Provider, psid: psid,
		beatDue: s.beatDueAfter(rs.State.LeaseUntil)})
	// The directory is named from the provider itself: the env wrapper hides its capabilities.
	pgid, err := journal.Launch(ctx, withEnv(ex, in.Env), psid, journal.DirFor(ex, s.cfg.Dir), in.RunID, in.Command)
	if err == nil || errors.Is(err, journal.ErrJournalExists) {
		if rs.State.LaunchBy != 0 {
			s.clearLaunch(ctx, in.RunID) // the journal exists now: an agent launched
		}
	}
	if errors.Is(err, journal.ErrJournalExists) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("driver: launch %s: %w: %w", in.RunID, keeper.ErrUnavailable, err)
	}
	// Two launches may both pass the early check; the script's atomic create lets one run
	// and only that one writes the pid file: its own process group id.
	deadline := time.Now().Add(launchConfirmWait)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		got, found, err := journal.PID(ctx, ex, psid, s.cfg.Dir, in.RunID)
		if err == nil && found {
			return got == pgid, nil
		}
		if time.Now().After(deadline) {
			// The script started and has not written its pid yet: it is running (or will
			// refuse quietly); either way nothing else will be started for this run.
			s.cfg.Logger.WarnContext(ctx, "driver: launch not confirmed by a pid file", "runId", in.RunID, "err", err)
			return true, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return true, nil
		case <-t.C:
		}
	}
}

// fenced refuses an operation of epoch on a run that moved on.
func fenced(rec contract.RunRecord, epoch int64) error {
	switch {
	case rec.Status.Terminal():
		return fmt.Errorf("driver: run %s is %s: %w", rec.RunID, rec.Status, contract.ErrTerminalRun)
	case rec.Epoch() > epoch:
		return fmt.Errorf("driver: run %s: epoch %d superseded by %d: %w", rec.RunID, epoch, rec.Epoch(), contract.ErrSuperseded)
	}
	return nil
}

// PumpInput is the pump route's request.
type PumpInput struct {
	RunID string
	At    contract.Cursor
	Wait  time.Duration // at most MaxPumpWait
}

// Pump resolves the run's sandbox (cached after the first time) and runs Step there. A
// pump that stored events or waited also counts as its driver's heartbeat (one fenced
// write, at most every third of the lease per process), so a host that only pumps is
// never lapsed while it streams. Refusals as Step's, plus ErrUnsupported (the provider
// cannot exec) and ErrSandboxGone; a run that ended meanwhile (the reaper expired it, its
// sandbox reclaimed) is ErrTerminalRun naming how it ended (contract.Ended).
func (s *Service) Pump(ctx context.Context, in PumpInput) (StepResult, error) {
	box, err := s.box(ctx, in.RunID)
	if err != nil {
		return StepResult{}, s.endedOr(ctx, in.RunID, err)
	}
	if box.launchBy != 0 && !s.cfg.Keeper.Config().Now().Before(time.UnixMilli(box.launchBy)) {
		// Past the launch deadline with no agent known here: the run says whether one came.
		if err := s.pumpLaunchCheck(ctx, in, box); err != nil {
			return StepResult{}, s.endedOr(ctx, in.RunID, err)
		}
	}
	res, err := Step(ctx, StepInput{Log: s.cfg.Keeper, Executor: box.ex, SandboxID: box.psid, Dir: s.cfg.Dir,
		RunID: in.RunID, At: in.At, Wait: in.Wait, PollMin: s.cfg.PollMin, PollMax: s.cfg.PollMax})
	if err == nil && res.Appended > 0 && box.launchBy != 0 && s.clearLaunch(ctx, in.RunID) {
		s.noteLaunched(ctx, in.RunID) // its journal has lines: an agent launched
	}
	if err == nil && !res.Exited && (res.Appended > 0 || in.Wait > 0) {
		err = s.beat(ctx, in.RunID, &res)
	}
	if errors.Is(err, contract.ErrSuperseded) || errors.Is(err, contract.ErrTerminalRun) || errors.Is(err, contract.ErrSandboxGone) {
		s.forget(ctx, in.RunID) // a gone sandbox is resolved again (and refused by the keeper) next time
	}
	return res, s.endedOr(ctx, in.RunID, err)
}

// pumpLaunchCheck is the launch rule at a pump past the run's launch deadline: the run is
// read once; a missed launch ends it (contract.Ended), anything else lets the pump go on.
func (s *Service) pumpLaunchCheck(ctx context.Context, in PumpInput, box runBox) error {
	st, err := s.cfg.Keeper.State(ctx, in.RunID)
	if err != nil {
		return err
	}
	if err := fenced(st.RunRecord, in.At.Epoch); err != nil {
		return err
	}
	cleared, err := s.checkLaunch(ctx, box.ex, box.psid, st, in.At)
	if err != nil {
		return err
	}
	if cleared {
		s.noteLaunched(ctx, in.RunID)
	}
	return nil
}

// noteLaunched forgets the run's launch deadline in this process's cache.
func (s *Service) noteLaunched(ctx context.Context, runID string) {
	if b := s.cached(ctx, runID); b != nil && b.launchBy != 0 {
		b.launchBy = 0
		s.remember(ctx, runID, *b)
	}
}

// beatDueAfter is when a pump next heartbeats for a driver whose lease ends at leaseUntil
// (ms; 0: at once): once a third of the lease has passed, as a driver's own heartbeats.
func (s *Service) beatDueAfter(leaseUntil int64) time.Time {
	lease := s.cfg.Keeper.DriverLease()
	return time.UnixMilli(leaseUntil).Add(-lease + lease/3)
}

// beat heartbeats for the pump's driver when due. A refusal (superseded, terminal) is the
// pump's answer; any other failure is logged and left to the next pump or the driver's
// own heartbeat (the lease has slack for two misses).
func (s *Service) beat(ctx context.Context, runID string, res *StepResult) error {
	b := s.cached(ctx, runID)
	if b == nil || s.cfg.Keeper.Config().Now().Before(b.beatDue) { // the keeper's clock: the lease's
		return nil
	}
	hb, err := s.cfg.Keeper.Heartbeat(ctx, runID, res.Cursor.Epoch)
	switch {
	case errors.Is(err, contract.ErrSuperseded) || errors.Is(err, contract.ErrTerminalRun) || errors.Is(err, contract.ErrUnknownRun):
		return err
	case err != nil:
		s.cfg.Logger.WarnContext(ctx, "driver: a pump's heartbeat failed", "runId", runID, "err", err)
		return nil
	}
	res.CancelRequested = res.CancelRequested || hb.CancelRequested
	b.beatDue = s.beatDueAfter(hb.LeaseUntil)
	s.remember(ctx, runID, *b)
	return nil
}

// endedOr answers err, unless it says the run moved on (terminal, log closed, sandbox
// gone, superseded: the reaper claimed it to end it, its sandbox kept for the thread) and
// the run is indeed terminal: then contract.Ended, naming how it ended.
func (s *Service) endedOr(ctx context.Context, runID string, err error) error {
	if !errors.Is(err, contract.ErrTerminalRun) && !errors.Is(err, contract.ErrLogClosed) && !errors.Is(err, contract.ErrSandboxGone) &&
		!errors.Is(err, contract.ErrSuperseded) {
		return err
	}
	rec, gerr := s.cfg.Keeper.Get(ctx, runID)
	if gerr != nil || !rec.Status.Terminal() {
		return err
	}
	return fmt.Errorf("driver: run %s: %w", runID, contract.Ended(rec))
}

// box returns the run's executor and sandbox, from the cache or one resolution.
func (s *Service) box(ctx context.Context, runID string) (runBox, error) {
	ref, err := refOf(ctx, runID)
	if err != nil {
		return runBox{}, fmt.Errorf("driver: run %s: %w", runID, err)
	}
	s.mu.Lock()
	b, ok := s.sandboxes[ref]
	s.mu.Unlock()
	if ok {
		return b, nil
	}
	rs, err := s.cfg.Keeper.RunSandbox(ctx, runID)
	if err != nil {
		return runBox{}, err
	}
	if rs.State.Status.Terminal() {
		return runBox{}, fmt.Errorf("driver: run %s is %s: %w", runID, rs.State.Status, contract.ErrTerminalRun)
	}
	ex, ok := rs.Provider.(contract.Executor)
	if !ok {
		return runBox{}, fmt.Errorf("driver: provider %q cannot run commands: %w", rs.Sandbox.Provider, keeper.ErrUnsupported)
	}
	b = runBox{ex: ex, prov: rs.Sandbox.Provider, psid: rs.Sandbox.ProviderSandboxID, beatDue: s.beatDueAfter(rs.State.LeaseUntil),
		launchBy: rs.State.LaunchBy}
	s.remember(ctx, runID, b)
	return b, nil
}

// cached returns the run's sandbox when this process knows it, without a read.
func (s *Service) cached(ctx context.Context, runID string) *runBox {
	ref, err := refOf(ctx, runID)
	if err != nil {
		return nil // the keeper's call refuses it
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.sandboxes[ref]; ok {
		return &b
	}
	return nil
}

func (s *Service) remember(ctx context.Context, runID string, b runBox) {
	ref, err := refOf(ctx, runID)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sandboxes) >= maxCachedSandboxes {
		clear(s.sandboxes)
	}
	s.sandboxes[ref] = b
}

func (s *Service) forget(ctx context.Context, runID string) {
	ref, err := refOf(ctx, runID)
	if err != nil {
		return
	}
	s.mu.Lock()
	delete(s.sandboxes, ref)
	s.mu.Unlock()
}

// exitCodeRE matches the error code a drive ends a failed agent with ("exit-<code>").
var exitCodeRE = regexp.MustCompile(`^exit-(-?[0-9]{1,10})$`)

// endTimeout bounds the sandbox work after (or before) a terminal write: the stderr tail,
// the kill and the journal's removal.
const endTimeout = 20 * time.Second

// Finish ends the run fenced by at.Epoch (keeper.Finish: terminal write, then the log's
// close). A failed run whose error code is "exit-<n>" (a drive's, from the exit sentinel)
// gets the agent's stderr tail in its message. Once an aborted or failed run's terminal
// write landed, the agent's process group is killed (aborted) and the journal removed. A
// completed run costs no read to find its sandbox: its journal is removed when this
// process already knows the sandbox (it pumped or launched the run), else it is left to
// the reaper's journal sweep and reclaim (the agent has exited; nothing reads it again).
// FinishIn is Finish for a caller that knows the run's sandbox (an in-process drive): its
// journal is removed after a completed run too.
func (s *Service) FinishIn(ctx context.Context, ex contract.Executor, psid, runID string, at contract.Cursor, in keeper.FinishInput) (contract.RunRecord, error) {
	s.remember(ctx, runID, runBox{ex: ex, psid: psid})
	return s.Finish(ctx, runID, at, in)
}

func (s *Service) Finish(ctx context.Context, runID string, at contract.Cursor, in keeper.FinishInput) (contract.RunRecord, error) {
	var box *runBox
	// A terminal run is resolved too: a retried abort whose first attempt wrote the status
	// but never got to the kill must still kill.
	resolve := func() *runBox {
		if b := s.cached(ctx, runID); b != nil {
			return b
		}
		rs, err := s.cfg.Keeper.RunSandbox(ctx, runID)
		if err != nil {
			s.cfg.Logger.WarnContext(ctx, "driver: finish: the run's sandbox is unknown", "runId", runID, "err", err)
			return nil
		}
		ex, ok := rs.Provider.(contract.Executor)
		if !ok {
			return nil
		}
		return &runBox{ex: ex, prov: rs.Sandbox.Provider, psid: rs.Sandbox.ProviderSandboxID}
	}
	if m := exitCodeRE.FindStringSubmatch(errCode(in.Error)); in.Status == contract.StatusFailed && m != nil {
		if box = resolve(); box != nil {
			code, _ := strconv.Atoi(m[1])
			xctx, cancel := context.WithTimeout(ctx, endTimeout)
			msg := ExitError(xctx, box.ex, box.psid, s.cfg.Dir, runID, code).Message
			cancel()
			in.Error = &contract.RunError{Message: msg, Code: in.Error.Code}
		}
	}
	if in.Status == contract.StatusAborted {
		box = resolve()
	}
	rec, err := s.cfg.Keeper.Finish(ctx, runID, at, in)
	if err != nil || !rec.Status.Terminal() {
		return rec, err
	}
	if box == nil {
		box = s.cached(ctx, runID)
	}
	if box != nil {
		s.end(ctx, *box, runID, rec.Status == contract.StatusAborted)
	}
	s.forget(ctx, runID)
	s.Settle(ctx, rec)
	return rec, nil
}

// Settle hands an ended run's sandbox to keeper.SettleEnded (a one-run sandbox, or a
// cancelled one whose setup asks for it, is destroyed now): detached from the caller,
// bounded, logged on failure (the reaper's sweeps finish it).
func (s *Service) Settle(ctx context.Context, rec contract.RunRecord) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if _, err := s.cfg.Keeper.SettleEnded(tctx, rec); err != nil {
		s.cfg.Logger.WarnContext(ctx, "driver: settling an ended run's sandbox failed", "runId", rec.RunID, "err", err)
	}
}

// end kills the agent (kill) and removes the journal of a run whose terminal write landed:
// detached from the caller, bounded, logged on failure (the reaper's sweep retries).
func (s *Service) end(ctx context.Context, b runBox, runID string, kill bool) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	if kill {
		if err := journal.KillAgent(tctx, b.ex, b.psid, s.cfg.Dir, runID); err != nil {
			s.cfg.Logger.WarnContext(ctx, "driver: killing the agent failed", "runId", runID, "err", err)
		}
	}
	if err := journal.Delete(tctx, b.ex, b.psid, s.cfg.Dir, runID); err != nil {
		s.cfg.Logger.WarnContext(ctx, "driver: deleting the journal failed", "runId", runID, "err", err)
	}
}

func errCode(e *contract.RunError) string {
	if e == nil {
		return ""
	}
	return e.Code
}

// envExecutor starts commands with extra environment variables: through the provider's
// contract.EnvStarter when it has one (the values never enter the command text), else as
// exports at the head of the script (single-quoted: never expanded, never logged by
// sandkeep; the provider sees them in the command it is sent, as it sees the workspace's
// secrets).
type envExecutor struct {
	contract.Executor
	env map[string]string
}

func withEnv(ex contract.Executor, env map[string]string) contract.Executor {
	if len(env) == 0 {
		return ex
	}
	return envExecutor{Executor: ex, env: env}
}

func (e envExecutor) Start(ctx context.Context, psid, command string) (int, error) {
	if es, ok := e.Executor.(contract.EnvStarter); ok {
		return es.StartEnv(ctx, psid, command, e.env)
	}
	names := make([]string, 0, len(e.env))
	for k := range e.env {
		names = append(names, k)
	}
	slices.Sort(names)
	script := ""
	for _, k := range names {
		script += "export " + k + "=" + journal.Quote(e.env[k]) + "\n"
	}
	return e.Executor.Start(ctx, psid, script+command)
}

// CancelShipped kills the agent's process group of a run whose agent is shipped, in one
// provider call (journal.KillShipped): its shipper then seals and ships the journal and
// ends the run aborted, with no host and no polling (docs/design.md §13). A run with no
// live shipper is left to its host (nil); so is a run whose sandbox cannot be resolved.
func (s *Service) CancelShipped(ctx context.Context, runID string) error {
	b := s.cached(ctx, runID)
	if b == nil {
		rs, err := s.cfg.Keeper.RunSandbox(ctx, runID)
		if err != nil {
			return err
		}
		ex, ok := rs.Provider.(contract.Executor)
		if !ok {
			return nil
		}
		b = &runBox{ex: ex, psid: rs.Sandbox.ProviderSandboxID}
	}
	if err := journal.KillShipped(ctx, b.ex, b.psid, s.cfg.Dir, runID); err != nil && !errors.Is(err, journal.ErrNotShipped) {
		return err
	}
	return nil
}
