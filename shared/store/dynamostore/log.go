package dynamostore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/expression"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The event log of a run is a chain of slot items (docs/design.md §3.1): pk = <tenant>#LOG#<runId>,
// sk = the item's first offset, padded. An item occupies `count` consecutive offsets
// (events items one per event, markers one). Every writer puts only at its cursor's Next
// with attribute_not_exists(pk), so two writers meeting at one offset contend for one slot,
// and the loser reads the occupant to learn what happened. That contention is the fence:
// a lower epoch can only write at offsets before the first item of a higher epoch, because
// it meets that item at its own next offset and stops there.
//
// Three rules keep the chain ordered when responses are lost (docs/design.md §3.1): a Fence refuses when
// the tail belongs to a higher epoch and takes a tail fence of its own epoch as its own; a
// marker (cancel or watch) records the epoch of the item before it (prevEpoch), so the tail
// always names the current owner; Fence, MarkCancel and MarkWatch refuse on a closed tail.
//
// On ErrSuperseded in the middle of a split batch, the chunks stored before the refusal
// remain: they precede the higher epoch's first item, so readers see them in order before
// the successor's output, and the successor resumes the journal from the highest Src the
// log records (which includes them), so nothing is delivered twice.

// Item kinds.
const (
	slotEvents = "events"
	slotFence  = "fence"
	slotCancel = "cancel"
	slotClose  = "close"
	slotWatch  = "watch" // a subscriber's marker (docs/design.md §8.1): a cancel marker without the cancel
)

// Attribute names of log items. Event entries are maps {s: Src (absent when 0), d: data
// bytes}; the data is stored as binary because valid JSON may still hold invalid UTF-8.
const (
	attrLogKind      = "kind"
	attrLogEpoch     = "epoch"
	attrLogPrevEpoch = "prevEpoch"
	attrLogCount     = "count"
	attrLogDigest    = "digest"
	attrLogSrc       = "src"
	attrLogEvents    = "events"
	attrLogSawCancel = "sawCancel"
	logEvSrc         = "s"
	logEvData        = "d"
)

// logHeader is the projection of a slot without its events (a collision or tail check
// needs only the header).
func logHeader() expression.ProjectionBuilder {
	return expression.NamesList(expression.Name(attrPK), expression.Name(attrSK), expression.Name(attrLogKind),
		expression.Name(attrLogEpoch), expression.Name(attrLogPrevEpoch), expression.Name(attrLogCount),
		expression.Name(attrLogDigest), expression.Name(attrLogSrc), expression.Name(attrLogSawCancel))
}

// logMaxSteps bounds the slots one call may walk past or retry; every step is another
// writer's stored item, so reaching it means the chain is corrupt or a livelock.
const logMaxSteps = 10_000

// logDefaultReadLimit is the limit of a Read given none (limit <= 0).
const logDefaultReadLimit = 1000

// logMaxQueryItems caps the item limit of one read query (a page is also capped at 1 MB).
const logMaxQueryItems = 1000

// slotItem is the stored form of a slot: pk = the log's partition, sk = pad(first). The
// numbers a slot must carry are pointers, so a decoded item tells a missing one apart.
type slotItem struct {
	keyAttrs
	Kind      string      `dynamodbav:"kind"`
	Epoch     *int64      `dynamodbav:"epoch,omitempty"`     // all but markers
	PrevEpoch *int64      `dynamodbav:"prevEpoch,omitempty"` // markers
	Count     *int64      `dynamodbav:"count"`
	Digest    string      `dynamodbav:"digest,omitempty"`
	Src       *int64      `dynamodbav:"src"`
	SawCancel bool        `dynamodbav:"sawCancel,omitempty"`
	Events    []slotEvent `dynamodbav:"events,omitempty"`
	GCAt      int64       `dynamodbav:"gcAt,omitempty"`
}

// slotEvent is one entry of an events slot; the data is binary because valid JSON may
// still hold invalid UTF-8.
type slotEvent struct {
	Src  int64  `dynamodbav:"s,omitempty"`
	Data []byte `dynamodbav:"d"`
}

// slot is one decoded log item.
type slot struct {
	first     int64  // sk: the first offset it occupies
	kind      string // slotEvents, slotFence, slotCancel, slotClose, slotWatch
	epoch     int64  // writer epoch (absent on markers)
	prevEpoch int64  // markers: the epoch of the item before
	count     int64  // offsets occupied (1 for markers)
	digest    string // events: contract.BatchDigest of (epoch, events); watch: its call's token
	sawCancel bool   // fence: a cancel marker was met on the way to its slot; watch: see pendingCancel
	src       int64  // highest Src stored up to and including this item
	events    []contract.Event
}

// end is the last offset the item occupies.
func (x *slot) end() int64 { return x.first + x.count - 1 }

// marker reports an in-band marker (cancel or watch): one offset, no event, no epoch.
func (x *slot) marker() bool { return x.kind == slotCancel || x.kind == slotWatch }

// owner is the epoch that owned the log when the item was stored: a marker is written by
// nobody's epoch, so it names the epoch of the item before it (rule 2).
func (x *slot) owner() int64 {
	if x.marker() {
		return x.prevEpoch
	}
	return x.epoch
}

// pendingCancel reports a tail that a fence put after it must report as a cancel: a cancel
// marker, or watch markers right after one (they pass it on, so a watch never hides it).
func (x *slot) pendingCancel() bool {
	return x.kind == slotCancel || x.kind == slotWatch && x.sawCancel
}

type eventLog struct{ view }

var _ contract.EventLog = eventLog{}

func logPK(tenant, runID string) string { return partition(tenant, kindLog, runID) }

// pk is the partition key of the run's log in the view's tenant.
func (l eventLog) pk(runID string) string { return logPK(l.tenant, runID) }

// lowerEpochError reports the impossible: a lower epoch's item at a writer's own next
// offset. It is an internal error, never a sentinel, so nobody mistakes it for a refusal.
func lowerEpochError(x *slot, writer int64) error {
	return fmt.Errorf("dynamostore: log slot %d holds a %s of epoch %d below writer epoch %d: the chain is corrupt",
		x.first, x.kind, x.owner(), writer)
}

// Append stores events at cursor at, one conditional PutItem per deterministic chunk; a
// slot taken by a higher epoch is ErrSuperseded, by the same epoch's other batch
// ErrConflict, by a close ErrLogClosed; the same epoch's same batch is this call's own
// earlier attempt and counts as stored.
func (l eventLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	pk := l.pk(runID)
	chunks := contract.SplitEvents(events)
	cur, cancel := at, false
	for _, chunk := range chunks {
		x := &slot{
			first: cur.Next, kind: slotEvents, epoch: cur.Epoch, count: int64(len(chunk)),
			digest: contract.BatchDigest(cur.Epoch, chunk), events: chunk,
		}
		stored := false
		for step := 0; !stored; step++ {
			if step == logMaxSteps {
				return contract.AppendResult{}, fmt.Errorf("dynamostore: log append: %d slots walked without storing", step)
			}
			x.src = contract.MaxSrc(cur.Src, chunk)
			landed, err := l.put(ctx, pk, x)
			if err != nil {
				return contract.AppendResult{}, fmt.Errorf("dynamostore: log append: %w", err)
			}
			if landed {
				cur.Next, cur.Src, stored = x.end()+1, x.src, true
				break
			}
			occ, err := l.header(ctx, pk, x.first)
			if err != nil {
				return contract.AppendResult{}, fmt.Errorf("dynamostore: log append: %w", err)
			}
			switch {
			case occ == nil:
				// The occupant expired between the put and the read (gcAt): put again.
			case occ.kind == slotClose:
				return contract.AppendResult{}, contract.ErrLogClosed
			case occ.owner() > cur.Epoch:
				return contract.AppendResult{}, contract.ErrSuperseded
			case occ.marker():
				cancel = cancel || occ.kind == slotCancel
				cur.Next, cur.Src = occ.end()+1, max(cur.Src, occ.src)
				x.first = cur.Next
			case occ.owner() < cur.Epoch:
				return contract.AppendResult{}, lowerEpochError(occ, cur.Epoch)
			case occ.kind == slotEvents && occ.first == x.first && occ.digest == x.digest && occ.count == x.count:
				// Own ambiguous retry: the earlier attempt stored exactly this chunk here.
				cur.Next, cur.Src, stored = occ.end()+1, max(cur.Src, occ.src), true
			case occ.kind == slotEvents:
				return contract.AppendResult{}, contract.ErrConflict
			default:
				// This epoch's own fence (a retried Fence landed at a stale cursor): the
				// epoch already owns the log, so step past it.
				cur.Next, cur.Src = occ.end()+1, max(cur.Src, occ.src)
				x.first = cur.Next
			}
		}
	}
	return contract.AppendResult{Cursor: cur, Last: cur.Next - 1, CancelRequested: cancel, Src: cur.Src}, nil
}

// Fence makes epoch the log's owner with a fence item at the first free offset (rule 1: a
// higher-epoch tail refuses, a tail fence of the same epoch is its own retried fence; rule
// 3: a closed tail refuses); it returns the owner's cursor, the highest Src and whether a
// cancel marker was met (kept on the fence item, so a retried fence reports it too).
func (l eventLog) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	pk := l.pk(runID)
	cancel, requery := false, true
	var t *slot
	var err error
	for step := 0; step < logMaxSteps; step++ {
		if requery {
			if t, err = l.tail(ctx, pk); err != nil {
				return contract.AppendResult{}, fmt.Errorf("dynamostore: log fence: %w", err)
			}
		}
		x := &slot{first: 1, kind: slotFence, epoch: epoch, count: 1}
		if t != nil {
			switch {
			case t.kind == slotClose:
				return contract.AppendResult{}, contract.ErrLogClosed
			case t.owner() > epoch:
				return contract.AppendResult{}, contract.ErrSuperseded
			case t.kind == slotFence && t.epoch == epoch:
				return fenceResult(t), nil
			}
			cancel = cancel || t.pendingCancel()
			x.first, x.src = t.end()+1, t.src
		}
		x.sawCancel = cancel
		landed, err := l.put(ctx, pk, x)
		if err != nil {
			return contract.AppendResult{}, fmt.Errorf("dynamostore: log fence: %w", err)
		}
		if landed {
			return fenceResult(x), nil
		}
		// Collision: read the occupant. A lower epoch's item (or one that vanished) means
		// the tail moved on: query it again. Anything else is the new tail and is judged
		// by the checks above on the next turn (a marker is stepped past there, our own
		// landed attempt is recognised there).
		occ, err := l.header(ctx, pk, x.first)
		if err != nil {
			return contract.AppendResult{}, fmt.Errorf("dynamostore: log fence: %w", err)
		}
		t, requery = occ, occ == nil || !occ.marker() && occ.owner() < epoch
	}
	return contract.AppendResult{}, fmt.Errorf("dynamostore: log fence: %d collisions without storing", logMaxSteps)
}

func fenceResult(f *slot) contract.AppendResult {
	return contract.AppendResult{
		Cursor: contract.Cursor{Epoch: f.epoch, Next: f.end() + 1, Src: f.src},
		Last:   f.end(), CancelRequested: f.sawCancel, Src: f.src,
	}
}

// MarkCancel puts a cancel marker (recording the epoch before it) at the first free
// offset; a pending cancel at the tail is enough, and a closed tail is ErrLogClosed.
func (l eventLog) MarkCancel(ctx context.Context, runID string) error {
	return l.mark(ctx, runID, slotCancel)
}

// MarkWatch puts a watch marker at the first free offset, as MarkCancel does, but always a
// new one: its caller needs a marker put after its own subscription (docs/design.md §8.1).
func (l eventLog) MarkWatch(ctx context.Context, runID string) error {
	return l.mark(ctx, runID, slotWatch)
}

// mark is MarkCancel and MarkWatch: a marker of kind at the first free offset (a consistent
// tail read, then a put at its end), recording the epoch before it and, on a watch marker,
// a pending cancel it follows. A watch marker carries this call's token (in its digest), so
// a put the SDK retried after it landed is met at the tail as the call's own, not put twice.
func (l eventLog) mark(ctx context.Context, runID, kind string) error {
	pk := l.pk(runID)
	var token string
	if kind == slotWatch {
		token = newToken()
	}
	for step := 0; step < logMaxSteps; step++ {
		t, err := l.tail(ctx, pk)
		if err != nil {
			return fmt.Errorf("dynamostore: log %s marker: %w", kind, err)
		}
		x := &slot{first: 1, kind: kind, count: 1, digest: token}
		if t != nil {
			switch {
			case t.kind == slotClose:
				return contract.ErrLogClosed
			case kind == slotCancel && t.pendingCancel():
				// The owner has not passed the last marker yet (or this is our own
				// retried put): it will see that one.
				return nil
			case kind == slotWatch && t.kind == slotWatch && t.digest == token:
				return nil // our own put, landed before its answer was lost
			}
			x.first, x.prevEpoch, x.src, x.sawCancel = t.end()+1, t.owner(), t.src, kind == slotWatch && t.pendingCancel()
		}
		landed, err := l.put(ctx, pk, x)
		if err != nil {
			return fmt.Errorf("dynamostore: log %s marker: %w", kind, err)
		}
		if landed {
			return nil
		}
	}
	return fmt.Errorf("dynamostore: log %s marker: %d collisions without storing", kind, logMaxSteps)
}

// Close puts a close item under at.Epoch at the cursor, stepping past items of its own
// epoch and cancel markers; a close already there (of its epoch or lower) is success; a
// higher epoch anywhere on the way is ErrSuperseded and nothing is written.
func (l eventLog) Close(ctx context.Context, runID string, at contract.Cursor) error {
	pk := l.pk(runID)
	x := &slot{first: at.Next, kind: slotClose, epoch: at.Epoch, count: 1, src: at.Src}
	for step := 0; step < logMaxSteps; step++ {
		landed, err := l.put(ctx, pk, x)
		if err != nil {
			return fmt.Errorf("dynamostore: log close: %w", err)
		}
		if landed {
			return nil
		}
		occ, err := l.header(ctx, pk, x.first)
		if err != nil {
			return fmt.Errorf("dynamostore: log close: %w", err)
		}
		switch {
		case occ == nil:
			continue
		case occ.owner() > at.Epoch:
			return contract.ErrSuperseded
		case occ.kind == slotClose:
			return nil // own retry, or a reader closed it (under this epoch or, for a run never claimed, below it)
		case occ.owner() < at.Epoch && !occ.marker():
			return lowerEpochError(occ, at.Epoch)
		}
		// Own epoch's events or fence, or a marker: step past it.
		x.first, x.src = occ.end()+1, max(x.src, occ.src)
	}
	return fmt.Errorf("dynamostore: log close: %d slots walked without storing", logMaxSteps)
}

// Read returns the events of whole items after offset after: the first item holding events
// always, then further items while they fit in limit events; markers are skipped; next is
// the last offset consumed (an item boundary); closed = a close item follows everything
// returned. A read that reaches the tail of an unclosed log without returning events checks
// the run and, when it is terminal, closes the log under the run's epoch.
//
// Reading from a next costs one Query. An after inside a multi-event item that began
// before it (a resume from an event offset), or at the tail after such an item, costs one
// more backward Query, to find the item holding after.
func (l eventLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	pk := l.pk(runID)
	if limit < 1 {
		limit = logDefaultReadLimit
	}
	// The query starts at the item beginning at after, when there is one: if that item
	// ends at after, after is an item boundary; if it goes on, it holds after+1. Otherwise
	// the item holding after+1 begins at after+1 (the chain has no gaps) unless after lies
	// inside an item that began earlier, or at the tail: then one backward query finds the
	// item holding after. Three items of slack: that first item, and a marker or a close
	// just past the limit, consumed or reported in the same call.
	page, more, err := l.query(ctx, pk, after, min(limit, logMaxQueryItems)+3)
	if err != nil {
		return nil, 0, false, fmt.Errorf("dynamostore: log read: %w", err)
	}
	var tail *slot
	located := after == 0
	if after > 0 && len(page) > 0 && page[0].first == after {
		x := page[0]
		located = true
		switch {
		case x.kind == slotClose:
			// Kept: the loop below reports it.
		case x.end() == after:
			tail, page = x, page[1:]
		default:
			x.events = x.events[after-x.first+1:]
		}
	}
	located = located || len(page) > 0 && page[0].first == after+1
	if !located && len(page) == 0 && l.s.ends.has(pk, after) {
		// A reader back at the tail it was given: an item is known to end at after (items
		// never change), so no backward query is needed to place it — a waiting reader's
		// poll costs two calls, not three.
		located = true
	}
	if !located {
		prev, err := l.itemAtOrBefore(ctx, pk, after)
		if err != nil {
			return nil, 0, false, fmt.Errorf("dynamostore: log read: %w", err)
		}
		if prev != nil && prev.end() > after {
			if prev.kind == slotEvents {
				prev.events = prev.events[after-prev.first+1:]
			}
			page = append([]*slot{prev}, page...)
		} else if len(page) == 0 {
			tail = prev
		}
	}

	out := []contract.Event{}
	next, stopped, size := after, false, 0
	for _, x := range page {
		if x.kind == slotClose {
			return out, next, true, nil
		}
		if n := len(x.events); n > 0 {
			b := contract.PageBytes(x.events)
			if len(out) > 0 && (len(out)+n > limit || size+b > contract.MaxPageBytes) {
				stopped = true
				break
			}
			out = append(out, x.events...)
			size += b
		}
		next = x.end()
	}
	if stopped || more || len(out) > 0 {
		if len(page) > 0 {
			l.s.ends.add(pk, next) // next is the end of the page's last item
		}
		return out, next, false, nil
	}
	// At the tail with nothing new: a terminal run's log is closed by the reader, so a
	// crash between the terminal write and Close never leaves readers polling for ever.
	if len(page) > 0 {
		tail = page[len(page)-1]
	}
	epoch, terminal, err := l.s.runEpochIfTerminal(ctx, l.tenant, runID)
	if err != nil {
		return nil, 0, false, fmt.Errorf("dynamostore: log read: %w", err)
	}
	if !terminal {
		if tail != nil && tail.end() == next {
			l.s.ends.add(pk, next)
		}
		return out, next, false, nil
	}
	closeAt, err := l.closeTerminal(ctx, pk, tail, epoch)
	if err != nil {
		return nil, 0, false, fmt.Errorf("dynamostore: log read: closing a terminal run's log: %w", err)
	}
	if closeAt-1 > next {
		// Items landed after our page (a late writer): let the reader fetch them first;
		// the next read reports the close.
		return out, next, false, nil
	}
	return out, closeAt - 1, true, nil
}

// closeTerminal puts a close item at the first free offset under max(epoch, tail owner)
// and returns its offset (or that of the close already there). tail is the last item the
// caller saw (nil: none); on collision the real tail is queried.
func (l eventLog) closeTerminal(ctx context.Context, pk string, tail *slot, epoch int64) (int64, error) {
	for step := 0; step < logMaxSteps; step++ {
		x := &slot{first: 1, kind: slotClose, epoch: epoch, count: 1}
		if tail != nil {
			if tail.kind == slotClose {
				return tail.first, nil
			}
			x.first, x.epoch, x.src = tail.end()+1, max(epoch, tail.owner()), tail.src
		}
		landed, err := l.put(ctx, pk, x)
		if err != nil {
			return 0, err
		}
		if landed {
			return x.first, nil
		}
		if tail, err = l.tail(ctx, pk); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("%d collisions without storing", logMaxSteps)
}

// put stores x at its slot only if the slot is free; landed=false means it was taken.
func (l eventLog) put(ctx context.Context, pk string, x *slot) (bool, error) {
	it := slotItem{
		keyAttrs: keyAttrs{PK: pk, SK: pad(x.first)}, Kind: x.kind, Count: &x.count, Src: &x.src,
		SawCancel: x.sawCancel, GCAt: l.s.cfg.Now().Add(l.s.cfg.LogRetention).Unix(),
	}
	if x.marker() {
		it.PrevEpoch = &x.prevEpoch
	} else {
		it.Epoch = &x.epoch
	}
	it.Digest = x.digest // events: the batch's digest; a watch marker: its call's token
	if x.kind == slotEvents {
		it.Events = make([]slotEvent, len(x.events))
		for i, e := range x.events {
			it.Events[i] = slotEvent{Src: e.Src, Data: e.Data}
		}
	}
	item, err := encodeItem(&it)
	if err != nil {
		return false, err
	}
	err = l.s.putAbsent(ctx, item)
	if isCondFailed(err) {
		return false, nil
	}
	return err == nil, err
}

// header reads the item at offset first without its events (consistent); nil when absent.
func (l eventLog) header(ctx context.Context, pk string, first int64) (*slot, error) {
	e, err := expr(expression.NewBuilder().WithProjection(logHeader()))
	if err != nil {
		return nil, err
	}
	out, err := l.s.cfg.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:                &l.s.cfg.Table,
		Key:                      keyAttrs{PK: pk, SK: pad(first)}.attrs(),
		ConsistentRead:           aws.Bool(true),
		ProjectionExpression:     e.Projection(),
		ExpressionAttributeNames: e.Names(),
	})
	if err != nil || out.Item == nil {
		return nil, err
	}
	return decodeSlot(out.Item)
}

// tail returns the log's last item without its events (consistent); nil when empty.
func (l eventLog) tail(ctx context.Context, pk string) (*slot, error) {
	b := expression.NewBuilder().WithKeyCondition(expression.Key(attrPK).Equal(expression.Value(pk)))
	return l.last(ctx, b.WithProjection(logHeader()))
}

// itemAtOrBefore returns the whole item with the greatest first offset <= off; nil if none.
func (l eventLog) itemAtOrBefore(ctx context.Context, pk string, off int64) (*slot, error) {
	return l.last(ctx, expression.NewBuilder().WithKeyCondition(
		expression.Key(attrPK).Equal(expression.Value(pk)).And(expression.Key(attrSK).LessThanEqual(expression.Value(pad(off))))))
}

// last returns the item with the greatest sort key under b's key condition, as much of it
// as b's projection names (all without one), read consistently; nil when none matches.
func (l eventLog) last(ctx context.Context, b expression.Builder) (*slot, error) {
	e, err := expr(b)
	if err != nil {
		return nil, err
	}
	out, err := l.s.cfg.Client.Query(ctx, &dynamodb.QueryInput{
		TableName:                 &l.s.cfg.Table,
		KeyConditionExpression:    e.KeyCondition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
		ScanIndexForward:          aws.Bool(false),
		Limit:                     aws.Int32(1),
		ConsistentRead:            aws.Bool(true),
		ProjectionExpression:      e.Projection(),
	})
	if err != nil || len(out.Items) == 0 {
		return nil, err
	}
	return decodeSlot(out.Items[0])
}

// query returns up to n whole items from the one beginning at offset after on (all items
// when after is 0; consistent); more = the page stopped before the end of the log (or may
// have).
func (l eventLog) query(ctx context.Context, pk string, after int64, n int) ([]*slot, bool, error) {
	e, err := expr(expression.NewBuilder().WithKeyCondition(
		expression.Key(attrPK).Equal(expression.Value(pk)).And(expression.Key(attrSK).GreaterThanEqual(expression.Value(pad(after))))))
	if err != nil {
		return nil, false, err
	}
	out, err := l.s.cfg.Client.Query(ctx, &dynamodb.QueryInput{
		TableName:                 &l.s.cfg.Table,
		KeyConditionExpression:    e.KeyCondition(),
		ExpressionAttributeNames:  e.Names(),
		ExpressionAttributeValues: e.Values(),
		Limit:                     aws.Int32(int32(n)),
		ConsistentRead:            aws.Bool(true),
	})
	if err != nil {
		return nil, false, err
	}
	page := make([]*slot, 0, len(out.Items))
	for _, it := range out.Items {
		x, err := decodeSlot(it)
		if err != nil {
			return nil, false, err
		}
		page = append(page, x)
	}
	return page, len(out.LastEvaluatedKey) > 0, nil
}

// decodeSlot decodes a log item (with its events when they were read).
func decodeSlot(item map[string]types.AttributeValue) (*slot, error) {
	it, err := decodeItem[slotItem](item)
	if err != nil {
		return nil, err
	}
	x := &slot{kind: it.Kind, digest: it.Digest, sawCancel: it.SawCancel}
	if x.first, err = strconv.ParseInt(it.SK, 10, 64); err != nil {
		return nil, fmt.Errorf("dynamostore: %w: log item sk %q: %w", errAttr, it.SK, err)
	}
	need := func(name string, n *int64) int64 {
		if n == nil && err == nil {
			err = fmt.Errorf("dynamostore: %w: log item %d: %s missing", errAttr, x.first, name)
		}
		if n == nil {
			return 0
		}
		return *n
	}
	switch x.kind {
	case slotEvents, slotFence, slotClose:
		x.epoch = need(attrLogEpoch, it.Epoch)
	case slotCancel, slotWatch:
		x.prevEpoch = need(attrLogPrevEpoch, it.PrevEpoch)
	default:
		err = fmt.Errorf("dynamostore: %w: log item %d: unknown kind %q", errAttr, x.first, x.kind)
	}
	x.count, x.src = need(attrLogCount, it.Count), need(attrLogSrc, it.Src)
	if err != nil {
		return nil, err
	}
	if x.count < 1 || x.kind != slotEvents && x.count != 1 {
		return nil, fmt.Errorf("dynamostore: %w: log item %d: %s with count %d", errAttr, x.first, x.kind, x.count)
	}
	if x.kind != slotEvents || it.Events == nil {
		return x, nil // a marker, or a header read
	}
	if int64(len(it.Events)) != x.count {
		return nil, fmt.Errorf("dynamostore: %w: log item %d: events do not hold %d entries", errAttr, x.first, x.count)
	}
	x.events = make([]contract.Event, len(it.Events))
	for i, ev := range it.Events {
		if ev.Data == nil {
			return nil, fmt.Errorf("dynamostore: %w: log item %d: event %d has no data", errAttr, x.first, i)
		}
		x.events[i] = contract.Event{Offset: x.first + int64(i), Src: ev.Src, Data: ev.Data}
	}
	return x, nil
}

// runEpochIfTerminal reads the run item (consistent) and returns its driver epoch when it
// is terminal; an unknown run is not terminal.
func (s *Store) runEpochIfTerminal(ctx context.Context, tenant, runID string) (epoch int64, terminal bool, err error) {
	e, err := expr(expression.NewBuilder().WithProjection(expression.NamesList(expression.Name(attrStatus), expression.Name(attrEpoch))))
	if err != nil {
		return 0, false, err
	}
	out, err := s.cfg.Client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:                &s.cfg.Table,
		Key:                      itemKey(tenant, kindRun, runID),
		ConsistentRead:           aws.Bool(true),
		ProjectionExpression:     e.Projection(),
		ExpressionAttributeNames: e.Names(),
	})
	if err != nil || out.Item == nil {
		return 0, false, err
	}
	it, err := decodeItem[runItem](out.Item)
	if err != nil || !contract.RunStatus(it.Status).Terminal() {
		return 0, false, err
	}
	if it.DriverEpoch != nil {
		epoch = *it.DriverEpoch
	}
	return epoch, true, nil // a run never claimed has epoch 0, below every writer
}
