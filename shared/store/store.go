// Package store is the portable half of the store layer (docs/design.md §1, §2.1): it sits
// above the backends (memstore, dynamostore: the contract.Backend implementations below it
// in the folder tree) and below the operations (keeper, reaper). It holds what every
// backend would otherwise write again:
//
//   - the checks (scoped.go): a backend implements each store as a view of one tenant
//     and hands out the scoped face over it, which checks the context's tenant and every
//     id (contract.Scope), a log writer's cursor and batch and each call's other
//     arguments, so a view writes only its single-call primitives and the rules' fast
//     paths;
//   - the one retry policy (storecall), applied by Store to every single store call, so
//     no operation writes a retry wrapper of its own.
//
// What is retried is one call, repeated with the very same arguments and token. WithLock
// runs a caller's function and is never repeated whole: its own steps (acquire, renew,
// release) are the backend's lease loop's (shared/store/lease).
package store

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

// Store is a backend behind the retry policy. It implements contract.Backend; the optional
// capabilities are asked for with the accessors (RowIntentReader, …), which report whether
// the backend beneath has them.
type Store struct {
	b contract.Backend
	p storecall.Policy
}

// New puts b behind policy p (the caller's answers and exhaustion error, storecall.Policy).
func New(b contract.Backend, p storecall.Policy) Store { return Store{b: b, p: p} }

// Policy is the retry policy the store applies.
func (s Store) Policy() storecall.Policy { return s.p }

// Instances is the backend's instance map, each call retried.
func (s Store) Instances() contract.InstanceRows { return rows{s.b.Instances(), s.p} }

// Runs is the backend's fenced run store, each call retried.
func (s Store) Runs() contract.FencedRuns { return runs{s.b.Runs(), s.p} }

// Locks is unwrapped: WithLock runs fn, never repeated whole; shared/store/lease owns its steps.
func (s Store) Locks() contract.LockStore { return s.b.Locks() }

// Log is the backend's event log, each call retried.
func (s Store) Log() contract.EventLog { return eventLog{s.b.Log(), s.p} }

// Intents is the backend's intent store, each call retried.
func (s Store) Intents() contract.IntentStore { return intents{s.b.Intents(), s.p} }

// Reaper is the backend's cross-tenant discovery, each call retried.
func (s Store) Reaper() contract.ReaperSource { return reaperSource{s.b.Reaper(), s.p} }

// capability is b's optional capability C (a type assertion) behind wrap; ok=false: b has
// none, and the caller takes its fallback as it would without the layer.
func capability[C, W any](b any, wrap func(C) W) (w W, ok bool) {
	c, ok := b.(C)
	if !ok {
		return w, false
	}
	return wrap(c), true
}

// RowIntentReader is the backend's RowIntentReader, retried; ok=false: it has none.
func (s Store) RowIntentReader() (contract.RowIntentReader, bool) {
	return capability(s.b, func(r contract.RowIntentReader) contract.RowIntentReader { return rowIntent{r, s.p} })
}

// StateRowReader is the backend's StateRowReader, retried; ok=false: it has none.
func (s Store) StateRowReader() (contract.StateRowReader, bool) {
	return capability(s.b, func(r contract.StateRowReader) contract.StateRowReader { return stateRow{r, s.p} })
}

// RowsReader is the backend's RowsReader, retried; ok=false: it has none.
func (s Store) RowsReader() (contract.RowsReader, bool) {
	return capability(s.b, func(r contract.RowsReader) contract.RowsReader { return rowsReader{r, s.p} })
}

// RunLister is the backend's RunLister (on its Runs()), retried; ok=false: it has none.
func (s Store) RunLister() (contract.RunLister, bool) {
	return capability(s.b.Runs(), func(l contract.RunLister) contract.RunLister { return runLister{l, s.p} })
}

type rowIntent struct {
	r contract.RowIntentReader
	p storecall.Policy
}

func (x rowIntent) GetRowAndIntent(ctx context.Context, key string) (*contract.InstanceRow, *contract.Intent, error) {
	type both struct {
		row *contract.InstanceRow
		in  *contract.Intent
	}
	b, err := storecall.Do(ctx, x.p, func() (both, error) {
		row, in, err := x.r.GetRowAndIntent(ctx, key)
		return both{row, in}, err
	})
	return b.row, b.in, err
}

type stateRow struct {
	r contract.StateRowReader
	p storecall.Policy
}

func (x stateRow) GetStateAndRow(ctx context.Context, runID, key string) (*contract.RunState, *contract.InstanceRow, error) {
	type both struct {
		st  *contract.RunState
		row *contract.InstanceRow
	}
	b, err := storecall.Do(ctx, x.p, func() (both, error) {
		st, row, err := x.r.GetStateAndRow(ctx, runID, key)
		return both{st, row}, err
	})
	return b.st, b.row, err
}

type rowsReader struct {
	r contract.RowsReader
	p storecall.Policy
}

func (x rowsReader) GetRows(ctx context.Context, keys []string) (map[string]*contract.InstanceRow, error) {
	return storecall.Do(ctx, x.p, func() (map[string]*contract.InstanceRow, error) { return x.r.GetRows(ctx, keys) })
}

type runLister struct {
	l contract.RunLister
	p storecall.Policy
}

func (x runLister) ListRuns(ctx context.Context, f contract.RunFilter, after *contract.RunPos, limit int) (contract.RunPage, error) {
	return storecall.Do(ctx, x.p, func() (contract.RunPage, error) { return x.l.ListRuns(ctx, f, after, limit) })
}
