package push

import (
	"slices"
	"sync"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// DefaultCachedRuns bounds the runs whose subscriptions a Deliverer keeps.
const DefaultCachedRuns = 1024

// subsCache keeps, per run, the subscriptions of this process's last consistent Query and
// upTo, an offset every subscription missing from that list has its watch marker above
// (docs/design.md §8.1). It holds when set: the Query was made after the write that
// occupied upTo, so a subscription it missed was written after it, and its marker, put
// after the subscription at the first free offset, lies above upTo. It holds on: a write
// that occupied upTo+1..Last with events only (a Landing with Events, After == upTo) put
// no marker there, so those markers lie above Last too — upTo becomes Last. Its use: such
// a write's events were all stored before any marker above Last, so a subscriber missing
// from the list read them in its catch-up (which follows its marker), and the list is
// every subscriber the write must be posted to. Any other landing lists again.
type subsCache struct {
	mu   sync.Mutex
	max  int
	runs map[keeper.RunKey]*subsEntry
}

type subsEntry struct {
	subs []contract.Subscription
	upTo int64
}

func newSubsCache(max int) *subsCache {
	return &subsCache{max: max, runs: map[keeper.RunKey]*subsEntry{}}
}

// take returns the run's subscriptions for l when the entry answers for it (l's events
// fill upTo+1..l.Last), moving upTo to l.Last; ok is false when a Query must list them.
func (c *subsCache) take(key keeper.RunKey, l keeper.Landing) (subs []contract.Subscription, ok bool) {
	if l.Events == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.runs[key]
	if e == nil || e.upTo != l.After || l.Last < l.After {
		return nil, false
	}
	e.upTo = l.Last
	return slices.Clone(e.subs), true
}

// put records subs, listed by a consistent Query made after the write that occupied upTo.
func (c *subsCache) put(key keeper.RunKey, subs []contract.Subscription, upTo int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.runs[key]; !ok && len(c.runs) >= c.max {
		for k := range c.runs { // evict any: a run without an entry lists again
			delete(c.runs, k)
			break
		}
	}
	c.runs[key] = &subsEntry{subs: slices.Clone(subs), upTo: upTo}
}

// drop forgets the run (its log closed: nothing more to post).
func (c *subsCache) drop(key keeper.RunKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.runs, key)
}

// gone removes connID (answered 410 and removed with its subscriptions) from every entry
// of its tenant: a connection id never returns.
func (c *subsCache) gone(tenant, connID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.runs {
		if k.Tenant == tenant {
			e.subs = slices.DeleteFunc(e.subs, func(s contract.Subscription) bool { return s.ConnID == connID })
		}
	}
}
