package contract

import "context"

// Backend is the contract a sandkeep backend implements (docs/design.md §10): only what the
// operations (keeper, reaper, bench) call, one accessor per capability. memstore and
// dynamostore implement it; shared/testkit.RunAll proves an implementation in one call.
// Every store but Reaper is scoped by the context's tenant: a backend builds it as
// shared/store's scoped face over its views of one tenant, so it checks nothing itself.
//
// The reference's store interfaces (InstanceStore, RunStore, ThreadLister,
// ReclaimableLister) are not part of it: shared/contract/refstore builds them on top of a
// Backend, for parity with the reference.
type Backend interface {
	// Instances is the conditional instance map (docs/design.md §2.1).
	Instances() InstanceRows
	// Runs is the fenced run store (docs/design.md §2.2).
	Runs() FencedRuns
	// Locks is the per-key lease lock (docs/design.md §2.3).
	Locks() LockStore
	// Log is the runs' epoch-fenced event logs (docs/design.md §2.4).
	Log() EventLog
	// Intents keeps the resolve intents (docs/design.md §2.7).
	Intents() IntentStore
	// Reaper is the cross-tenant discovery of work for the reaper (docs/design.md §2.7).
	Reaper() ReaperSource
}

// Optional capabilities. Each is detected by a type assertion (on the Backend, or on
// Backend.Runs() for RunLister and RunWriter); a backend without one is served by the
// contract alone (more calls, or ErrUnsupported where nothing else can answer), and
// testkit reports an absent one by name instead of passing it silently.

// RowIntentReader: one consistent read of a key's instance row and open intent — one
// BatchGetItem on DynamoDB instead of two GetItems under the sandbox lock
// (docs/design.md §11).
type RowIntentReader interface {
	// GetRowAndIntent returns key's row and open intent, read consistently; missing: nil.
	GetRowAndIntent(ctx context.Context, key string) (*InstanceRow, *Intent, error)
}

// StateRowReader: one consistent read of a run's state and an instance row — attach's
// BatchGetItem (docs/design.md §4.2).
type StateRowReader interface {
	// GetStateAndRow returns the run's state and key's row, read consistently; missing: nil.
	GetStateAndRow(ctx context.Context, runID, key string) (*RunState, *InstanceRow, error)
}

// RowsReader: the instance rows of a few keys in one consistent read.
type RowsReader interface {
	// GetRows returns the rows of keys that exist, by key (missing keys are absent).
	GetRows(ctx context.Context, keys []string) (map[string]*InstanceRow, error)
}

// RunLister (on Backend.Runs()): a tenant's runs for display.
type RunLister interface {
	// ListRuns returns up to limit (1..MaxListLimit) runs of the caller's tenant matching f,
	// newest first, strictly after after (nil: from the newest). Served from an index that
	// may lag — a listing for display, never a decision — but every run returned was
	// re-read from its item and matches f.
	ListRuns(ctx context.Context, f RunFilter, after *RunPos, limit int) (RunPage, error)
}

// LogWaker: it wakes a run's long polls in-process when the run's log may have changed, so
// a waiting reader reads again only then instead of polling. memstore provides it; a
// backend without it (DynamoDB, shared by replicas that cannot signal each other) is
// polled at a bounded rate (see keeper.Read).
type LogWaker interface {
	// LogChanged returns a channel closed at the first change after the call to runID's log
	// (an item stored: events, a cancel marker, a close) or to the run's status becoming
	// terminal, in the context's tenant; stop releases it and must be called.
	LogChanged(ctx context.Context, runID string) (changed <-chan struct{}, stop func(), err error)
}

// RunWriter (on Backend.Runs()): the reference run store's unfenced writes. No operation
// calls them — every driver write is fenced (docs/design.md §2.2) — but refstore.Runs needs
// them for the reference's run store, and tests build runs in any state with them.
type RunWriter interface {
	// CreateOrResume inserts the run only if absent; an existing run is returned unchanged
	// (a finished run is never revived).
	CreateOrResume(ctx context.Context, in NewRun) (RunRecord, error)
	// Update applies p; an unknown run is a silent no-op and an empty patch does nothing.
	Update(ctx context.Context, runID string, p RunPatch) error
}
