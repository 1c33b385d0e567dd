package agentrun

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// LaunchState is what CheckLaunch found about a run's agent.
type LaunchState int

// Launch states.
const (
	LaunchNotDue LaunchState = iota // no deadline pending, or it has not passed
	LaunchSeen                      // overdue by its marker, but an agent is there: clear the marker
	LaunchMissed                    // no agent by the deadline: end the run (keeper.NotLaunchedInput)
)

// CheckLaunch is the one rule the pump, attach and agent routes and the reaper share
// (docs/design.md §4.2): st's run missed its launch deadline when the deadline passed
// (keeper.LaunchOverdue) and no agent shows — no journal in its sandbox (ex nil or a gone
// sandbox: nothing could run there) and no event in its log (a host that appends its own
// events is its own agent). It only reads; LaunchSeen tells the caller to clear the
// marker (keeper.ClearLaunch).
func CheckLaunch(ctx context.Context, k *keeper.Keeper, ex contract.Executor, psid, dir string, st contract.RunState) (LaunchState, error) {
	if !k.LaunchOverdue(st) {
		return LaunchNotDue, nil
	}
	if ex != nil && psid != "" {
		found, err := journal.Exists(ctx, ex, psid, dir, st.RunID)
		switch {
		case errors.Is(err, contract.ErrSandboxGone):
		case err != nil:
			return LaunchNotDue, err
		case found:
			return LaunchSeen, nil
		}
	}
	has, err := k.HasEvents(ctx, st.RunID)
	switch {
	case err != nil:
		return LaunchNotDue, err
	case has:
		return LaunchSeen, nil
	}
	return LaunchMissed, nil
}

// checkLaunch applies CheckLaunch for a driver at at: a missed launch ends the run
// (failed, agent-not-launched) and is answered as contract.Ended; a seen one clears the
// marker. It reports whether the marker is gone (nothing more to check in this process).
func (s *Service) checkLaunch(ctx context.Context, ex contract.Executor, psid string, st contract.RunState, at contract.Cursor) (cleared bool, err error) {
	if st.LaunchBy == 0 {
		return true, nil
	}
	ls, err := CheckLaunch(ctx, s.cfg.Keeper, ex, psid, s.cfg.Dir, st)
	switch {
	case err != nil:
		return false, err
	case ls == LaunchSeen:
		return s.clearLaunch(ctx, st.RunID), nil
	case ls == LaunchNotDue:
		return false, nil
	}
	rec, err := s.cfg.Keeper.Finish(ctx, st.RunID, at, keeper.NotLaunchedInput(st.LaunchBy))
	if err != nil {
		return false, err
	}
	s.forget(ctx, st.RunID)
	s.Settle(ctx, rec)
	s.cfg.Logger.InfoContext(ctx, "driver: no agent launched by the deadline; run failed", "runId", st.RunID)
	return true, fmt.Errorf("driver: run %s: %w", st.RunID, contract.Ended(rec))
}

// clearLaunch removes the run's launch marker, logging a failure (the next check clears it).
func (s *Service) clearLaunch(ctx context.Context, runID string) bool {
	if err := s.cfg.Keeper.ClearLaunch(ctx, runID); err != nil {
		s.cfg.Logger.WarnContext(ctx, "driver: clearing the launch deadline failed", "runId", runID, "err", err)
		return false
	}
	return true
}

// Attach is keeper.Attach for the attach route, with the launch rule: a run that missed
// its launch deadline is ended at the new epoch (failed, agent-not-launched) and answered
// as contract.Ended. A check that cannot complete answers the attach as it is (the
// driver's pumps check again).
func (s *Service) Attach(ctx context.Context, runID string) (keeper.AttachResult, error) {
	return s.attachIf(ctx, runID, contract.ClaimCond{})
}

// attachIf is Attach whose claim also requires cond (keeper.AttachIf).
func (s *Service) attachIf(ctx context.Context, runID string, cond contract.ClaimCond) (keeper.AttachResult, error) {
	res, err := s.cfg.Keeper.AttachIf(ctx, runID, cond)
	if err != nil || res.LaunchBy == 0 {
		return res, err
	}
	st := contract.RunState{RunRecord: res.Run, LaunchBy: res.LaunchBy}
	if !s.cfg.Keeper.LaunchOverdue(st) {
		return res, nil
	}
	var (
		ex   contract.Executor
		psid string
	)
	rs, rerr := s.cfg.Keeper.RunSandbox(ctx, runID)
	switch {
	case rerr == nil:
		ex, _ = rs.Provider.(contract.Executor)
		psid = rs.Sandbox.ProviderSandboxID
	case !errors.Is(rerr, contract.ErrSandboxGone):
		s.cfg.Logger.WarnContext(ctx, "driver: attach: the launch check could not read the sandbox", "runId", runID, "err", rerr)
		return res, nil
	}
	at := res.Driver.Cursor
	at.Epoch = res.Driver.Epoch
	if _, err := s.checkLaunch(ctx, ex, psid, st, at); err != nil {
		if errors.Is(err, contract.ErrTerminalRun) {
			return keeper.AttachResult{}, err
		}
		s.cfg.Logger.WarnContext(ctx, "driver: attach: the launch check failed", "runId", runID, "err", err)
	}
	return res, nil
}
