package dynamostore

import (
	"strconv"
	"sync"
)

// maxItemEnds bounds itemEnds; when full it starts over (a miss costs one more Query).
const maxItemEnds = 4096

// itemEnds remembers log offsets at which an item is known to end — a fact that never
// changes, since items are immutable — so a reader polling at the tail after a
// multi-event item needs no backward query to place its offset. Safe for concurrent use.
type itemEnds struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func itemEndKey(pk string, off int64) string { return pk + "\x00" + strconv.FormatInt(off, 10) }

// add records that an item of log pk ends at off.
func (e *itemEnds) add(pk string, off int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil || len(e.m) >= maxItemEnds {
		e.m = make(map[string]struct{}, 64)
	}
	e.m[itemEndKey(pk, off)] = struct{}{}
}

// has reports whether an item of log pk is known to end at off.
func (e *itemEnds) has(pk string, off int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.m[itemEndKey(pk, off)]
	return ok
}
