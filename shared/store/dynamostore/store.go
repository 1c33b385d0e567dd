// Package dynamostore is sandkeep's DynamoDB single-table backend (docs/design.md §3): tenant-first
// keys, single-item conditional writes only, consistent reads for every decision, sparse
// indexes for discovery only, and no Scan.
//
// Items (pk / sk; the tenant never contains '#', so its prefix is unambiguous):
//
//	run       <tenant>#RUN#<runId>      RUN      record + leaseUntil, lapsed, providerSandboxId,
//	                                             ver, createToken, claimToken, index helpers, gcAt
//	instance  <tenant>#INST#<key>       INST     record + incarnation, reclaiming, helpers
//	lease     <tenant>#LOCK#<key>       LOCK     owner, expiresAt (wall ms), fence (never gcAt)
//	intent    <tenant>#INTENT#<key>     INTENT   token, createdAt, providerSandboxId, done, gcAt
//	log slot  <tenant>#LOG#<runId>      pad(first offset)   (log.go)
//
// Global secondary indexes (sparse; hash / range; projection):
//
//	activeByThread        activeThread=<tenant>#<thread> / threadSort   keys     running runs
//	runsByThread          byThread=<tenant>#<thread>     / threadSort   record   every run
//	runsByKey             keyRef=<tenant>#<sandboxKey>                  keys     non-terminal runs
//	reclaimCandidates     reclaimShard / reclaimAt (N)   tenant, runId           running runs (global)
//	instancesByUpdatedAt  idleShard / idleAt (N)         tenant, key             instance rows (global)
//	pendingReclaims       pendingShard / pendingAt (N)   tenant, key             tombstoned rows (global)
//	openIntents           intentShard / intentAt (N)     tenant, key             open intents (global)
//
// threadSort is sortInt(startedAt)#runId; global indexes spread over Shards partitions by a
// hash of (tenant, id) and are queried shard by shard. gcAt is epoch seconds (DynamoDB TTL);
// nothing depends on it having run.
package dynamostore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store"
)

// Config configures a Store. Client and Table are required.
type Config struct {
	Client Client
	Table  string
	// DriverLease is the driver lease reclaimAt is derived with (contract.ReclaimAt: the
	// expiry of runs never leased, and the step a lease's end is rounded up to); the
	// keeper's own (default 60 s).
	DriverLease time.Duration
	// Lock configures lock leases (defaults 15 s / 5 s / 1 s).
	Lock contract.LockTiming
	// LogRetention is how long log items are kept (gcAt); it must exceed the longest run
	// (default 30 days).
	LogRetention time.Duration
	// Now is the wall clock (default time.Now) of stored timestamps, the lease item's
	// expiresAt included; a holder's loss deadline always runs on the monotonic clock.
	Now func() time.Time
}

// Store is a DynamoDB-backed contract.Backend; safe for concurrent use.
type Store struct {
	cfg  Config
	ends itemEnds // log offsets known to end an item (see eventLog.Read)
	// steps holds, per run this store last wrote on a fast path, the reclaimAt a lease's
	// end left it at (a running, undetached run's): it tells a heartbeat whether its lease
	// crosses a step before it writes (fencedRuns.Heartbeat, learnStep).
	steps memo[int64]
	// absent is the condition attribute_not_exists(pk) of every put of a new item (runs,
	// instance rows, log slots), built once: it has no values.
	absent expression.Expression
	faces  // Instances(), Runs(), …: the scoped faces over its views (stores)
}

var _ contract.Backend = (*Store)(nil)

// New returns a Store over cfg; it panics on a missing Client or Table (a programming
// error caught at start).
func New(cfg Config) *Store {
	if cfg.Client == nil || cfg.Table == "" {
		panic(fmt.Sprintf("dynamostore.New: Client and Table are required (table %q)", cfg.Table))
	}
	if cfg.DriverLease <= 0 {
		cfg.DriverLease = contract.DefaultDriverLease * time.Millisecond
	}
	cfg.Lock = cfg.Lock.WithDefaults()
	if cfg.LogRetention <= 0 {
		cfg.LogRetention = 30 * 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	absent, err := expr(expression.NewBuilder().WithCondition(expression.AttributeNotExists(expression.Name(attrPK))))
	if err != nil {
		panic(err) // one fixed name always builds
	}
	s := &Store{cfg: cfg, absent: absent}
	s.faces = s.stores()
	return s
}

func (s *Store) nowMs() int64 { return s.cfg.Now().UnixMilli() }

// The stores: each is its view of one tenant behind shared/store's scoped face, which
// checks the context's tenant, the ids and the arguments before the view is asked.

// view is the table seen by one tenant; its calls come checked (shared/store).
type view struct {
	s      *Store
	tenant string
}

// faces is embedded unexported: a Store's stores are read through their accessors only.
type faces = store.Stores

// stores builds the Store's stores once. Runs carries the reference's unfenced writes and
// listings (contract.RunWriter, RunLister, ThreadLister, ReclaimableLister); Locks is a
// contract.LeaseLocks too.
func (s *Store) stores() store.Stores {
	runs := func(t string) fencedRuns { return fencedRuns{view{s, t}} }
	return store.NewStores(
		store.ScopedInstances(func(t string) instanceRows { return instanceRows{view{s, t}} }),
		struct {
			contract.FencedRuns
			contract.RunWriter
			contract.RunLister
			contract.ThreadLister
			contract.ReclaimableLister
		}{store.ScopedRuns(runs), store.ScopedRunWriter(runs), store.ScopedRunLister(runs),
			store.ScopedThreadLister(runs), store.ScopedReclaimableLister(runs)},
		store.ScopedLocks(func(t string) lockStore { return lockStore{view{s, t}} }),
		store.ScopedLog(func(t string) eventLog { return eventLog{view{s, t}} }),
		store.ScopedIntents(func(t string) intentStore { return intentStore{view{s, t}} }))
}

// Reaper returns the cross-tenant reaper source (docs/design.md §2.7). Its listings come from global
// indexes that may lag: callers re-read every hit under its tenant before acting on it.
func (s *Store) Reaper() contract.ReaperSource { return reaperSource{s: s} }

// readItem reads the item (tenant, kind, id) with a consistent read and decodes it; missing
// (or decoded as absent): (nil, nil). what names the kind in errors.
func readItem[T any](ctx context.Context, s *Store, tenant, kind, id, what string,
	decode func(map[string]types.AttributeValue) (*T, error)) (*T, error) {
	out, err := s.cfg.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.cfg.Table),
		Key:            itemKey(tenant, kind, id),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, fmt.Errorf("dynamostore: get %s %q: %w", what, id, err)
	}
	if out.Item == nil {
		return nil, nil
	}
	v, err := decode(out.Item)
	if err != nil {
		return nil, fmt.Errorf("dynamostore: %s %q: %w", what, id, err)
	}
	return v, nil
}

// settle finishes a conditional write on one item (err is its outcome): on a failed
// condition it re-reads the item and reports success when mine recognises it as this
// call's own landed write (a retry whose first attempt landed); else ErrConflict.
func settle[T any](err error, op, what, id string, reread func() (*T, error), mine func(*T) bool) error {
	switch {
	case err == nil:
		return nil
	case !isCondFailed(err):
		return fmt.Errorf("dynamostore: %s %s %q: %w", op, what, id, err)
	}
	cur, rerr := reread()
	switch {
	case rerr != nil:
		return rerr
	case mine(cur):
		return nil
	}
	return fmt.Errorf("dynamostore: %s %s %q: condition failed: %w", op, what, id, contract.ErrConflict)
}

// newToken returns a random per-call token (incarnations, claim and lock owners).
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand.Read crashes the program instead
	return hex.EncodeToString(b[:])
}
