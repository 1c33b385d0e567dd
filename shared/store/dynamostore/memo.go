package dynamostore

import (
	"strconv"
	"sync"
)

// maxMemo bounds a memo; when full it starts over (a miss costs a call more, never a
// wrong answer).
const maxMemo = 4096

// memo is a bounded map of what a store learned from its own calls, kept only to save a
// call: nothing is decided from it. Safe for concurrent use.
type memo[V any] struct {
	mu sync.Mutex
	m  map[string]V
}

func (m *memo[V]) put(k string, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil || len(m.m) >= maxMemo {
		m.m = make(map[string]V, 64)
	}
	m.m[k] = v
}

func (m *memo[V]) get(k string) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.m[k]
	return v, ok
}

func (m *memo[V]) drop(k string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, k)
}

// itemEnds remembers log offsets at which an item is known to end — a fact that never
// changes, since items are immutable — so a reader polling at the tail after a
// multi-event item needs no backward query to place its offset.
type itemEnds struct{ memo[struct{}] }

func itemEndKey(pk string, off int64) string { return pk + "\x00" + strconv.FormatInt(off, 10) }

// add records that an item of log pk ends at off.
func (e *itemEnds) add(pk string, off int64) { e.put(itemEndKey(pk, off), struct{}{}) }

// has reports whether an item of log pk is known to end at off.
func (e *itemEnds) has(pk string, off int64) bool {
	_, ok := e.get(itemEndKey(pk, off))
	return ok
}
