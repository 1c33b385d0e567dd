package store

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

// The views: each method is the backend's, called under the policy. A view is the one
// place a store call is repeated; none of them does more than repeat it.

type rows struct {
	r contract.InstanceRows
	p storecall.Policy
}

func (x rows) GetRow(ctx context.Context, key string) (*contract.InstanceRow, error) {
	return storecall.Do(ctx, x.p, func() (*contract.InstanceRow, error) { return x.r.GetRow(ctx, key) })
}

func (x rows) CreateRow(ctx context.Context, rec contract.InstanceRecord, incarnation string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.CreateRow(ctx, rec, incarnation) })
}

func (x rows) ReplaceRow(ctx context.Context, rec contract.InstanceRecord, prev, next string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.ReplaceRow(ctx, rec, prev, next) })
}

func (x rows) Touch(ctx context.Context, key, psid, latestRunID string, now int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.Touch(ctx, key, psid, latestRunID, now) })
}

func (x rows) SetSnapshot(ctx context.Context, key, psid, prev, snapshotID string, now int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.SetSnapshot(ctx, key, psid, prev, snapshotID, now) })
}

func (x rows) MarkReclaiming(ctx context.Context, key, psid string, updatedAt, idleBefore int64, token string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.MarkReclaiming(ctx, key, psid, updatedAt, idleBefore, token) })
}

func (x rows) DeleteReclaimed(ctx context.Context, key, token string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.DeleteReclaimed(ctx, key, token) })
}

func (x rows) DeferReclaim(ctx context.Context, key, psid string, due int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.DeferReclaim(ctx, key, psid, due) })
}

func (x rows) DropStaleSnapshot(ctx context.Context, key, snapshotID string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.DropStaleSnapshot(ctx, key, snapshotID) })
}

func (x rows) MarkStopping(ctx context.Context, key, psid string, updatedAt int64, token string, now int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.MarkStopping(ctx, key, psid, updatedAt, token, now) })
}

func (x rows) SettleStop(ctx context.Context, key, token, lifecycle string, now int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.SettleStop(ctx, key, token, lifecycle, now) })
}

func (x rows) DeferStop(ctx context.Context, key, psid string, idleSince int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.DeferStop(ctx, key, psid, idleSince) })
}

type runs struct {
	r contract.FencedRuns
	p storecall.Policy
}

func (x runs) State(ctx context.Context, runID string) (*contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (*contract.RunState, error) { return x.r.State(ctx, runID) })
}

func (x runs) FindActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	return storecall.Do(ctx, x.p, func() (*contract.RunRecord, error) { return x.r.FindActiveRun(ctx, threadID) })
}

func (x runs) RunsUsingKey(ctx context.Context, key string) ([]string, error) {
	return storecall.Do(ctx, x.p, func() ([]string, error) { return x.r.RunsUsingKey(ctx, key) })
}

func (x runs) CreateClaimed(ctx context.Context, in contract.CreateClaimedRun) (contract.RunState, bool, error) {
	type created struct {
		st contract.RunState
		ok bool
	}
	c, err := storecall.Do(ctx, x.p, func() (created, error) {
		st, ok, err := x.r.CreateClaimed(ctx, in)
		return created{st, ok}, err
	})
	return c.st, c.ok, err
}

func (x runs) Claim(ctx context.Context, runID string, c contract.Claim) (contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunState, error) { return x.r.Claim(ctx, runID, c) })
}

func (x runs) UpdateFenced(ctx context.Context, runID string, epoch int64, p contract.RunPatch) (contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunState, error) { return x.r.UpdateFenced(ctx, runID, epoch, p) })
}

func (x runs) RecordSandbox(ctx context.Context, runID string, epoch int64, psid string) (contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunState, error) { return x.r.RecordSandbox(ctx, runID, epoch, psid) })
}

func (x runs) Heartbeat(ctx context.Context, runID string, epoch, leaseUntil int64) (contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunState, error) { return x.r.Heartbeat(ctx, runID, epoch, leaseUntil) })
}

func (x runs) Detach(ctx context.Context, runID string, epoch int64, sandboxKey string, now int64) (contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunState, error) { return x.r.Detach(ctx, runID, epoch, sandboxKey, now) })
}

func (x runs) Lapse(ctx context.Context, runID string, epoch, leaseUntil int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.r.Lapse(ctx, runID, epoch, leaseUntil) })
}

func (x runs) RequestCancel(ctx context.Context, runID string) (contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunState, error) { return x.r.RequestCancel(ctx, runID) })
}

func (x runs) ClearLaunch(ctx context.Context, runID string) (contract.RunState, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunState, error) { return x.r.ClearLaunch(ctx, runID) })
}

type eventLog struct {
	l contract.EventLog
	p storecall.Policy
}

func (x eventLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	return storecall.Do(ctx, x.p, func() (contract.AppendResult, error) { return x.l.Append(ctx, runID, at, events) })
}

func (x eventLog) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	return storecall.Do(ctx, x.p, func() (contract.AppendResult, error) { return x.l.Fence(ctx, runID, epoch) })
}

func (x eventLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	type page struct {
		events []contract.Event
		next   int64
		closed bool
	}
	pg, err := storecall.Do(ctx, x.p, func() (page, error) {
		evs, next, closed, err := x.l.Read(ctx, runID, after, limit)
		return page{evs, next, closed}, err
	})
	return pg.events, pg.next, pg.closed, err
}

func (x eventLog) Close(ctx context.Context, runID string, at contract.Cursor) error {
	return storecall.Do0(ctx, x.p, func() error { return x.l.Close(ctx, runID, at) })
}

func (x eventLog) MarkCancel(ctx context.Context, runID string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.l.MarkCancel(ctx, runID) })
}

// MarkWatch retried after an ambiguous failure may leave two watch markers: each is one
// offset without an event, which readers and writers step past.
func (x eventLog) MarkWatch(ctx context.Context, runID string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.l.MarkWatch(ctx, runID) })
}

type intents struct {
	s contract.IntentStore
	p storecall.Policy
}

func (x intents) Put(ctx context.Context, key string, token, now int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.s.Put(ctx, key, token, now) })
}

func (x intents) Record(ctx context.Context, key string, token int64, psid string) error {
	return storecall.Do0(ctx, x.p, func() error { return x.s.Record(ctx, key, token, psid) })
}

func (x intents) Get(ctx context.Context, key string) (*contract.Intent, error) {
	return storecall.Do(ctx, x.p, func() (*contract.Intent, error) { return x.s.Get(ctx, key) })
}

func (x intents) Drop(ctx context.Context, key string, token int64) error {
	return storecall.Do0(ctx, x.p, func() error { return x.s.Drop(ctx, key, token) })
}

type reaperSource struct {
	s contract.ReaperSource
	p storecall.Policy
}

func (x reaperSource) ReclaimCandidates(ctx context.Context, now int64, limit int) ([]contract.Candidate, error) {
	return storecall.Do(ctx, x.p, func() ([]contract.Candidate, error) { return x.s.ReclaimCandidates(ctx, now, limit) })
}

func (x reaperSource) PendingReclaims(ctx context.Context, limit int) ([]contract.InstanceRef, error) {
	return storecall.Do(ctx, x.p, func() ([]contract.InstanceRef, error) { return x.s.PendingReclaims(ctx, limit) })
}

func (x reaperSource) IdleInstances(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return storecall.Do(ctx, x.p, func() ([]contract.InstanceRef, error) { return x.s.IdleInstances(ctx, before, limit) })
}

func (x reaperSource) StopCandidates(ctx context.Context, before int64, limit int) ([]contract.InstanceRef, error) {
	return storecall.Do(ctx, x.p, func() ([]contract.InstanceRef, error) { return x.s.StopCandidates(ctx, before, limit) })
}

func (x reaperSource) StaleIntents(ctx context.Context, before int64, limit int) ([]contract.IntentRef, error) {
	return storecall.Do(ctx, x.p, func() ([]contract.IntentRef, error) { return x.s.StaleIntents(ctx, before, limit) })
}
