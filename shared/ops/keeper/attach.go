package keeper

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Attach claims the run for a returning viewer: a new epoch, detachedSince cleared, the
// log fenced (docs/design.md §4.2). Refusals: ErrUnknownRun, ErrTerminalRun, ErrSandboxGone.
func (k *Keeper) Attach(ctx context.Context, runID string) (AttachResult, error) {
	return k.AttachIf(ctx, runID, contract.ClaimCond{})
}

// AttachIf is Attach whose claim also requires cond; a failed cond is ErrConflict
// (contract.ClaimRefused, with the run as the claim read it).
func (k *Keeper) AttachIf(ctx context.Context, runID string, cond contract.ClaimCond) (AttachResult, error) {
	st, err := k.claimIf(ctx, runID, true, cond)
	if err != nil {
		return AttachResult{}, err
	}
	return k.takeOver(ctx, st)
}

// claim bumps the run's epoch with detachedSince cleared and a fresh driver lease.
func (k *Keeper) claim(ctx context.Context, runID string) (contract.RunState, error) {
	return k.claimIf(ctx, runID, true, contract.ClaimCond{})
}

// claimIf bumps the run's epoch under cond (clearDetached also removes detachedSince and
// lapsed) with a fresh driver lease; one token for every retry, so a claim whose response
// was lost is not mistaken for a refusal.
func (k *Keeper) claimIf(ctx context.Context, runID string, clearDetached bool, cond contract.ClaimCond) (contract.RunState, error) {
	c := contract.Claim{Token: newToken(), LeaseUntil: k.nowMs() + k.leaseMs(), ClearDetached: clearDetached, If: cond}
	st, err := k.st.Runs().Claim(ctx, runID, c)
	if err != nil {
		return contract.RunState{}, fmt.Errorf("keeper: claim run %q: %w", runID, err)
	}
	return st, nil
}

// ClaimFenced is the claim sequence attach, a retried start and the reaper share: one
// compare-and-set bumping the epoch under cond (clearDetached also removes detachedSince
// and lapsed) with a fresh driver lease, then the log fenced at the new epoch. Refusals:
// ErrUnknownRun, ErrTerminalRun (also for a closed log, repaired first), ErrConflict (cond
// failed), ErrSuperseded (a later epoch fenced first).
func (k *Keeper) ClaimFenced(ctx context.Context, runID string, clearDetached bool, cond contract.ClaimCond) (contract.RunState, contract.AppendResult, error) {
	st, err := k.claimIf(ctx, runID, clearDetached, cond)
	if err != nil {
		return contract.RunState{}, contract.AppendResult{}, err
	}
	fence, err := k.fence(ctx, st)
	return st, fence, err
}

// fence fences the log at the epoch a claim produced (st). A closed log on a run the claim
// found non-terminal means a terminal write was lost: the status is repaired so later
// claims are refused too (docs/design.md §3.1 rule 3), and the answer is ErrTerminalRun.
func (k *Keeper) fence(ctx context.Context, st contract.RunState) (contract.AppendResult, error) {
	runID, epoch := st.RunID, st.Epoch()
	fence, err := k.st.Log().Fence(ctx, runID, epoch)
	if errors.Is(err, contract.ErrLogClosed) {
		return contract.AppendResult{}, k.repairClosed(ctx, runID, epoch)
	}
	if err != nil {
		return contract.AppendResult{}, fmt.Errorf("keeper: fence log of %q at epoch %d: %w", runID, epoch, err)
	}
	return fence, nil
}

// takeOver completes a claim that produced st: it fences the log at st's epoch, then reads
// the run and its instance row (in parallel; one BatchGetItem on DynamoDB), and answers
// with the new driver's cursor. A run whose sandbox no longer exists is ErrSandboxGone.
func (k *Keeper) takeOver(ctx context.Context, st contract.RunState) (AttachResult, error) {
	runID, epoch := st.RunID, st.Epoch()
	fence, err := k.fence(ctx, st)
	if err != nil {
		return AttachResult{}, err
	}
	key := ""
	if st.SandboxKey != nil {
		key = *st.SandboxKey
	}
	cur, row, err := k.stateAndRow(ctx, runID, key)
	if err != nil {
		return AttachResult{}, fmt.Errorf("keeper: read run %q after fence: %w", runID, err)
	}
	switch {
	case cur == nil:
		return AttachResult{}, fmt.Errorf("keeper: run %q vanished: %w", runID, contract.ErrUnknownRun)
	case cur.Epoch() != epoch:
		return AttachResult{}, fmt.Errorf("keeper: run %q claimed again (epoch %d > %d): %w",
			runID, cur.Epoch(), epoch, contract.ErrSuperseded)
	}
	if reason := sandboxGone(*cur, row); reason != "" {
		return AttachResult{}, fmt.Errorf("keeper: run %q: %s: %w", runID, reason, contract.ErrSandboxGone)
	}
	return AttachResult{
		Run:      cur.RunRecord,
		LaunchBy: cur.LaunchBy,
		Sandbox: Sandbox{
			Key:               key,
			Provider:          row.Provider,
			ProviderSandboxID: row.ProviderSandboxID,
			LatestSnapshotID:  row.LatestSnapshotID,
		},
		Driver: Driver{
			Epoch:           epoch,
			Cursor:          fence.Cursor,
			LeaseMs:         k.leaseMs(),
			LeaseUntil:      cur.LeaseUntil,
			LastOffset:      fence.Last,
			Src:             fence.Src,
			CancelRequested: fence.CancelRequested || cur.Cancelled(),
		},
	}, nil
}

// stateAndRow reads the run's state and the row of key ("" = no row): one batch read when
// the backend offers contract.StateRowReader, else two reads in parallel.
func (k *Keeper) stateAndRow(ctx context.Context, runID, key string) (*contract.RunState, *contract.InstanceRow, error) {
	if rd, ok := k.st.StateRowReader(); ok && key != "" {
		return rd.GetStateAndRow(ctx, runID, key)
	}
	var (
		g   errgroup.Group
		cur *contract.RunState
		row *contract.InstanceRow
	)
	g.Go(func() (err error) {
		cur, err = k.st.Runs().State(ctx, runID)
		return err
	})
	if key != "" {
		g.Go(func() (err error) {
			row, err = k.st.Instances().GetRow(ctx, key)
			return err
		})
	}
	err := g.Wait()
	return cur, row, err
}

// sandboxGone says why run's sandbox no longer exists ("" when it does): the row is
// missing or tombstoned, or names another sandbox than the one the run recorded.
func sandboxGone(run contract.RunState, row *contract.InstanceRow) string {
	switch {
	case row == nil:
		return "no instance row"
	case row.Reclaiming != "":
		return "instance row is being reclaimed"
	case run.ProviderSandboxID != "" && row.ProviderSandboxID != run.ProviderSandboxID:
		return "instance row names another sandbox"
	}
	return ""
}

// repairClosed ends a non-terminal run whose log is already closed, then reports it as
// terminal (the state every later claim will find).
func (k *Keeper) repairClosed(ctx context.Context, runID string, epoch int64) error {
	p := contract.RunPatch{
		Status:     contract.Set(contract.StatusFailed),
		FinishedAt: contract.Set(k.nowMs()),
		Error:      contract.Set(contract.RunError{Message: "event log was closed before the run ended", Code: "log-closed"}),
	}
	_, err := k.st.Runs().UpdateFenced(ctx, runID, epoch, p)
	k.landed(ctx, runID, Landing{}) // a terminal write
	if err != nil && !errors.Is(err, contract.ErrTerminalRun) {
		return fmt.Errorf("keeper: repair run %q with a closed log: %w", runID, err)
	}
	k.cfg.Logger.WarnContext(ctx, "keeper: run had a closed log; marked failed", "runId", runID, "epoch", epoch)
	return fmt.Errorf("keeper: run %q: log closed: %w", runID, contract.ErrTerminalRun)
}

// Heartbeat extends the driver lease of epoch; refused: ErrSuperseded/ErrTerminalRun
// (contract.Ended: naming how the run ended, e.g. the reaper's "expired").
func (k *Keeper) Heartbeat(ctx context.Context, runID string, epoch int64) (HeartbeatResult, error) {
	until := k.nowMs() + k.leaseMs()
	st, err := k.st.Runs().Heartbeat(ctx, runID, epoch, until)
	if errors.Is(err, contract.ErrTerminalRun) {
		if rec, gerr := k.Get(ctx, runID); gerr == nil && rec.Status.Terminal() {
			err = contract.Ended(rec)
		}
	}
	if err != nil {
		return HeartbeatResult{}, fmt.Errorf("keeper: heartbeat %q at epoch %d: %w", runID, epoch, err)
	}
	k.extendLife(ctx, st)
	return HeartbeatResult{CancelRequested: st.Cancelled(), LeaseUntil: st.LeaseUntil}, nil
}

// Detach records that the viewer left while the agent continues: one fenced write that
// keeps the sandbox key stamped at start; first detach wins.
func (k *Keeper) Detach(ctx context.Context, runID string, epoch int64) (contract.RunRecord, error) {
	return k.DetachWithKey(ctx, runID, epoch, "")
}

// DetachWithKey is Detach that also (re)stamps the run's sandbox key ("" keeps it): one
// fenced write; first detach wins.
func (k *Keeper) DetachWithKey(ctx context.Context, runID string, epoch int64, sandboxKey string) (contract.RunRecord, error) {
	now := k.nowMs()
	st, err := k.st.Runs().Detach(ctx, runID, epoch, sandboxKey, now)
	if err != nil {
		return contract.RunRecord{}, fmt.Errorf("keeper: detach %q at epoch %d: %w", runID, epoch, err)
	}
	return st.RunRecord, nil
}

// Cancel sets cancelRequested then puts the in-band marker; terminal is a no-op.
func (k *Keeper) Cancel(ctx context.Context, runID string) (contract.RunRecord, error) {
	st, err := k.st.Runs().RequestCancel(ctx, runID)
	if err != nil {
		return contract.RunRecord{}, fmt.Errorf("keeper: cancel %q: %w", runID, err)
	}
	if st.Status.Terminal() {
		return st.RunRecord, nil
	}
	// The flag is durable first; the marker only makes the driver see it in-band. A closed
	// log means the run is ending anyway.
	err = k.st.Log().MarkCancel(ctx, runID)
	k.woke(ctx, runID) // a marker stores no event: nothing to push
	if err != nil && !errors.Is(err, contract.ErrLogClosed) {
		return contract.RunRecord{}, fmt.Errorf("keeper: cancel marker of %q: %w", runID, err)
	}
	return st.RunRecord, nil
}

// CancelThread cancels the thread's active run; idle thread is ErrUnknownRun.
func (k *Keeper) CancelThread(ctx context.Context, threadID string) (contract.RunRecord, error) {
	run, err := k.ActiveRun(ctx, threadID)
	if err != nil {
		return contract.RunRecord{}, err
	}
	if run == nil {
		return contract.RunRecord{}, fmt.Errorf("keeper: thread %q has no active run: %w", threadID, contract.ErrUnknownRun)
	}
	return k.Cancel(ctx, run.RunID)
}

// extendLife extends the sandbox of a live run whose provider ends sandboxes after an
// absolute time to live (contract.LifeExtender, E2B), from the run's heartbeat st: in each
// window [n·P, n·P + driver lease) of the run's age, n ≥ 1 and P the provider's ExtendEvery.
// Every live run heartbeats at least once a lease, so each window holds a heartbeat and the
// sandbox never outlives its extensions; a window holds at most a few (a heartbeat every
// third or half lease), so the provider is called a few times per P, never per
// heartbeat, and it costs one row read each. The start (create or resume) set the first
// time to live. A failure is logged: the next heartbeat in the window tries again, and
// the reaper's probe of a detached run extends it too (docs/design.md §5).
func (k *Keeper) extendLife(ctx context.Context, st contract.RunState) {
	if len(k.extenders) == 0 || st.SandboxKey == nil || st.Status.Terminal() {
		return
	}
	age, lease := k.nowMs()-st.StartedAt, k.leaseMs()
	row, err := func() (*contract.InstanceRow, error) {
		if age <= 0 {
			return nil, nil
		}
		// Only inside a window is the row worth a read.
		due := false
		for _, x := range k.extenders {
			if p := x.ExtendEvery().Milliseconds(); p > 0 && age >= p && age%p < lease {
				due = true
			}
		}
		if !due {
			return nil, nil
		}
		return k.st.Instances().GetRow(ctx, *st.SandboxKey)
	}()
	if err != nil || row == nil || row.Reclaiming != "" || row.Lifecycle != contract.LifecycleRunning {
		if err != nil {
			k.cfg.Logger.WarnContext(ctx, "keeper: extending a live run's sandbox: read row", "runId", st.RunID, "err", err)
		}
		return
	}
	x, ok := k.extenders[row.Provider]
	if !ok {
		return
	}
	if p := x.ExtendEvery().Milliseconds(); p <= 0 || age < p || age%p >= lease {
		return
	}
	xctx, cancel := context.WithTimeout(ctx, k.cfg.ResumeTimeout)
	defer cancel()
	if err := k.providerErr(ctx, k.providers[row.Provider], x.ExtendLife(xctx, row.ProviderSandboxID)); err != nil {
		k.cfg.Logger.WarnContext(ctx, "keeper: extending a live run's sandbox failed", "runId", st.RunID,
			"providerSandboxId", row.ProviderSandboxID, "err", err)
	}
}
