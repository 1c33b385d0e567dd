package testkit

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// Deliberate defects for the negative controls, built at the contract's seams: each wraps
// a correct store's interface and breaks one rule the suites prove, so a control can show
// the suite fails against it. No backend carries a switch for them.

// NoEpochCheckLog returns inner with Append's epoch check defeated: an append that meets
// another epoch's item — refused as superseded by a higher epoch, or failed on a lower
// epoch's item at its own offset (a chain another broken writer already disordered) —
// steps past that item and stores further on anyway, under its own epoch.
func NoEpochCheckLog(inner contract.EventLog) contract.EventLog { return noEpochCheckLog{inner} }

type noEpochCheckLog struct{ contract.EventLog }

// noEpochCheckSteps bounds the items one broken append steps over.
const noEpochCheckSteps = 1000

// Append retries a superseded append just past the item that refused it.
func (l noEpochCheckLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	for range noEpochCheckSteps {
		res, err := l.EventLog.Append(ctx, runID, at, events)
		if !otherEpoch(ctx, err) {
			return res, err
		}
		// The defect: step over the higher epoch's item (markers and the first events
		// item after at.Next-1) instead of refusing.
		_, next, _, rerr := l.Read(ctx, runID, at.Next-1, 1)
		switch {
		case rerr != nil:
			return res, rerr
		case next < at.Next:
			return res, err // nothing to step over
		}
		at.Next = next + 1
	}
	return contract.AppendResult{}, fmt.Errorf("testkit: broken append stepped over %d items without storing", noEpochCheckSteps)
}

// otherEpoch reports whether an append failed on another epoch's item: superseded, or an
// error that is no sentinel answer (a lower epoch's item is reported as a broken chain).
func otherEpoch(ctx context.Context, err error) bool {
	switch {
	case err == nil, ctx.Err() != nil:
		return false
	case errors.Is(err, contract.ErrSuperseded):
		return true
	}
	return !contract.IsSentinel(err)
}

// MergeUpsertRows returns inner with the reference Upsert merging instead of replacing:
// the optionals a caller omits (latestSnapshotId, latestRunId) keep their stored values.
// Its rows are inner's; refstore.Instances finds its Upsert (contract.InstanceStore).
func MergeUpsertRows(inner contract.InstanceRows) contract.InstanceRows {
	return mergeUpsertRows{InstanceRows: inner, ref: refstore.Instances(inner)}
}

type mergeUpsertRows struct {
	contract.InstanceRows
	ref contract.InstanceStore
}

var _ contract.InstanceStore = mergeUpsertRows{}

func (r mergeUpsertRows) Get(ctx context.Context, key string) (*contract.InstanceRecord, error) {
	return r.ref.Get(ctx, key)
}

func (r mergeUpsertRows) Delete(ctx context.Context, key string) error { return r.ref.Delete(ctx, key) }

// Upsert fills rec's omitted optionals from the stored record first.
func (r mergeUpsertRows) Upsert(ctx context.Context, rec contract.InstanceRecord) error {
	old, err := r.ref.Get(ctx, rec.Key)
	if err != nil {
		return err
	}
	if old != nil {
		if rec.LatestSnapshotID == "" {
			rec.LatestSnapshotID = old.LatestSnapshotID
		}
		if rec.LatestRunID == "" {
			rec.LatestRunID = old.LatestRunID
		}
	}
	return r.ref.Upsert(ctx, rec)
}

// KeepDurableRuns returns inner (which must have contract.RunWriter) with Update ignoring
// a Clear of the four durable fields (sandboxKey, detachedSince, cancelRequested,
// driverEpoch): the clear silently does nothing.
func KeepDurableRuns(inner contract.FencedRuns) contract.FencedRuns {
	return keepDurableRuns{FencedRuns: inner, w: inner.(contract.RunWriter)}
}

type keepDurableRuns struct {
	contract.FencedRuns
	w contract.RunWriter
}

var _ contract.RunWriter = keepDurableRuns{}

func (r keepDurableRuns) CreateOrResume(ctx context.Context, in contract.NewRun) (contract.RunRecord, error) {
	return r.w.CreateOrResume(ctx, in)
}

// Update drops the patch's clears of the durable fields.
func (r keepDurableRuns) Update(ctx context.Context, runID string, p contract.RunPatch) error {
	if p.SandboxKey.IsClear() {
		p.SandboxKey = contract.Field[string]{}
	}
	if p.DetachedSince.IsClear() {
		p.DetachedSince = contract.Field[int64]{}
	}
	if p.CancelRequested.IsClear() {
		p.CancelRequested = contract.Field[bool]{}
	}
	if p.DriverEpoch.IsClear() {
		p.DriverEpoch = contract.Field[int64]{}
	}
	return r.w.Update(ctx, runID, p)
}

// HideLiveRuns returns b with its run store hiding live runs: a run that has not ended
// reads as completed long ago, and no run is listed as using a sandbox key. An idle stop
// that sees this takes a working sandbox for an idle one — the defect RunLiveNeverStopped
// must catch (given to IdleWorld.SweepBackend, it is what the reaper sees).
func HideLiveRuns(b contract.Backend) contract.Backend { return hideLiveRuns{b} }

type hideLiveRuns struct{ contract.Backend }

// Runs returns the run store with live runs hidden.
func (b hideLiveRuns) Runs() contract.FencedRuns { return hiddenRuns{b.Backend.Runs()} }

type hiddenRuns struct{ contract.FencedRuns }

// State answers a live run as completed at epoch ms 1.
func (r hiddenRuns) State(ctx context.Context, runID string) (*contract.RunState, error) {
	st, err := r.FencedRuns.State(ctx, runID)
	if err != nil || st == nil || st.Status.Terminal() {
		return st, err
	}
	hidden, long := *st, int64(1)
	hidden.Status, hidden.FinishedAt = contract.StatusCompleted, &long
	return &hidden, nil
}

// RunsUsingKey lists no run.
func (hiddenRuns) RunsUsingKey(context.Context, string) ([]string, error) { return nil, nil }
