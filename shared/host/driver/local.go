package driver

import (
	"context"
	"errors"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// pumpResult is a step's result as a PumpResult.
func pumpResult(r agentrun.StepResult) PumpResult {
	return PumpResult{Appended: r.Appended, LastOffset: r.Cursor.Next - 1, Src: r.Cursor.Src,
		Exited: r.Exited, ExitCode: r.ExitCode, CancelRequested: r.CancelRequested}
}

// LocalConfig is an in-process drive's hold on one run.
type LocalConfig struct {
	RunID string
	// Driver is what Start/Attach returned: epoch and cursor (with the log's highest Src).
	Driver    keeper.Driver
	Executor  contract.Executor // the run's provider
	SandboxID string            // the provider sandbox the journal lives in
	// Log is what the pump step appends through; default the Service's keeper. Tests wrap
	// it to hold or break a pump at the append.
	Log              agentrun.Log
	PollMin, PollMax time.Duration // a waiting pump's pacing (defaults: the Service's)
	BatchEvents      int
	BatchBytes       int
}

// Local is the in-process Transport: the pump step (Step) on the provider's shell and
// the keeper's heartbeat and finish, through the same Service the API's routes use.
type Local struct {
	svc *agentrun.Service
	cfg LocalConfig
	cur contract.Cursor
}

var _ Transport = (*Local)(nil)

// NewLocal returns the in-process transport of cfg's run over s.
func NewLocal(s *agentrun.Service, cfg LocalConfig) (*Local, error) {
	if cfg.Executor == nil || cfg.SandboxID == "" || cfg.RunID == "" {
		return nil, errors.New("driver: Local: RunID, Executor and SandboxID are required")
	}
	if cfg.Log == nil {
		cfg.Log = s.Config().Keeper
	}
	if cfg.PollMin <= 0 {
		cfg.PollMin = s.Config().PollMin
	}
	if cfg.PollMax <= 0 {
		cfg.PollMax = s.Config().PollMax
	}
	cur := cfg.Driver.Cursor
	if cur.Epoch == 0 {
		cur.Epoch = cfg.Driver.Epoch
	}
	cur.Src = max(cur.Src, cfg.Driver.Src)
	return &Local{svc: s, cfg: cfg, cur: cur}, nil
}

// Cursor returns the driver's cursor as it stands.
func (l *Local) Cursor() contract.Cursor { return l.cur }

// Pump runs Step at the cursor and advances it.
func (l *Local) Pump(ctx context.Context, wait time.Duration) (PumpResult, error) {
	res, err := agentrun.Step(ctx, agentrun.StepInput{Log: l.cfg.Log, Executor: l.cfg.Executor, SandboxID: l.cfg.SandboxID,
		Dir: l.svc.Config().Dir, RunID: l.cfg.RunID, At: l.cur, Wait: wait, PollMin: l.cfg.PollMin, PollMax: l.cfg.PollMax,
		BatchEvents: l.cfg.BatchEvents, BatchBytes: l.cfg.BatchBytes})
	l.cur = res.Cursor // what was stored before an error stays stored
	return pumpResult(res), err
}

// Heartbeat extends the lease of the cursor's epoch.
func (l *Local) Heartbeat(ctx context.Context) (keeper.HeartbeatResult, error) {
	return l.svc.Config().Keeper.Heartbeat(ctx, l.cfg.RunID, l.cur.Epoch)
}

// Finish ends the run through Service.Finish, with this drive's sandbox known.
func (l *Local) Finish(ctx context.Context, in keeper.FinishInput) (contract.RunRecord, error) {
	return l.svc.FinishIn(ctx, l.cfg.Executor, l.cfg.SandboxID, l.cfg.RunID, l.cur, in)
}
