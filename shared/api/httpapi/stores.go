package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/store/lease"
)

// The reference store surface (docs/design.md §8, "Store routes"): TanStack AI's instance
// map, run store and lock store over the backend, through shared/contract/refstore and the
// backend's contract.LeaseLocks. Trusted callers only: an instance row names a sandbox to
// resume and a lock fences other hosts, which no end user may forge.

// storeRoutes are the store routes, served by the resolve function (it already holds every
// DynamoDB action they issue).
func storeRoutes() []route {
	return []route{
		{Route{"GET", "/v1/store/instances/{key}", fnResolve, false}, trusted((*handler).getInstance)},
		{Route{"PUT", "/v1/store/instances/{key}", fnResolve, false}, trusted((*handler).putInstance)},
		{Route{"DELETE", "/v1/store/instances/{key}", fnResolve, false}, trusted((*handler).deleteInstance)},
		{Route{"POST", "/v1/store/runs", fnResolve, false}, trusted((*handler).createOrResume)},
		{Route{"GET", "/v1/store/runs/{runId}", fnResolve, false}, trusted((*handler).storeGetRun)},
		{Route{"PATCH", "/v1/store/runs/{runId}", fnResolve, false}, trusted((*handler).updateRun)},
		{Route{"GET", "/v1/store/threads/{threadId}/active-run", fnResolve, false}, trusted((*handler).storeActiveRun)},
		{Route{"GET", "/v1/store/threads/{threadId}/runs", fnResolve, false}, trusted((*handler).listByThread)},
		{Route{"GET", "/v1/store/reclaimable", fnResolve, false}, trusted((*handler).listReclaimable)},
		{Route{"POST", "/v1/store/locks/{key}/acquire", fnResolve, false}, trusted((*handler).acquireLock)},
		{Route{"POST", "/v1/store/locks/{key}/renew", fnResolve, false}, trusted((*handler).renewLock)},
		{Route{"POST", "/v1/store/locks/{key}/release", fnResolve, false}, trusted((*handler).releaseLock)},
	}
}

// EndUserAuth is implemented by an Authenticator whose callers are end users (JWTAuth):
// the store routes refuse them (403 trusted-caller-required).
type EndUserAuth interface {
	EndUsers() bool
}

// EndUsers reports that JWT callers are end users.
func (JWTAuth) EndUsers() bool { return true }

type storeOp func(*handler, context.Context, *call) (int, any, error)

// trusted refuses end users before fn reads anything, and validates the {key} path value.
func trusted(fn storeOp) storeOp {
	return func(h *handler, ctx context.Context, c *call) (int, any, error) {
		if eu, ok := h.auth.(EndUserAuth); ok && eu.EndUsers() {
			return 0, nil, &apiError{http.StatusForbidden, CodeTrustedCallerRequired,
				"the store routes serve trusted callers only (an IAM trusted role, or the dev server), never an end user's token"}
		}
		if strings.Contains(c.r.Pattern, "{key}") {
			if err := contract.CheckID("key", c.r.PathValue("key")); err != nil {
				return 0, nil, err
			}
		}
		return fn(h, ctx, c)
	}
}

// noContent is the success of a write that answers nothing.
type noContent struct{}

func (h *handler) backend() contract.Backend { return h.k.Config().Backend }

func (h *handler) getInstance(ctx context.Context, c *call) (int, any, error) {
	rec, err := refstore.Instances(h.backend().Instances()).Get(ctx, c.r.PathValue("key"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.InstanceResponse{Instance: rec}, nil
}

func (h *handler) putInstance(ctx context.Context, c *call) (int, any, error) {
	var req wire.InstanceRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	key := c.r.PathValue("key")
	rec, err := instanceRecord(key, req)
	if err != nil {
		return 0, nil, err
	}
	if err := refstore.Instances(h.backend().Instances()).Upsert(ctx, rec); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, noContent{}, nil
}

// instanceRecord validates an upsert body into the full record at key.
func instanceRecord(key string, req wire.InstanceRequest) (contract.InstanceRecord, error) {
	rec := contract.InstanceRecord{Key: key, Provider: req.Provider, ProviderSandboxID: req.ProviderSandboxID, ThreadID: req.ThreadID}
	if req.Key != nil && *req.Key != key {
		return rec, contract.Invalid("key", "must be the path's key %q", key)
	}
	for _, f := range []struct{ name, v string }{
		{"provider", req.Provider}, {"providerSandboxId", req.ProviderSandboxID}, {"threadId", req.ThreadID},
	} {
		if err := contract.CheckStoreID(f.name, f.v); err != nil {
			return rec, err
		}
	}
	for _, f := range []struct {
		name string
		v    *string
		dst  *string
	}{{"latestSnapshotId", req.LatestSnapshotID, &rec.LatestSnapshotID}, {"latestRunId", req.LatestRunID, &rec.LatestRunID}} {
		if f.v == nil {
			continue
		}
		if err := contract.CheckStoreID(f.name, *f.v); err != nil {
			return rec, err
		}
		*f.dst = *f.v
	}
	if req.UpdatedAt == nil {
		return rec, contract.Invalid("updatedAt", "required")
	}
	if *req.UpdatedAt < 0 {
		return rec, contract.Invalid("updatedAt", "must not be negative")
	}
	rec.UpdatedAt = *req.UpdatedAt
	return rec, nil
}

func (h *handler) deleteInstance(ctx context.Context, c *call) (int, any, error) {
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &wire.Empty{}, true); err != nil {
		return 0, nil, err
	}
	if err := refstore.Instances(h.backend().Instances()).Delete(ctx, c.r.PathValue("key")); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, noContent{}, nil
}

// storeRuns is the reference run store over the backend.
func (h *handler) storeRuns() refstore.RunStore { return refstore.Runs(h.backend().Runs()) }

func (h *handler) createOrResume(ctx context.Context, c *call) (int, any, error) {
	var req wire.StoreRunRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	if err := contract.CheckID("runId", req.RunID); err != nil {
		return 0, nil, err
	}
	if err := contract.CheckID("threadId", req.ThreadID); err != nil {
		return 0, nil, err
	}
	c.info.runID, c.info.threadID = req.RunID, req.ThreadID
	in := contract.NewRun{RunID: req.RunID, ThreadID: req.ThreadID, AppDriven: true}
	if req.StartedAt == nil {
		return 0, nil, contract.Invalid("startedAt", "required")
	}
	if in.StartedAt = *req.StartedAt; in.StartedAt < 0 {
		return 0, nil, contract.Invalid("startedAt", "must not be negative")
	}
	if req.Status != nil {
		st, err := contract.ParseRunStatus(*req.Status)
		if err != nil {
			return 0, nil, err
		}
		in.Status = st
	}
	rec, err := h.storeRuns().CreateOrResume(ctx, in)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.CreatedRunResponse{Run: rec}, nil
}

func (h *handler) storeGetRun(ctx context.Context, c *call) (int, any, error) {
	rec, err := h.storeRuns().Get(ctx, c.runID)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.StoreRunResponse{Run: rec}, nil
}

// updateRun applies the patch to an app-driven run; an unknown run is the reference's
// no-op. The mark is written at creation only, so the consistent read decides exactly.
func (h *handler) updateRun(ctx context.Context, c *call) (int, any, error) {
	var req wire.StoreRunPatch
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	p, err := runPatch(req)
	if err != nil {
		return 0, nil, err
	}
	st, err := h.backend().Runs().State(ctx, c.runID)
	switch {
	case err != nil:
		return 0, nil, err
	case st == nil:
		return http.StatusNoContent, noContent{}, nil
	case !st.AppDriven:
		return 0, nil, fmt.Errorf("run %q: %w", c.runID, contract.ErrSandkeepDriven)
	}
	if err := h.storeRuns().Update(ctx, c.runID, p); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, noContent{}, nil
}

// runPatch reads each member raw: absent leaves the field, null clears it, a value of the
// member's type sets it.
func runPatch(req wire.StoreRunPatch) (contract.RunPatch, error) {
	var p contract.RunPatch
	var err error
	if p.Status, err = patchField[contract.RunStatus]("status", req.Status, func(v contract.RunStatus) error {
		_, err := contract.ParseRunStatus(string(v))
		return err
	}); err != nil {
		return p, err
	}
	nonNeg := func(name string) func(int64) error {
		return func(v int64) error {
			if v < 0 {
				return contract.Invalid(name, "must not be negative")
			}
			return nil
		}
	}
	if p.FinishedAt, err = patchField("finishedAt", req.FinishedAt, nonNeg("finishedAt")); err != nil {
		return p, err
	}
	if p.DetachedSince, err = patchField("detachedSince", req.DetachedSince, nonNeg("detachedSince")); err != nil {
		return p, err
	}
	if p.DriverEpoch, err = patchField("driverEpoch", req.DriverEpoch, nonNeg("driverEpoch")); err != nil {
		return p, err
	}
	if p.CancelRequested, err = patchField[bool]("cancelRequested", req.CancelRequested, nil); err != nil {
		return p, err
	}
	if p.SandboxKey, err = patchField("sandboxKey", req.SandboxKey, func(v string) error {
		return contract.CheckStoreID("sandboxKey", v)
	}); err != nil {
		return p, err
	}
	if len(req.Error) > 0 {
		if isNull(req.Error) {
			p.Error = contract.Clear[contract.RunError]()
		} else {
			var e contract.RunError
			if err := decodeMember("error", req.Error, &e); err != nil {
				return p, err
			}
			if e.Message == "" {
				return p, contract.Invalid("error.message", "required")
			}
			p.Error = contract.Set(e)
		}
	}
	if len(req.Usage) > 0 {
		if isNull(req.Usage) {
			p.Usage = contract.Clear[json.RawMessage]()
		} else {
			p.Usage = contract.Set(append(json.RawMessage(nil), req.Usage...))
		}
	}
	if p.Status.IsClear() {
		return p, contract.Invalid("status", "cannot be cleared")
	}
	return p, p.Check()
}

// patchField reads one raw patch member of type T: absent (leave), null (clear) or a value
// check accepts (set).
func patchField[T any](name string, raw json.RawMessage, check func(T) error) (contract.Field[T], error) {
	if len(raw) == 0 {
		return contract.Field[T]{}, nil
	}
	if isNull(raw) {
		return contract.Clear[T](), nil
	}
	var v T
	if err := decodeMember(name, raw, &v); err != nil {
		return contract.Field[T]{}, err
	}
	if check != nil {
		if err := check(v); err != nil {
			return contract.Field[T]{}, err
		}
	}
	return contract.Set(v), nil
}

// decodeMember decodes one raw member strictly: the body's key rules (checkKeys) and
// types, errors naming the member.
func decodeMember(name string, raw json.RawMessage, dst any) error {
	if err := checkKeys(raw, reflect.TypeOf(dst), name+"."); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) {
			field := name
			if typ.Field != "" {
				field = name + "." + typ.Field
			}
			return contract.Invalid(field, "must be %s, not %s", jsonTypeName(typ.Type), typ.Value)
		}
		return contract.Invalid(name, "must be valid JSON of its type")
	}
	return nil
}

func (h *handler) storeActiveRun(ctx context.Context, c *call) (int, any, error) {
	rec, err := h.storeRuns().FindActiveRun(ctx, c.thread)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.StoreRunResponse{Run: rec}, nil
}

func (h *handler) listByThread(ctx context.Context, c *call) (int, any, error) {
	runs, err := h.storeRuns().ListByThread(ctx, c.thread)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.RunsResponse{Runs: nonNilRuns(runs)}, nil
}

func (h *handler) listReclaimable(ctx context.Context, c *call) (int, any, error) {
	q := c.r.URL.Query()
	if _, ok := q["now"]; !ok {
		return 0, nil, contract.Invalid("now", "required")
	}
	if _, ok := q["ttlMs"]; !ok {
		return 0, nil, contract.Invalid("ttlMs", "required")
	}
	now, err := queryInt(q, "now", 0, 0, math.MaxInt64)
	if err != nil {
		return 0, nil, err
	}
	ttl, err := queryInt(q, "ttlMs", 0, 0, math.MaxInt64)
	if err != nil {
		return 0, nil, err
	}
	runs, err := h.storeRuns().ListReclaimable(ctx, now, ttl)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.RunsResponse{Runs: nonNilRuns(runs)}, nil
}

func nonNilRuns(r []contract.RunRecord) []contract.RunRecord {
	if r == nil {
		return []contract.RunRecord{}
	}
	return r
}

// leaseLocks is the backend's step-by-step lease (501 unsupported without it).
func (h *handler) leaseLocks() (contract.LeaseLocks, error) {
	l, ok := h.backend().Locks().(contract.LeaseLocks)
	if !ok {
		return nil, &apiError{http.StatusNotImplemented, CodeUnsupported, "this server's backend does not hand out lock leases"}
	}
	return l, nil
}

// acquireLock takes the lease for a new owner token, waiting up to waitMs (Hold's jittered
// backoff); still held then: 409 lock-held, and the caller asks again.
func (h *handler) acquireLock(ctx context.Context, c *call) (int, any, error) {
	var req wire.LockAcquireRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, true); err != nil {
		return 0, nil, err
	}
	var wait int64
	if req.WaitMs != nil {
		if wait = *req.WaitMs; wait < 0 || wait > wire.MaxLockWaitMs {
			return 0, nil, contract.Invalid("waitMs", "must be between 0 and %d", wire.MaxLockWaitMs)
		}
	}
	l, err := h.leaseLocks()
	if err != nil {
		return 0, nil, err
	}
	key, owner := c.r.PathValue("key"), rand.Text()
	try := func(ctx context.Context, _ time.Time) (int64, bool, error) { return l.TryAcquire(ctx, key, owner) }
	var fence int64
	if wait == 0 {
		var ok bool
		if fence, ok, err = l.TryAcquire(ctx, key, owner); err == nil && !ok {
			err = errLockHeld
		}
	} else {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(wait)*time.Millisecond)
		fence, err = lease.Acquire(wctx, lease.Primitives{Waiting: "waiting for the lock", Acquire: try})
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = errLockHeld
		}
	}
	if err != nil {
		return 0, nil, err
	}
	tm := l.Timing()
	return http.StatusOK, wire.LockAcquireResponse{Token: owner, Fence: fence,
		LeaseMs: tm.Lease.Milliseconds(), RenewMs: tm.Renew.Milliseconds(), SkewMs: tm.Skew.Milliseconds()}, nil
}

var errLockHeld = &apiError{http.StatusConflict, CodeLockHeld, "another holder has the lock; acquire again"}

func (h *handler) renewLock(ctx context.Context, c *call) (int, any, error) {
	var req wire.LockTokenRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	l, err := h.leaseLocks()
	if err != nil {
		return 0, nil, err
	}
	ok, err := l.Renew(ctx, c.r.PathValue("key"), req.Token)
	switch {
	case err != nil:
		return 0, nil, err
	case !ok:
		return 0, nil, &apiError{http.StatusConflict, CodeLockLost, "the token does not hold the lock (released, or taken after it expired); stop the critical section"}
	}
	return http.StatusOK, wire.LockRenewResponse{LeaseMs: l.Timing().Lease.Milliseconds()}, nil
}

func (h *handler) releaseLock(ctx context.Context, c *call) (int, any, error) {
	var req wire.LockTokenRequest
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &req, false); err != nil {
		return 0, nil, err
	}
	l, err := h.leaseLocks()
	if err != nil {
		return 0, nil, err
	}
	if err := l.Release(ctx, c.r.PathValue("key"), req.Token); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, noContent{}, nil
}
