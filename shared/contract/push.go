package contract

import (
	"context"
	"time"
)

// PushLifetime is how long a deployed push connection can live: API Gateway ends every
// WebSocket connection after two hours. Connection and subscription items expire (gcAt)
// an hour after it, and a tenant's connection slot is reusable once it has passed, so a
// lost $disconnect never holds a slot for good (docs/design.md §8.1).
const PushLifetime = 2 * time.Hour

// Subscription is one connection's subscription to a run on the deployed push: the
// offset it was subscribed after.
type Subscription struct {
	RunID  string `json:"runId"`
	ConnID string `json:"connId"`
	// Next is the log offset subscribed after (an item boundary, as EventLog.Read's next).
	Next int64 `json:"next"`
}

// PushScope is the prologue of every tenant-scoped PushStore call, every backend's: connID
// a valid store id, and the context's tenant with runID checked as Scope does; runID ""
// (a call about the connection alone) checks the tenant only.
func PushScope(ctx context.Context, connID, runID string) (tenant string, err error) {
	if err := CheckStoreID("connId", connID); err != nil {
		return "", err
	}
	if runID == "" {
		return Tenant(ctx)
	}
	return Scope(ctx, "runId", runID)
}

// PushStore keeps the deployed push's connections and subscriptions
// (docs/design.md §8.1 and §3.1). Connections are named by the push service's connection id; every other call is
// scoped by the context's tenant.
type PushStore interface {
	// Connect records connID as open in the context's tenant, taking one of the tenant's
	// at most max connection slots (a slot older than PushLifetime is free again); a full
	// tenant is ErrConflict. Connecting again is a no-op.
	Connect(ctx context.Context, connID string, max int) error
	// ConnectionTenant returns the tenant that opened connID; ok is false for none. It is
	// the one tenant-free read: a connection id is the push service's, never a client's.
	ConnectionTenant(ctx context.Context, connID string) (tenant string, ok bool, err error)
	// Disconnect removes connID (opened in the context's tenant), its subscriptions and its
	// slot; idempotent.
	Disconnect(ctx context.Context, connID string) error
	// Subscribe starts connID's subscription to runID after offset `after`; subscribing
	// again restarts it. ErrConflict: the connection already holds max subscriptions;
	// ErrUnknownRun: connID is not open in the context's tenant.
	Subscribe(ctx context.Context, connID, runID string, after int64, max int) error
	// Unsubscribe ends connID's subscription to runID. Idempotent.
	Unsubscribe(ctx context.Context, connID, runID string) error
	// Subscriptions lists runID's subscriptions, read consistently.
	Subscriptions(ctx context.Context, runID string) ([]Subscription, error)
}
