package journal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// MaxLineBytes is the longest line delivered whole, one event's limit. A longer line is
// delivered as successive pieces of at most PieceBytes (Line.Cont, Line.More) as soon as
// its bytes are read, never cut and never lost; an unfinished line is held back only while
// it is no longer than this, so no more than MaxLineBytes of a line is ever fetched a
// second time (by the next read after a pump) (docs/design.md §6).
const MaxLineBytes = contract.MaxEventBytes

// PieceBytes is the largest piece of a long line: one event's limit less room for the
// piece's JSON wrapper, so a piece of plain text is one event.
const PieceBytes = MaxLineBytes - 4<<10

// Read defaults.
const (
	DefaultChunkBytes   = 512 << 10
	DefaultPollInterval = 250 * time.Millisecond
)

// Line is one journal line, or one piece of a line longer than MaxLineBytes.
type Line struct {
	// Data is the line's (or the piece's) bytes, without the newline.
	Data []byte
	// Src is the journal byte position just after the piece: after the line's newline
	// when !More. A reader that has handled this piece resumes there.
	Src int64
	// Cont: this piece continues a line that earlier pieces began.
	Cont bool
	// More: the line goes on after this piece (its newline is not in it).
	More bool
}

// Whole reports whether l is a complete line delivered in one piece.
func (l Line) Whole() bool { return !l.Cont && !l.More }

// End is where a Read stopped.
type End struct {
	// Pos is the byte position after the last piece consumed (the sentinel's when
	// Finished); the held start of an unfinished line is not counted.
	Pos int64
	// Finished: this run's exit sentinel was reached; ExitCode is its code.
	Finished bool
	ExitCode int
	// Limited: the read stopped at its fetch limit; more bytes may be there already.
	Limited bool
}

// ReadOption tunes Read.
type ReadOption func(*readConfig)

type readConfig struct {
	chunk int
	poll  time.Duration
}

// WithChunkBytes bounds the bytes fetched by one shell call (default DefaultChunkBytes).
func WithChunkBytes(n int) ReadOption {
	return func(c *readConfig) {
		if n > 0 {
			c.chunk = n
		}
	}
}

// WithPollInterval sets the wait between fetches that found nothing new in follow mode
// (default DefaultPollInterval).
func WithPollInterval(d time.Duration) ReadOption {
	return func(c *readConfig) {
		if d > 0 {
			c.poll = d
		}
	}
}

// Source is where a Reader fetches a journal's bytes: the sandbox through the provider
// (NewReader), or bytes a shipper sent from inside it (Bytes).
type Source interface {
	// Fetch returns up to want bytes of the journal from byte position start; fewer (none)
	// means the journal ends there for now.
	Fetch(ctx context.Context, start int64, want int64) ([]byte, error)
}

// ErrNotHeld: a Bytes source was asked for bytes before the first it holds.
var ErrNotHeld = errors.New("journal: bytes before the ones sent")

// Bytes is a Source over journal bytes sent from the sandbox: Data are the journal's bytes
// from position Start on. A fetch before Start is ErrNotHeld; past the end is empty.
type Bytes struct {
	Start int64
	Data  []byte
}

// Fetch returns Data's bytes from start, at most want of them.
func (b Bytes) Fetch(_ context.Context, start int64, want int64) ([]byte, error) {
	if start < b.Start {
		return nil, fmt.Errorf("journal: byte %d wanted, bytes start at %d: %w", start, b.Start, ErrNotHeld)
	}
	if start-b.Start >= int64(len(b.Data)) {
		return nil, nil
	}
	out := b.Data[start-b.Start:]
	return out[:min(int64(len(out)), want)], nil
}

// execSource fetches a journal through the provider with `tail -c +N | head -c K`.
type execSource struct {
	ex    contract.Executor
	psid  string
	runID string
	path  string
}

func (e execSource) Fetch(ctx context.Context, start int64, want int64) ([]byte, error) {
	cmd := fmt.Sprintf("tail -c +%d -- %s 2>/dev/null | head -c %d", start+1, Quote(e.path), want)
	res, err := e.ex.Exec(ctx, e.psid, cmd)
	if err != nil {
		return nil, fmt.Errorf("journal: read %s at %d: %w", e.runID, start, err)
	}
	return res.Stdout, nil
}

// Reader reads one run's journal incrementally from a byte position: each Next delivers
// what arrived since the previous one, and never fetches a byte it fetched before (the
// start of an unfinished line is held in memory, at most MaxLineBytes of it).
type Reader struct {
	src     Source
	runID   string
	nonce   string
	cfg     readConfig
	pos     int64  // after the last piece delivered
	fetched int64  // the next byte to fetch
	pending []byte // the bytes [pos, fetched), not delivered yet (no newline among them)
	cont    bool   // pending continues a line earlier pieces began
	placed  bool   // whether pos starts a line is known (from 0, or the byte before pos seen)
	end     *End   // the sentinel was reached
}

// NewReader returns a reader of runID's journal (ctx's tenant, DirFor(ex, dir)) from byte
// position from, which must be 0 or a position a previous read returned (a piece's Src).
func NewReader(ctx context.Context, ex contract.Executor, psid, dir, runID string, from int64, opts ...ReadOption) (*Reader, error) {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return nil, err
	}
	return NewSourceReader(execSource{ex: ex, psid: psid, runID: runID, path: p.Journal}, runID, from, opts...)
}

// NewSourceReader returns a reader of runID's journal fetched from src, from byte position
// from (0 or a position a previous read returned). Past 0 it fetches the byte before from
// first, to know whether from starts a line.
func NewSourceReader(src Source, runID string, from int64, opts ...ReadOption) (*Reader, error) {
	cfg := readConfig{chunk: DefaultChunkBytes, poll: DefaultPollInterval}
	for _, o := range opts {
		o(&cfg)
	}
	if from < 0 {
		return nil, contract.Invalid("from", "negative byte position %d", from)
	}
	return &Reader{src: src, runID: runID, nonce: ExitNonce(runID), cfg: cfg,
		pos: from, fetched: from, placed: from == 0}, nil
}

// Pos is the byte position after the last piece delivered.
func (r *Reader) Pos() int64 { return r.pos }

// Fetched is the position of the next byte the reader will fetch.
func (r *Reader) Fetched() int64 { return r.fetched }

// Next fetches the journal's new bytes (at most limit of them when limit > 0) in chunks
// through ex.Exec and calls fn for every line and piece in order; it stops at the journal's
// present end, at the limit (End.Limited) or at this run's exit sentinel (End.Finished; the
// sentinel is not passed to fn). An error from fn or ex stops it and is returned with the
// End reached so far; a piece fn refused is not counted in End.Pos, and the reader must
// then be dropped (build another from a stored position).
func (r *Reader) Next(ctx context.Context, limit int64, fn func(Line) error) (End, error) {
	if r.end != nil {
		return *r.end, nil
	}
	var got int64
	for {
		if err := ctx.Err(); err != nil {
			return End{Pos: r.pos}, err
		}
		want := int64(r.cfg.chunk)
		if limit > 0 {
			if got >= limit {
				return End{Pos: r.pos, Limited: true}, nil
			}
			want = min(want, limit-got)
		}
		start := r.fetched
		if !r.placed {
			start-- // one byte more: whether the byte before pos is a newline
		}
		out, err := r.src.Fetch(ctx, start, want)
		if err != nil {
			return End{Pos: r.pos}, err
		}
		if int64(len(out)) > want {
			out = out[:want] // a shell ignoring head's bound must not break positions
		}
		full := int64(len(out)) >= want
		if !r.placed {
			if len(out) == 0 {
				return End{Pos: r.pos}, nil // the journal is not that long (yet)
			}
			r.placed, r.cont, out = true, out[0] != '\n', out[1:]
		}
		got += int64(len(out))
		r.fetched += int64(len(out))
		r.pending = append(r.pending, out...)
		if end, err := r.deliver(fn); err != nil || end != nil {
			if end != nil {
				r.end = end
				return *end, nil
			}
			return End{Pos: r.pos}, err
		}
		if !full {
			return End{Pos: r.pos}, nil
		}
	}
}

// deliver hands fn every complete line of pending, and the pieces of a line too long to
// hold; it returns the End of this run's sentinel when it met it.
func (r *Reader) deliver(fn func(Line) error) (*End, error) {
	for {
		nl := bytes.IndexByte(r.pending, '\n')
		if nl < 0 {
			break
		}
		line := r.pending[:nl]
		if !r.cont && len(line) <= MaxLineBytes {
			src := r.pos + int64(nl) + 1
			if code, ok := parseSentinel(line, r.nonce); ok {
				r.pos, r.pending = src, r.pending[nl+1:]
				return &End{Pos: src, Finished: true, ExitCode: code}, nil
			}
			if err := fn(Line{Data: bytes.Clone(line), Src: src}); err != nil {
				return nil, err
			}
			r.pos, r.pending = src, r.pending[nl+1:]
			continue
		}
		if err := r.pieces(fn, nl, false); err != nil {
			return nil, err
		}
		r.pos++ // the newline, delivered with the last piece
		r.pending, r.cont = r.pending[1:], false
	}
	if r.cont || len(r.pending) > MaxLineBytes {
		// A line too long to hold: deliver what there is, but a rune cut by the fetch.
		n := len(r.pending) - incompleteRune(r.pending)
		if n > 0 {
			if err := r.pieces(fn, n, true); err != nil {
				return nil, err
			}
		}
	}
	r.pending = append([]byte(nil), r.pending...) // drop what was delivered
	return nil, nil
}

// pieces delivers pending[:n] as pieces of at most PieceBytes, cut at rune starts; more
// says the line goes on after pending[:n]. The last piece's Src counts the newline when
// the line ends there (!more); the caller drops that newline.
func (r *Reader) pieces(fn func(Line) error, n int, more bool) error {
	for {
		k := n
		if k > PieceBytes {
			k = runeCut(r.pending, PieceBytes)
		}
		last := k == n
		l := Line{Data: bytes.Clone(r.pending[:k]), Src: r.pos + int64(k), Cont: r.cont, More: !last || more}
		if !l.More {
			l.Src++
		}
		if err := fn(l); err != nil {
			return err
		}
		r.pos += int64(k)
		r.pending, r.cont, n = r.pending[k:], true, n-k
		if last {
			return nil
		}
	}
}

// runeCut returns the largest cut in (0, max] of b that does not split a UTF-8 sequence
// (max itself when b is not UTF-8 there).
func runeCut(b []byte, max int) int {
	for k := max; k > max-utf8.UTFMax && k > 0; k-- {
		if utf8.RuneStart(b[k]) {
			return k
		}
	}
	return max
}

// incompleteRune returns how many bytes at b's end are the start of a UTF-8 sequence the
// fetch cut (0 when b ends on a complete rune or is not UTF-8 there).
func incompleteRune(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if b[i] >= utf8.RuneSelf && !utf8.FullRune(b[i:]) {
				return len(b) - i
			}
			return 0
		}
	}
	return 0
}

// Read reads runID's journal from byte position from (0, or a Src a previous read
// returned), calling fn for every line and piece in order (see Reader), and stops at this
// run's exit sentinel (which is not passed to fn) with End.Finished. Lines are fetched in
// bounded chunks with `tail -c +N | head -c K` through ex.Exec; the reader never creates
// the journal. Without follow it stops at the current end of the journal; with follow it
// keeps polling until the sentinel, ctx's end, or an error (docs/design.md §6 lets a
// provider that can kill background processes use `tail -f`; polling works everywhere
// and never leaves a process behind, so follow polls too). An error from fn or ex stops
// the read and is returned with the End reached so far; a piece fn refused is not counted
// in End.Pos.
func Read(ctx context.Context, ex contract.Executor, psid, dir, runID string, from int64, follow bool, fn func(Line) error, opts ...ReadOption) (End, error) {
	r, err := NewReader(ctx, ex, psid, dir, runID, from, opts...)
	if err != nil {
		return End{Pos: from}, err
	}
	for {
		end, err := r.Next(ctx, 0, fn)
		if err != nil || end.Finished || !follow {
			return end, err
		}
		select {
		case <-ctx.Done():
			return End{Pos: r.pos}, ctx.Err()
		case <-time.After(r.cfg.poll):
		}
	}
}
