package keeper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// startPlan is a validated StartInput with everything derived from it.
type startPlan struct {
	runID, threadID string
	startedAt       int64
	key             string
	prov            contract.Provider
	workspace       any               // the workspace without its secrets (nil = none)
	env             map[string]string // the workspace's secrets: injected, never logged or stored
	maxAgeMs        int64
	now             int64
	destroyOnEnd    bool  // reuse "none": one sandbox per run, destroyed once it ended
	destroyOnCancel bool  // the setup's destroyOnCancel
	idleStopMs      int64 // the setup's idle grace (0 = the deployment's)
	// made and madeOutcome: the sandbox this start created or restored, and how, so a
	// retry after a lost lease that adopts it (through its intent) reports that outcome.
	made        string
	madeOutcome Outcome
}

// resolved is the sandbox a start ended up with.
type resolved struct {
	row      contract.InstanceRecord
	outcome  Outcome
	recorded bool // the run must record row.ProviderSandboxID (every path but the fast one)
}

// Start resolves the run's sandbox (resume, restore or create) and makes the caller the
// run's driver at epoch 1; a retried start of an existing run takes it over (docs/design.md §4.1).
func (k *Keeper) Start(ctx context.Context, in StartInput) (StartResult, error) {
	pl, err := k.plan(ctx, in)
	if err != nil {
		return StartResult{}, err
	}
	// Step 1: create the run holding epoch 1 while reading the row, in parallel.
	cc := contract.CreateClaimedRun{
		NewRun:     contract.NewRun{RunID: pl.runID, ThreadID: pl.threadID, StartedAt: pl.startedAt, Status: contract.StatusRunning},
		SandboxKey: pl.key,
		LeaseUntil: pl.now + k.leaseMs(),
		Token:      newToken(),
	}
	if k.cfg.LaunchDeadline > 0 {
		cc.LaunchBy = pl.now + k.cfg.LaunchDeadline.Milliseconds()
	}
	type createdRun struct {
		st      contract.RunState
		created bool
	}
	var (
		g           errgroup.Group
		cr          createdRun
		row         *contract.InstanceRow
		cerr, rerr  error
		runs, insts = k.st.Runs(), k.st.Instances()
	)
	g.Go(func() error {
		cr.st, cr.created, cerr = runs.CreateClaimed(ctx, cc)
		return nil
	})
	g.Go(func() error {
		row, rerr = insts.GetRow(ctx, pl.key)
		return nil
	})
	_ = g.Wait() // both report through cerr/rerr
	if cerr != nil {
		return StartResult{}, fmt.Errorf("keeper: start %q: create run: %w", pl.runID, cerr)
	}
	// A retried create that recognises its own token after another driver already claimed
	// the run (epoch > 1) must not answer epoch 1: that driver is superseded. It takes the
	// run over like any retried start.
	if !cr.created || cr.st.Epoch() != 1 {
		return k.startExisting(ctx, pl, cr.st)
	}
	res, err := k.resolveNew(ctx, pl, cr.st, row, rerr)
	if err != nil {
		k.startFailed(ctx, pl, err)
		return StartResult{}, err
	}
	return res, nil
}

// startExisting answers a start whose run already exists: a retried start takes the run
// over like an attach; it never launches a second driver at epoch 1.
func (k *Keeper) startExisting(ctx context.Context, pl *startPlan, st contract.RunState) (StartResult, error) {
	switch {
	case st.AppDriven: // its app drives it (the reference run store): never taken over
		return StartResult{}, fmt.Errorf("keeper: start %q: %w", pl.runID, contract.ErrAppDriven)
	case st.Status.Terminal():
		return StartResult{}, fmt.Errorf("keeper: start %q: %w", pl.runID, contract.ErrTerminalRun)
	case st.ThreadID != pl.threadID:
		return StartResult{}, fmt.Errorf("keeper: start %q: the run belongs to another thread: %w", pl.runID, contract.ErrConflict)
	case st.SandboxKey == nil || *st.SandboxKey != pl.key:
		return StartResult{}, fmt.Errorf("keeper: start %q: the run uses another sandbox: %w", pl.runID, contract.ErrConflict)
	}
	// The first start may still be resolving the sandbox (the row is written and the run
	// records it last): taking over now would find no row and answer sandbox-gone. Wait
	// for it instead; a first start that died unresolved is finished here.
	orphan, err := k.awaitResolved(ctx, pl)
	if err != nil {
		return StartResult{}, err
	}
	claimed, err := k.claim(ctx, pl.runID)
	if err != nil {
		return StartResult{}, err
	}
	if orphan {
		res, err := k.lockedPath(ctx, pl)
		if err != nil {
			return StartResult{}, err
		}
		psid := res.row.ProviderSandboxID
		if _, err := k.st.Runs().RecordSandbox(ctx, pl.runID, claimed.Epoch(), psid); err != nil {
			return StartResult{}, fmt.Errorf("keeper: start %q: record sandbox: %w", pl.runID, err)
		}
	}
	ar, err := k.takeOver(ctx, claimed)
	if err != nil {
		return StartResult{}, err
	}
	k.cfg.Logger.InfoContext(ctx, "keeper: start took the run over", "runId", pl.runID, "epoch", ar.Driver.Epoch)
	return StartResult{Run: ar.Run, Sandbox: ar.Sandbox, Outcome: OutcomeTakenOver, Driver: ar.Driver}, nil
}

// Pacing of a retried start's wait for the first start's sandbox.
const (
	startWaitFirst = 20 * time.Millisecond
	startWaitMax   = 500 * time.Millisecond
)

// awaitResolved waits (up to Config.StartWait) until the run's sandbox is resolved: the
// run recorded it or its key has a live row. While the first start's driver lease holds,
// an unresolved run is one whose sandbox is being created: past the wait the answer is
// ErrUnavailable (503, retry), never ErrSandboxGone. An unresolved run whose lease has
// lapsed lost its first start: orphan=true, and the caller resolves the sandbox itself.
func (k *Keeper) awaitResolved(ctx context.Context, pl *startPlan) (orphan bool, err error) {
	deadline := time.Now().Add(k.cfg.StartWait) // monotonic: cfg.Now may be a test's clock
	pause := startWaitFirst
	for {
		st, row, err := k.stateAndRow(ctx, pl.runID, pl.key)
		switch {
		case err != nil:
			return false, fmt.Errorf("keeper: start %q: read run: %w", pl.runID, err)
		case st == nil:
			return false, fmt.Errorf("keeper: start %q: run vanished: %w", pl.runID, contract.ErrUnknownRun)
		case st.Status.Terminal():
			return false, fmt.Errorf("keeper: start %q: %w", pl.runID, contract.ErrTerminalRun)
		case st.ProviderSandboxID != "" || row != nil && row.Reclaiming == "":
			return false, nil
		case st.LeaseUntil <= k.nowMs():
			k.cfg.Logger.WarnContext(ctx, "keeper: the run's first start lapsed before it recorded a sandbox; resolving it",
				"runId", pl.runID, "key", pl.key)
			return true, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, fmt.Errorf("keeper: start %q: the run's sandbox is still being created: %w", pl.runID, ErrUnavailable)
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, fmt.Errorf("keeper: start %q: waiting for the sandbox: %w", pl.runID, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, startWaitMax)
	}
}

// resolveNew gets the sandbox of a run step 1 created: the fast path when the row read
// in parallel allows it, else the locked path; then the run records the sandbox it got.
func (k *Keeper) resolveNew(ctx context.Context, pl *startPlan, st contract.RunState, row *contract.InstanceRow, rowErr error) (StartResult, error) {
	var (
		res resolved
		ok  bool
		err error
	)
	if rowErr == nil {
		res, ok, err = k.fastPath(ctx, pl, row)
		if err != nil {
			return StartResult{}, err
		}
	}
	if !ok {
		if res, err = k.lockedPath(ctx, pl); err != nil {
			return StartResult{}, err
		}
	}
	if res.recorded {
		psid := res.row.ProviderSandboxID
		st, err = k.st.Runs().RecordSandbox(ctx, pl.runID, 1, psid)
		if err != nil {
			return StartResult{}, fmt.Errorf("keeper: start %q: record sandbox: %w", pl.runID, err)
		}
	}
	k.cfg.Logger.DebugContext(ctx, "keeper: started", "runId", pl.runID, "key", pl.key,
		"outcome", res.outcome, "providerSandboxId", res.row.ProviderSandboxID)
	return StartResult{
		Run: st.RunRecord,
		Sandbox: Sandbox{
			Key:               pl.key,
			Provider:          res.row.Provider,
			ProviderSandboxID: res.row.ProviderSandboxID,
			LatestSnapshotID:  res.row.LatestSnapshotID,
		},
		Outcome: res.outcome,
		Driver: Driver{
			Epoch:      1,
			Cursor:     contract.Cursor{Epoch: 1, Next: 1}, // a new run's log is empty: offsets start at 1
			LeaseMs:    k.leaseMs(),
			LeaseUntil: st.LeaseUntil,
		},
	}, nil
}

// fastPath resumes the row read in step 1 without the lock: only a young row with no
// pending reclaim, and only while Touch finds it unchanged. ok=false sends the start
// down the locked path; an error (a transient Resume failure) fails it.
func (k *Keeper) fastPath(ctx context.Context, pl *startPlan, row *contract.InstanceRow) (resolved, bool, error) {
	if row == nil || row.Reclaiming != "" || row.Lifecycle == contract.LifecycleStopping ||
		row.Provider != pl.prov.Name() || pl.tooOld(row.InstanceRecord) {
		return resolved{}, false, nil
	}
	psid := row.ProviderSandboxID
	err := k.resume(ctx, pl, psid)
	if errors.Is(err, contract.ErrSandboxGone) {
		return resolved{}, false, nil
	}
	if err != nil {
		return resolved{}, false, err
	}
	err = k.st.Instances().Touch(ctx, pl.key, psid, pl.runID, pl.now)
	if errors.Is(err, contract.ErrConflict) {
		return resolved{}, false, nil // the row changed under us: decide again under the lock
	}
	if err != nil {
		return resolved{}, false, fmt.Errorf("keeper: start %q: touch instance: %w", pl.runID, err)
	}
	rec := row.InstanceRecord
	rec.LatestRunID, rec.UpdatedAt = pl.runID, pl.now
	return resolved{row: rec, outcome: OutcomeResumed}, true, nil
}

// tooOld reports whether the row aged past the setup's max age (strictly older).
func (pl *startPlan) tooOld(rec contract.InstanceRecord) bool {
	return pl.maxAgeMs > 0 && pl.now-rec.UpdatedAt > pl.maxAgeMs
}

// resume resumes psid within ResumeTimeout and re-injects the secrets. ErrSandboxGone
// passes through; any other failure is transient (ErrUnavailable) and never read as gone.
func (k *Keeper) resume(ctx context.Context, pl *startPlan, psid string) error {
	rctx, cancel := context.WithTimeout(ctx, k.cfg.ResumeTimeout)
	defer cancel()
	err := k.providerErr(ctx, pl.prov, pl.prov.Resume(rctx, psid))
	if errors.Is(err, contract.ErrSandboxGone) {
		return fmt.Errorf("keeper: resume %s: %w", psid, err)
	}
	if err != nil {
		return fmt.Errorf("keeper: resume %s: %w: %w", psid, ErrUnavailable, err)
	}
	if es, ok := pl.prov.(contract.EnvSetter); ok && len(pl.env) > 0 {
		if err := k.providerErr(ctx, pl.prov, es.SetEnv(rctx, psid, pl.env)); err != nil {
			return fmt.Errorf("keeper: re-inject secrets into %s: %w: %w", psid, ErrUnavailable, err)
		}
	}
	return nil
}

// startFailed marks a run step 1 created as failed (fenced by epoch 1) and closes its log,
// so a failed start never lingers as the thread's active run. Best effort: logged.
func (k *Keeper) startFailed(ctx context.Context, pl *startPlan, cause error) {
	dctx, cancel := detached(ctx, k.cfg.DestroyTimeout)
	defer cancel()
	msg := cause.Error()
	if len(msg) > maxStartFailMsg {
		msg = msg[:maxStartFailMsg]
	}
	p := contract.RunPatch{
		Status:     contract.Set(contract.StatusFailed),
		FinishedAt: contract.Set(k.nowMs()),
		Error:      contract.Set(contract.RunError{Message: msg, Code: "start-failed"}),
	}
	_, err := k.st.Runs().UpdateFenced(dctx, pl.runID, 1, p)
	if err == nil {
		at := contract.Cursor{Epoch: 1, Next: 1}
		err = k.st.Log().Close(dctx, pl.runID, at)
		k.landed(dctx, pl.runID, Landing{})
		if errors.Is(err, contract.ErrLogClosed) {
			err = nil
		}
	}
	log := k.cfg.Logger.WarnContext
	if err != nil {
		log(ctx, "keeper: could not mark a failed start", "runId", pl.runID, "key", pl.key, "error", err.Error())
	}
	log(ctx, "keeper: start failed", "runId", pl.runID, "key", pl.key, "error", cause.Error())
}

// plan validates in and derives the key, the provider, the workspace and its secrets.
func (k *Keeper) plan(ctx context.Context, in StartInput) (*startPlan, error) {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct{ name, v string }{{"runId", in.RunID}, {"threadId", in.ThreadID}, {"sandbox.id", in.Sandbox.ID}} {
		if err := contract.CheckStoreID(f.name, f.v); err != nil {
			return nil, err
		}
	}
	prov, ok := k.providers[in.Sandbox.Provider]
	if !ok {
		return nil, contract.Invalid("sandbox.provider", "provider %q is not configured", in.Sandbox.Provider)
	}
	reuse := in.Sandbox.Reuse
	switch reuse {
	case "":
		reuse = ReuseThread
	case ReuseThread, ReuseNone:
	default:
		return nil, contract.Invalid("sandbox.reuse", "must be %q or %q", ReuseThread, ReuseNone)
	}
	if in.Sandbox.SnapshotMaxAgeMs < 0 {
		return nil, contract.Invalid("sandbox.snapshotMaxAgeMs", "negative")
	}
	if g := in.Sandbox.IdleStopMs; g != 0 && (g < MinIdleStop.Milliseconds() || g > MaxIdleStop.Milliseconds()) {
		return nil, contract.Invalid("sandbox.idleStopMs", "must be 0 (the deployment's grace) or between %d and %d", MinIdleStop.Milliseconds(), MaxIdleStop.Milliseconds())
	}
	ws, env, err := splitWorkspace(in.Sandbox.Workspace)
	if err != nil {
		return nil, err
	}
	ki := contract.KeyInput{ThreadID: in.ThreadID, SetupID: in.Sandbox.ID, Provider: prov.Name(), Tenant: tenant}
	if ws != nil {
		ki.Workspace = ws
	}
	if reuse == ReuseNone {
		ki.RunID = in.RunID
	}
	key, err := contract.SandboxKey(ki)
	if err != nil {
		return nil, err
	}
	now := k.nowMs()
	startedAt := in.StartedAt
	if startedAt == 0 {
		startedAt = now
	}
	startedAt = min(max(startedAt, now-clampStartedAt), now+clampStartedAt)
	pl := &startPlan{
		runID: in.RunID, threadID: in.ThreadID, startedAt: startedAt, key: key, prov: prov,
		env: env, maxAgeMs: in.Sandbox.SnapshotMaxAgeMs, now: now, destroyOnEnd: reuse == ReuseNone,
		destroyOnCancel: in.Sandbox.DestroyOnCancel, idleStopMs: in.Sandbox.IdleStopMs,
	}
	if ws != nil {
		pl.workspace = ws
	}
	return pl, nil
}

// splitWorkspace returns the workspace without its top-level "secrets" member, and the
// secrets (an object of strings) as env. An absent or null workspace is nil.
func splitWorkspace(raw json.RawMessage) (json.RawMessage, map[string]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil, nil
	}
	if !json.Valid(raw) {
		return nil, nil, contract.Invalid("sandbox.workspace", "not a JSON document")
	}
	var obj map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &obj) != nil {
		return raw, nil, nil
	}
	sec, ok := obj["secrets"]
	if !ok {
		return raw, nil, nil
	}
	var env map[string]string
	if err := json.Unmarshal(sec, &env); err != nil {
		// Never echo the value: it is a secret.
		return nil, nil, contract.Invalid("sandbox.workspace.secrets", "must be an object of strings")
	}
	if err := contract.CheckEnv(env); err != nil { // names only: CheckEnv never echoes a value
		return nil, nil, contract.Invalid("sandbox.workspace.secrets", "%v", err)
	}
	delete(obj, "secrets")
	stripped, err := json.Marshal(obj)
	if err != nil {
		return nil, nil, contract.Invalid("sandbox.workspace", "%v", err)
	}
	return stripped, env, nil
}
