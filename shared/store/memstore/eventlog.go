package memstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The log is the slot chain of docs/design.md §3.1: items keyed by their first offset, each put only at a
// free slot, so slot contention is the fence. Kinds of item:
type itemKind uint8

const (
	kindEvents itemKind = iota // a batch chunk: epoch, events, digest
	kindFence                  // a new owner's marker: no lower epoch is stored after it
	kindCancel                 // the in-band cancel marker; prevEpoch = owner before it
	kindClose                  // the end of the log
	kindWatch                  // a subscriber's watch marker (docs/design.md §8.1); as kindCancel, without the cancel
)

// logItem is one slot. Every item records src, the highest Src stored up to it.
type logItem struct {
	first     int64
	kind      itemKind
	epoch     int64 // the writer's epoch; 0 on markers (owner gives theirs)
	prevEpoch int64 // markers: the epoch of the item before it (rule 2)
	sawCancel bool  // kindFence, kindWatch: put right after a pending cancel (pendingCancel)
	events    []contract.Event
	digest    string
	src       int64
	gcAt      int64
}

// next is the first offset after the item; markers occupy one offset.
func (it *logItem) next() int64 { return it.first + int64(max(1, len(it.events))) }

// marker reports an in-band marker: one offset, no event, written by no epoch.
func (it *logItem) marker() bool { return it.kind == kindCancel || it.kind == kindWatch }

// owner is the epoch that owns the log as of this item (rule 2 for markers).
func (it *logItem) owner() int64 {
	if it.marker() {
		return it.prevEpoch
	}
	return it.epoch
}

// pendingCancel reports a tail that a fence put after it must report as a cancel: a cancel
// marker, or watch markers right after one (they pass it on, so a watch never hides it).
func (it *logItem) pendingCancel() bool {
	return it.kind == kindCancel || it.kind == kindWatch && it.sawCancel
}

// logChain is one run's log.
type logChain struct {
	key   tkey // the run's key (its waiting readers are woken by every item stored)
	items map[int64]*logItem
	order []int64 // first offsets, ascending
}

func (c *logChain) at(off int64) *logItem { return c.items[off] }

func (c *logChain) tail() *logItem {
	if len(c.order) == 0 {
		return nil
	}
	return c.items[c.order[len(c.order)-1]]
}

// fits reports whether a new item may start at off: right after the item before it (or at
// 1), so offsets stay gapless and no item overlaps another. Cursors from results always
// fit; a hand-made one may not.
func (c *logChain) fits(off int64) bool {
	i, _ := slices.BinarySearch(c.order, off)
	if i == 0 {
		return off == 1
	}
	return c.items[c.order[i-1]].next() == off
}

func (c *logChain) put(it *logItem) {
	c.items[it.first] = it
	i, _ := slices.BinarySearch(c.order, it.first)
	c.order = slices.Insert(c.order, i, it.first)
}

func (c *logChain) dropExpired(now int64) {
	c.order = slices.DeleteFunc(c.order, func(off int64) bool {
		if it := c.items[off]; it.gcAt > 0 && it.gcAt <= now {
			delete(c.items, off)
			return true
		}
		return false
	})
}

// eventLog is the Store's contract.EventLog view.
type eventLog struct{ view }

var _ contract.EventLog = eventLog{}

// defaultReadLimit applies when Read is given a limit <= 0.
const defaultReadLimit = 1000

// chain returns the run's log, creating it empty. Call with s.mu held.
func (s *Store) chain(k tkey) *logChain {
	c := s.logs[k]
	if c == nil {
		c = &logChain{key: k, items: map[int64]*logItem{}}
		s.logs[k] = c
	}
	return c
}

// putItem stores it with its gcAt and wakes the run's waiting readers. Call with s.mu held.
func (s *Store) putItem(c *logChain, it *logItem) {
	it.gcAt = s.opts.now().Add(s.opts.logRetention).UnixMilli()
	c.put(it)
	s.wake(c.key)
	s.written()
}

// Append stores events at cursor at, chunked by contract.SplitEvents, one slot per chunk:
// a free slot takes the chunk; a cancel marker is noted and stepped over; a higher epoch
// is ErrSuperseded; a close is ErrLogClosed; the same epoch with the same digest is this
// batch's own ambiguous retry; the same epoch otherwise is ErrConflict. On a refusal the
// chunks already stored stay (they precede the fence).
func (g eventLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	k := g.key(runID)
	chunks := contract.SplitEvents(events)
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chain(k)
	cur, cancelled := at, false
	for _, chunk := range chunks {
		digest := contract.BatchDigest(cur.Epoch, chunk)
	slot:
		for {
			it := c.at(cur.Next)
			switch {
			case it == nil && !c.fits(cur.Next):
				return contract.AppendResult{}, contract.Invalid("cursor", "offset %d is not the start of a free slot", cur.Next)
			case it == nil:
				stored := &logItem{first: cur.Next, kind: kindEvents, epoch: cur.Epoch, digest: digest,
					events: make([]contract.Event, len(chunk)), src: contract.MaxSrc(cur.Src, chunk)}
				for i, e := range chunk {
					stored.events[i] = contract.Event{Offset: cur.Next + int64(i), Src: e.Src,
						Data: append(json.RawMessage(nil), e.Data...)}
				}
				s.putItem(c, stored)
				cur.Next, cur.Src = stored.next(), stored.src
				break slot
			case it.kind == kindClose:
				return contract.AppendResult{}, fmt.Errorf("memstore: append to %q at %d: %w", runID, cur.Next, contract.ErrLogClosed)
			case it.marker():
				cancelled = cancelled || it.kind == kindCancel
				cur.Next, cur.Src = it.next(), max(cur.Src, it.src)
			case it.epoch > cur.Epoch:
				return contract.AppendResult{}, fmt.Errorf("memstore: append to %q at %d: epoch %d found %d: %w",
					runID, cur.Next, cur.Epoch, it.epoch, contract.ErrSuperseded)
			case it.epoch < cur.Epoch:
				// Cannot happen while the three rules of docs/design.md §3.1 hold.
				return contract.AppendResult{}, fmt.Errorf("memstore: append to %q at %d: lower epoch %d found by %d: broken log invariant",
					runID, cur.Next, it.epoch, cur.Epoch)
			case it.kind == kindEvents && it.digest == digest:
				cur.Next, cur.Src = it.next(), it.src // our own landed attempt
				break slot
			default:
				return contract.AppendResult{}, fmt.Errorf("memstore: append to %q at %d: slot holds another batch of epoch %d: %w",
					runID, cur.Next, cur.Epoch, contract.ErrConflict)
			}
		}
	}
	return contract.AppendResult{Cursor: cur, Last: cur.Next - 1, CancelRequested: cancelled, Src: cur.Src}, nil
}

// Fence makes epoch the log's owner by putting a fence item at the first free offset,
// refusing when the tail belongs to a higher epoch (ErrSuperseded) or is a close
// (ErrLogClosed); a tail fence of the same epoch is this call's own retried fence.
func (g eventLog) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	k := g.key(runID)
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chain(k)
	f := &logItem{first: 1, kind: kindFence, epoch: epoch}
	if t := c.tail(); t != nil {
		switch {
		case t.kind == kindClose:
			return contract.AppendResult{}, fmt.Errorf("memstore: fence %q: %w", runID, contract.ErrLogClosed)
		case t.owner() > epoch:
			return contract.AppendResult{}, fmt.Errorf("memstore: fence %q: epoch %d, log owned by %d: %w",
				runID, epoch, t.owner(), contract.ErrSuperseded)
		case t.kind == kindFence && t.epoch == epoch:
			f = t // rule 1: our own retried fence
		default:
			f.first, f.src, f.sawCancel = t.next(), t.src, t.pendingCancel()
			s.putItem(c, f)
		}
	} else {
		s.putItem(c, f)
	}
	return contract.AppendResult{
		Cursor:          contract.Cursor{Epoch: epoch, Next: f.next(), Src: f.src},
		Last:            f.first,
		CancelRequested: f.sawCancel,
		Src:             f.src,
	}, nil
}

// Read returns whole items after offset after: the first events item however large, then
// more while they fit in limit events; markers are skipped. Reaching a close reports
// closed; a read that reaches the tail of a terminal run's unclosed log with nothing new
// closes it under the run's epoch and reports closed. next is the last offset consumed.
func (g eventLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	k := g.key(runID)
	if limit <= 0 {
		limit = defaultReadLimit
	}
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out, next, size := []contract.Event{}, after, 0
	c := s.logs[k]
	var tail *logItem
	if c != nil {
		tail = c.tail()
		// Start at the item holding offset after+1, so an after inside an item still
		// yields that item's remaining events.
		i, found := slices.BinarySearch(c.order, after+1)
		if !found && i > 0 {
			i--
		}
		for _, off := range c.order[i:] {
			it := c.items[off]
			if it.next()-1 <= after {
				continue // entirely at or before after
			}
			switch it.kind {
			case kindClose:
				return out, max(next, it.first-1), true, nil
			case kindFence, kindCancel, kindWatch:
				next = max(next, it.first)
			case kindEvents:
				var evs []contract.Event
				for _, e := range it.events {
					if e.Offset > after {
						evs = append(evs, e)
					}
				}
				n := contract.PageBytes(evs)
				if len(out) > 0 && (len(out)+len(evs) > limit || size+n > contract.MaxPageBytes) {
					return out, next, false, nil
				}
				size += n
				for _, e := range evs {
					e.Data = append(json.RawMessage(nil), e.Data...)
					out = append(out, e)
				}
				next = it.next() - 1
			}
		}
	}
	// Only a read that finds nothing new closes (as dynamostore does, to spare a run read
	// per page): the reader holding the last events learns of the close on its next read.
	r := s.runs[k]
	if len(out) > 0 || r == nil || !r.st.Status.Terminal() {
		return out, next, false, nil
	}
	cl := &logItem{first: 1, kind: kindClose, epoch: r.st.Epoch()}
	if tail != nil {
		// Never a lower epoch after a higher one, even for a run whose epoch lags its log.
		cl.first, cl.epoch, cl.src = tail.next(), max(cl.epoch, tail.owner()), tail.src
	}
	s.putItem(s.chain(k), cl)
	return out, max(next, cl.first-1), true, nil
}

// Close puts a close item under at.Epoch at the cursor, stepping past that epoch's own
// items and cancel markers; a higher epoch found is ErrSuperseded and changes nothing; a
// close already there (by at.Epoch or lower) is success.
func (g eventLog) Close(ctx context.Context, runID string, at contract.Cursor) error {
	k := g.key(runID)
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chain(k)
	cur := at
	for {
		it := c.at(cur.Next)
		switch {
		case it == nil && !c.fits(cur.Next):
			return contract.Invalid("cursor", "offset %d is not the start of a free slot", cur.Next)
		case it == nil:
			s.putItem(c, &logItem{first: cur.Next, kind: kindClose, epoch: at.Epoch, src: cur.Src})
			return nil
		case it.kind == kindClose && it.epoch <= at.Epoch:
			return nil
		case it.owner() > at.Epoch:
			return fmt.Errorf("memstore: close %q: epoch %d, log owned by %d: %w", runID, at.Epoch, it.owner(), contract.ErrSuperseded)
		case it.marker() || it.epoch == at.Epoch:
			cur.Next, cur.Src = it.next(), max(cur.Src, it.src)
		default:
			return fmt.Errorf("memstore: close %q at %d: lower epoch %d found by %d: broken log invariant",
				runID, cur.Next, it.epoch, at.Epoch)
		}
	}
}

// MarkCancel puts the in-band cancel marker at the first free offset, recording the epoch
// before it; a pending cancel at the tail is success; a closed log is ErrLogClosed.
func (g eventLog) MarkCancel(ctx context.Context, runID string) error {
	return g.mark(ctx, runID, kindCancel)
}

// MarkWatch puts a watch marker at the first free offset, as MarkCancel does, but always
// a new one: the subscriber that calls it needs a marker put after its own subscription.
func (g eventLog) MarkWatch(ctx context.Context, runID string) error {
	return g.mark(ctx, runID, kindWatch)
}

// mark is MarkCancel and MarkWatch: a marker of kind at the first free offset, recording
// the epoch before it (and, on a watch marker, a pending cancel it follows).
func (g eventLog) mark(ctx context.Context, runID string, kind itemKind) error {
	k := g.key(runID)
	s := g.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chain(k)
	m := &logItem{first: 1, kind: kind}
	if t := c.tail(); t != nil {
		switch {
		case t.kind == kindClose:
			return fmt.Errorf("memstore: marker on %q: %w", runID, contract.ErrLogClosed)
		case kind == kindCancel && t.pendingCancel():
			return nil
		}
		m.first, m.prevEpoch, m.src, m.sawCancel = t.next(), t.owner(), t.src, kind == kindWatch && t.pendingCancel()
	}
	s.putItem(c, m)
	return nil
}
