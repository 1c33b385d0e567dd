package contract

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
)

// Cursor is where one writer's next item goes: its epoch, the next offset, and the highest
// Src stored so far. Cursors come only from CreateClaimed/Claim+Fence/Append results.
type Cursor struct {
	Epoch int64 `json:"epoch"`
	Next  int64 `json:"next"`
	Src   int64 `json:"src"`
}

// CheckCursor is the check of a writer's cursor before Append or Close (shared/store's log
// face makes it for every backend): a non-negative epoch and src, a next offset of at
// least 1.
func CheckCursor(at Cursor) error {
	switch {
	case at.Epoch < 0:
		return Invalid("cursor", "epoch %d is negative", at.Epoch)
	case at.Next < 1:
		return Invalid("cursor", "next offset %d below 1", at.Next)
	case at.Src < 0:
		return Invalid("cursor", "src %d is negative", at.Src)
	}
	return nil
}

// Event is one entry of a run's log. Offset is assigned by the log; Src (the journal byte
// position after the event's line, docs/design.md §6) is kept as given.
type Event struct {
	Offset int64           `json:"offset"`
	Src    int64           `json:"src,omitempty"`
	Data   json.RawMessage `json:"data"`
}

// AppendResult is the writer's state after Append or Fence.
type AppendResult struct {
	Cursor          Cursor // the writer's next cursor
	Last            int64  // last offset in use (0 = empty log)
	CancelRequested bool   // a cancel marker was seen
	Src             int64  // highest Src stored
}

// EventLog is a run's append-only, epoch-fenced event log, scoped by the context's tenant.
type EventLog interface {
	// Append stores events at cursor at, assigning offsets; a lower epoch than one that
	// fenced or appended gets ErrSuperseded, another batch at the same cursor ErrConflict,
	// a closed log ErrLogClosed; an ambiguous retry of the same batch stores it once.
	Append(ctx context.Context, runID string, at Cursor, events []Event) (AppendResult, error)
	// Fence makes epoch the log's owner: no lower-epoch item is stored after it. Returns
	// the owner's cursor, the last offset, the highest Src and the cancel flag.
	Fence(ctx context.Context, runID string, epoch int64) (AppendResult, error)
	// Read returns whole items after offset `after`: at least one item when any exists,
	// else up to limit events and PageBytes within MaxPageBytes; next lies on an item
	// boundary; closed = a close item was reached. A read reaching the tail of a terminal
	// run's unclosed log closes it.
	Read(ctx context.Context, runID string, after int64, limit int) (events []Event, next int64, closed bool, err error)
	// Close puts a close item under at.Epoch (stepping past that epoch's own items); a
	// close by a superseded epoch changes nothing and returns ErrSuperseded.
	Close(ctx context.Context, runID string, at Cursor) error
	// MarkCancel puts the in-band cancel marker at the first free offset; a closed log
	// returns ErrLogClosed.
	MarkCancel(ctx context.Context, runID string) error
	// MarkWatch puts a watch marker (no event, no cancel) at the first free offset, always
	// a new one, so a write after it steps over a marker; a closed log returns ErrLogClosed.
	MarkWatch(ctx context.Context, runID string) error
}

// Log sizing (docs/design.md §2.4).
const (
	MaxEventBytes = 256 << 10 // one event's data; larger is ErrInvalid
	MaxItemBytes  = 350_000   // the events of one stored item, with per-event overhead
	eventOverhead = 64        // accounted per event (offset, src, attribute names)
	// MaxPageBytes bounds one Read page: a page stops before the item that would take its
	// PageBytes past it (one item always fits: at most MaxItemBytes). A page's JSON (data
	// as stored, no HTML escaping) is then about 1 MiB, far under Lambda's 6 MiB answer
	// even when the response envelope doubles every quote and backslash.
	MaxPageBytes = 1 << 20
)

// PageBytes is what events count against MaxPageBytes: each event's data plus
// eventOverhead, at least its JSON encoding (offset, src and member names).
func PageBytes(events []Event) int {
	n := 0
	for _, e := range events {
		n += len(e.Data) + eventOverhead
	}
	return n
}

// CheckEvents validates a batch: non-empty, each event valid JSON no larger than
// MaxEventBytes, Src non-negative.
func CheckEvents(events []Event) error {
	if len(events) == 0 {
		return Invalid("events", "empty batch")
	}
	for i, e := range events {
		switch {
		case len(e.Data) > MaxEventBytes:
			return Invalid("events", "event %d is %d bytes, over %d", i, len(e.Data), MaxEventBytes)
		case !json.Valid(e.Data):
			return Invalid("events", "event %d data is not JSON", i)
		case e.Src < 0:
			return Invalid("events", "event %d src is negative", i)
		}
	}
	return nil
}

// SplitEvents splits a valid batch into item-sized chunks, deterministically (a retry of
// the same batch splits identically): each chunk's size stays within MaxItemBytes.
func SplitEvents(events []Event) [][]Event {
	var out [][]Event
	start, size := 0, 0
	for i, e := range events {
		n := len(e.Data) + eventOverhead
		if i > start && size+n > MaxItemBytes {
			out = append(out, events[start:i])
			start, size = i, 0
		}
		size += n
	}
	return append(out, events[start:])
}

// BatchDigest identifies an item's content, so a writer meeting its own slot can tell its
// ambiguous retry (same digest) from another batch (ErrConflict).
func BatchDigest(epoch int64, events []Event) string {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(epoch))
	h.Write(b[:])
	for _, e := range events {
		binary.BigEndian.PutUint64(b[:], uint64(e.Src))
		h.Write(b[:])
		binary.BigEndian.PutUint64(b[:], uint64(len(e.Data)))
		h.Write(b[:])
		h.Write(e.Data)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// MaxSrc returns the highest Src among events and floor.
func MaxSrc(floor int64, events []Event) int64 {
	for _, e := range events {
		floor = max(floor, e.Src)
	}
	return floor
}
