package contract

import "context"

// Intent records that a starter, holding the lock on sandbox:<key>, is about to create (or
// has created) a provider sandbox not yet written to the instance row (docs/design.md §2.7). An open
// intent found later is resumed before anyone creates again, so a crash cannot orphan it.
type Intent struct {
	Key               string `json:"key"`
	Token             int64  `json:"token"`                       // the creator's lock fence
	ProviderSandboxID string `json:"providerSandboxId,omitempty"` // "" until recorded
	CreatedAt         int64  `json:"createdAt"`
}

// IntentStore keeps resolve intents, scoped by the context's tenant, addressed by key.
type IntentStore interface {
	// Put opens an intent for key with token, replacing one with a lower token; an intent
	// with a higher token is ErrConflict; the same token again is success (a retry).
	Put(ctx context.Context, key string, token, now int64) error
	// Record sets the created sandbox id on the intent only while it carries token; else
	// ErrConflict.
	Record(ctx context.Context, key string, token int64, psid string) error
	// Get returns the open intent of key; none: (nil, nil).
	Get(ctx context.Context, key string) (*Intent, error)
	// Drop removes the intent only while it carries token; a missing intent is success;
	// another token is ErrConflict.
	Drop(ctx context.Context, key string, token int64) error
}

// Candidate is a run the reaper may act on, with its tenant.
type Candidate struct {
	Tenant    string `json:"tenant"`
	RunID     string `json:"runId"`
	ReclaimAt int64  `json:"reclaimAt"`
}

// InstanceRef names an instance row across tenants.
type InstanceRef struct {
	Tenant    string `json:"tenant"`
	Key       string `json:"key"`
	UpdatedAt int64  `json:"updatedAt"`
}

// IntentRef names an open intent across tenants.
type IntentRef struct {
	Tenant    string `json:"tenant"`
	Key       string `json:"key"`
	CreatedAt int64  `json:"createdAt"`
}

// ReaperSource is the reaper's cross-tenant discovery (docs/design.md §2.7), served by global indexes
// that may lag: every hit is re-read under its tenant before anything acts on it.
type ReaperSource interface {
	// ReclaimCandidates returns up to limit running runs with reclaimAt <= now, ascending
	// reclaimAt (cancelled runs have 0, so they come first).
	ReclaimCandidates(ctx context.Context, now int64, limit int) ([]Candidate, error)
	// PendingReclaims returns up to limit instance rows carrying a reclaim token, a
	// deferred reclaim (deferred ones by reclaimDue, so the due ones come first) or stale
	// snapshots.
	PendingReclaims(ctx context.Context, limit int) ([]InstanceRef, error)
	// IdleInstances returns up to limit instance rows with updatedAt <= before, oldest first.
	IdleInstances(ctx context.Context, before int64, limit int) ([]InstanceRef, error)
	// StopCandidates returns up to limit instance rows with idleSince <= before (running or
	// stopping, no pending reclaim), oldest idleSince first; InstanceRef.UpdatedAt carries
	// the idleSince listed.
	StopCandidates(ctx context.Context, before int64, limit int) ([]InstanceRef, error)
	// StaleIntents returns up to limit open intents with createdAt <= before, oldest first.
	StaleIntents(ctx context.Context, before int64, limit int) ([]IntentRef, error)
}
