package memstore

import (
	"cmp"
	"reflect"
	"slices"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// ixName names one of the store's sparse indexes. Like DynamoDB GSIs they are for
// discovery only: every decision re-reads the base item.
type ixName uint8

const (
	ixKeyRef  ixName = iota // non-terminal runs by stamped sandboxKey (in-use check)
	ixReclaim               // running runs by contract.ReclaimAt (reaper candidates)
	ixIdle                  // instance rows by updatedAt
	ixPending               // instance rows with a pending reclaim
	ixIntent                // open intents by createdAt
	ixStop                  // running or stopping instance rows by idleSince
)

// ixEntry is one index entry: its sort value and a reference (the sandbox key of ixKeyRef).
type ixEntry struct {
	sort int64
	ref  string
}

type ixKey struct {
	name ixName
	item tkey
}

// ixChange undoes one index change: prev is the entry before it (nil = absent).
type ixChange struct {
	tick int64
	key  ixKey
	prev *ixEntry
}

// indexes keeps the current entries and, when lagging, the changes of the last lag ticks,
// so a query can roll the index back to how it stood lag ticks ago.
type indexes struct {
	lag   int64
	clock int64
	cur   map[ixName]map[tkey]ixEntry
	hist  []ixChange
}

func newIndexes(lag int) indexes {
	return indexes{lag: int64(lag), cur: map[ixName]map[tkey]ixEntry{}}
}

// set makes item's entry in index name e (nil removes it), remembering the previous entry
// for lagged reads.
func (x *indexes) set(name ixName, item tkey, e *ixEntry) {
	m := x.cur[name]
	if m == nil {
		m = map[tkey]ixEntry{}
		x.cur[name] = m
	}
	old, had := m[item]
	if (e == nil && !had) || (e != nil && had && reflect.DeepEqual(old, *e)) {
		return
	}
	if x.lag > 0 {
		var prev *ixEntry
		if had {
			prev = &old
		}
		x.hist = append(x.hist, ixChange{tick: x.clock, key: ixKey{name, item}, prev: prev})
	}
	if e == nil {
		delete(m, item)
	} else {
		m[item] = *e
	}
}

// tick advances the lag clock and forgets changes older than the lag.
func (x *indexes) tick() {
	x.clock++
	cut := 0
	for cut < len(x.hist) && x.hist[cut].tick < x.clock-x.lag {
		cut++
	}
	if cut > 0 {
		x.hist = slices.Delete(x.hist, 0, cut)
	}
}

// view calls fn for every entry of index name as it stood lag ticks ago.
func (x *indexes) view(name ixName, fn func(item tkey, e ixEntry)) {
	var undo map[tkey]*ixEntry
	for i := len(x.hist) - 1; i >= 0; i-- {
		c := x.hist[i]
		if c.key.name != name || c.tick < x.clock-x.lag {
			continue
		}
		if undo == nil {
			undo = map[tkey]*ixEntry{}
		}
		undo[c.key.item] = c.prev // walking backwards: the oldest prev wins
	}
	for item, e := range x.cur[name] {
		if _, rolled := undo[item]; !rolled {
			fn(item, e)
		}
	}
	for item, e := range undo {
		if e != nil {
			fn(item, *e)
		}
	}
}

// hit is one index query result before projection.
type hit struct {
	item tkey
	e    ixEntry
}

// query returns the lagged entries of name accepted by keep, sorted by (sort, tenant, id),
// at most limit of them (limit <= 0: all). It ticks the lag clock after answering, so a
// poller converges. Call with s.mu held.
func (x *indexes) query(name ixName, keep func(tkey, ixEntry) bool, limit int) []hit {
	var out []hit
	x.view(name, func(item tkey, e ixEntry) {
		if keep(item, e) {
			out = append(out, hit{item, e})
		}
	})
	slices.SortFunc(out, func(a, b hit) int {
		return cmp.Or(cmp.Compare(a.e.sort, b.e.sort), cmp.Compare(a.item.tenant, b.item.tenant),
			cmp.Compare(a.item.id, b.item.id))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	x.tick()
	return out
}

// reindexRun recomputes the run's index entries from its state (docs/design.md §3.1: every write
// maintains the helpers); r == nil removes them. Call with s.mu held.
func (s *Store) reindexRun(k tkey, r *runItem) {
	var keyRef, reclaim *ixEntry
	if r != nil {
		st := r.st
		if !st.Status.Terminal() && st.SandboxKey != nil {
			keyRef = &ixEntry{ref: *st.SandboxKey}
		}
		if at, ok := contract.ReclaimAt(st, s.opts.driverLeaseMs); ok {
			reclaim = &ixEntry{sort: at}
		}
	}
	s.idx.set(ixKeyRef, k, keyRef)
	s.idx.set(ixReclaim, k, reclaim)
}

// reindexInstance recomputes the row's index entries; row == nil removes them.
func (s *Store) reindexInstance(k tkey, row *contract.InstanceRow) {
	var idle, pending, stop *ixEntry
	if row != nil {
		idle = &ixEntry{sort: row.UpdatedAt}
		if row.IdleSince != 0 && row.Reclaiming == "" {
			stop = &ixEntry{sort: row.IdleSince}
		}
		switch {
		case row.Reclaiming != "":
			pending = &ixEntry{sort: row.UpdatedAt}
		case row.ReclaimDue != 0:
			pending = &ixEntry{sort: row.ReclaimDue}
		case len(row.StaleSnapshots) > 0:
			pending = &ixEntry{sort: row.UpdatedAt}
		}
	}
	s.idx.set(ixIdle, k, idle)
	s.idx.set(ixPending, k, pending)
	s.idx.set(ixStop, k, stop)
}

// reindexIntent recomputes the intent's index entry; in == nil removes it.
func (s *Store) reindexIntent(k tkey, in *contract.Intent) {
	var e *ixEntry
	if in != nil {
		e = &ixEntry{sort: in.CreatedAt}
	}
	s.idx.set(ixIntent, k, e)
}
