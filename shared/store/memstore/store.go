// Package memstore is sandkeep's in-memory backend (docs/design.md §1, §2): every contract of
// shared/contract held in process, the embedded default of `sandkeep dev`. It models the
// DynamoDB design of docs/design.md §3.1 (slot-chain event log, epoch fences, lease items, sparse indexes)
// closely enough that both backends pass the same conformance suites, and can emulate
// lagging indexes (WithIndexLag) so suites prove that a stale index hit is never acted on.
//
// One mutex guards all state but the lock leases (Leases, a table of its own); no critical
// section blocks, sleeps or calls out.
package memstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store"
	"github.com/sandkeep/sandkeep/shared/store/wakeset"
)

// Option configures a Store.
type Option func(*options)

type options struct {
	indexLag      int
	driverLeaseMs int64
	lock          contract.LockTiming
	now           func() time.Time
	logRetention  time.Duration
	leases        Leases
}

// WithIndexLag makes the index-backed queries (RunsUsingKey, ListReclaimable and the four
// ReaperSource methods) serve the index as it was n ticks ago: a removed entry lingers and
// a new or changed one shows up late. Every write is a tick, and so is every index query
// (after it is answered), so a caller polling an index converges within n polls.
func WithIndexLag(n int) Option {
	return func(o *options) { o.indexLag = max(n, 0) }
}

// WithDriverLease sets the driver lease reclaimAt is derived with (contract.ReclaimAt: the
// expiry of runs never leased, and the step a lease's end is rounded up to); the keeper's
// own (default contract.DefaultDriverLease).
func WithDriverLease(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.driverLeaseMs = d.Milliseconds()
		}
	}
}

// WithLockTiming sets the lock lease, renew period and skew; zero fields take the defaults.
func WithLockTiming(t contract.LockTiming) Option {
	return func(o *options) { o.lock = t.WithDefaults() }
}

// WithClock sets the wall clock used for stored timestamps such as gcAt (default
// time.Now). Lock leases always run on the monotonic clock.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

// WithLogRetention sets how long log items are kept (gcAt = write + retention; runs are
// kept a day past their log). It must exceed the longest run (default 30 days).
func WithLogRetention(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.logRetention = d
		}
	}
}

// tkey is a tenant-scoped key: every map of the store is keyed by one.
type tkey struct {
	tenant string
	id     string
}

// Store is an in-memory contract.Backend; safe for concurrent use.
type Store struct {
	opts options

	mu        sync.Mutex
	instances map[tkey]*contract.InstanceRow
	runs      map[tkey]*runItem
	byThread  map[tkey]map[string]struct{} // thread → run ids (consistent, not an index)
	logs      map[tkey]*logChain
	intents   map[tkey]*contract.Intent
	waiters   wakeset.Set[tkey] // readers waiting for a run's log (LogChanged)
	idx       indexes
	lastGC    time.Time
	push      pushState // the deployed push's connections and subscriptions (push.go)
	faces               // Instances(), Runs(), …: the scoped faces over its views (stores)
}

var _ contract.Backend = (*Store)(nil)

// New returns an empty Store.
func New(opts ...Option) *Store {
	o := options{
		driverLeaseMs: contract.DefaultDriverLease,
		lock:          contract.LockTiming{}.WithDefaults(),
		now:           time.Now,
		logRetention:  30 * 24 * time.Hour,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.leases == nil {
		o.leases = NewLeases()
	}
	s := &Store{
		opts:      o,
		instances: map[tkey]*contract.InstanceRow{},
		runs:      map[tkey]*runItem{},
		byThread:  map[tkey]map[string]struct{}{},
		logs:      map[tkey]*logChain{},
		intents:   map[tkey]*contract.Intent{},
		idx:       newIndexes(o.indexLag),
	}
	s.faces = s.stores()
	return s
}

// faces is embedded unexported: a Store's stores are read through their accessors only.
type faces = store.Stores

// stores builds the Store's stores once: each its view of one tenant behind
// shared/store's scoped face, which checks the context's tenant, the ids and the
// arguments before the view is asked. Runs carries the reference's unfenced writes
// (contract.RunWriter) and the run listing (contract.RunLister); Locks is a
// contract.LeaseLocks too.
func (s *Store) stores() store.Stores {
	runs := func(t string) fencedRuns { return fencedRuns{view{s, t}} }
	return store.NewStores(
		store.ScopedInstances(func(t string) instanceRows { return instanceRows{view{s, t}} }),
		struct {
			contract.FencedRuns
			contract.RunWriter
			contract.RunLister
		}{store.ScopedRuns(runs), store.ScopedRunWriter(runs), store.ScopedRunLister(runs)},
		store.ScopedLocks(func(t string) lockStore { return lockStore{view{s, t}} }),
		store.ScopedLog(func(t string) eventLog { return eventLog{view{s, t}} }),
		store.ScopedIntents(func(t string) intentStore { return intentStore{view{s, t}} }))
}

// Reaper returns the cross-tenant reaper source.
func (s *Store) Reaper() contract.ReaperSource { return reaperSource{s} }

// scope validates the tenant of ctx and the id, returning the tenant-scoped key. It first
// yields the processor, as a round trip to a real store would, so concurrent callers
// interleave and concurrency tests exercise their races instead of running serially.
func scope(ctx context.Context, field, id string) (tkey, error) {
	t, err := contract.Scope(ctx, field, id)
	return scoped(t, id, err)
}

// scoped is id's key in tenant t once its checks passed (err nil), after a yield (scope).
func scoped(t, id string, err error) (tkey, error) {
	runtime.Gosched()
	if err != nil {
		return tkey{}, err
	}
	return tkey{tenant: t, id: id}, nil
}

// view is the store seen by one tenant. Its calls come checked (shared/store's scoped
// faces), so it needs no scope of its own.
type view struct {
	s      *Store
	tenant string
}

// key is id's key in the view's tenant, after a yield (scope).
func (v view) key(id string) tkey {
	runtime.Gosched()
	return tkey{tenant: v.tenant, id: id}
}

// load returns a copy of what m holds at k; missing: (nil, nil). Only for values without
// pointers (instance rows, intents), so the copy never aliases.
func load[V any](s *Store, m map[tkey]*V, k tkey) (*V, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := m[k]
	if cur == nil {
		return nil, nil
	}
	out := *cur
	return &out, nil
}

// written marks the end of one mutating call: it advances the index lag clock and, at
// most once a minute, drops items whose gcAt has passed. Call with s.mu held.
func (s *Store) written() {
	s.idx.tick()
	now := s.opts.now()
	if now.Sub(s.lastGC) < time.Minute {
		return
	}
	s.lastGC = now
	s.collect(now.UnixMilli())
}

// collect emulates DynamoDB TTL: log items and terminal runs past their gcAt vanish.
// Correctness never depends on it; it only bounds memory. Call with s.mu held.
func (s *Store) collect(now int64) {
	for k, c := range s.logs {
		c.dropExpired(now)
		if len(c.order) == 0 {
			delete(s.logs, k)
		}
	}
	for k, r := range s.runs {
		if r.gcAt > 0 && r.gcAt <= now {
			s.deleteRun(k)
		}
	}
}

// randomToken returns 128 random bits as hex.
func randomToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand.Read crashes the program instead
	return hex.EncodeToString(b[:])
}
