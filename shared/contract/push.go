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
// offset delivered through, and which deliverer holds the right to post to it.
type Subscription struct {
	RunID  string `json:"runId"`
	ConnID string `json:"connId"`
	// Next is the log offset delivered through (an item boundary, as EventLog.Read's next).
	Next int64 `json:"next"`
	// Holder is the deliverer posting to it now ("" when free), until HeldUntil (wall ms).
	Holder    string `json:"holder,omitempty"`
	HeldUntil int64  `json:"heldUntil,omitempty"`
}

// PushStore keeps the deployed push's connections and subscriptions
// (docs/design.md §8.1 and §3.1). Connections are named by the push service's connection id; every other call is
// scoped by the context's tenant. One deliverer at a time holds a subscription and posts
// to it, so a watcher receives its events in order: a writer that finds it held flags it
// instead, and the holder reads again before it lets go.
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
	// Subscribe starts connID's subscription to runID after offset `after`, held by holder
	// until heldUntil (wall ms) so nothing is posted before the subscriber's own answer;
	// subscribing again restarts it. ErrConflict: the connection already holds max
	// subscriptions; ErrUnknownRun: connID is not open in the context's tenant.
	Subscribe(ctx context.Context, connID, runID string, after int64, holder string, heldUntil int64, max int) error
	// Unsubscribe ends connID's subscription to runID; holder, when not "", must still
	// hold it (else ErrConflict). Idempotent.
	Unsubscribe(ctx context.Context, connID, runID, holder string) error
	// Subscriptions lists runID's subscriptions, read consistently.
	Subscriptions(ctx context.Context, runID string) ([]Subscription, error)
	// Hold takes connID's subscription to runID for holder until heldUntil: when it is
	// free, its hold lapsed before now (wall ms), or holder holds it. ErrConflict when
	// another holds it or it does not exist.
	Hold(ctx context.Context, runID, connID, holder string, now, heldUntil int64) (Subscription, error)
	// Flag tells the subscription's holder that the log grew after its last read: its
	// release will fail until it has read again. ErrConflict when nobody holds it at now
	// (the caller holds it itself instead).
	Flag(ctx context.Context, runID, connID string, now int64) error
	// Advance records that holder delivered through next, renewing its hold until
	// heldUntil. With release it lets go instead, unless the subscription was flagged:
	// then the flag is cleared, the hold kept (until heldUntil) and flagged is true: read
	// again. ErrConflict: holder no longer holds it.
	Advance(ctx context.Context, runID, connID, holder string, next, heldUntil int64, release bool) (flagged bool, err error)
}
