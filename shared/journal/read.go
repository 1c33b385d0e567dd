package journal

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// MaxLineBytes is the longest line delivered whole; a longer one is delivered by size only
// (and translates to a truncation event): one event's limit (docs/design.md §2.4).
const MaxLineBytes = sandbox.MaxEventBytes

// Read defaults.
const (
	DefaultChunkBytes   = 512 << 10
	DefaultPollInterval = 250 * time.Millisecond
)

// Line is one complete, newline-terminated journal line.
type Line struct {
	// Data is the line without its newline; nil when the line is longer than MaxLineBytes.
	Data []byte
	// Size is the line's length in bytes, without its newline.
	Size int64
	// Src is the journal byte position just after the line's newline: where a reader that
	// has handled this line resumes.
	Src int64
}

// Truncated reports whether the line was too long to be delivered whole.
func (l Line) Truncated() bool { return l.Size > MaxLineBytes }

// End is where a Read stopped.
type End struct {
	// Pos is the byte position after the last line consumed (the sentinel's when Finished);
	// a partial last line is not counted: the agent is still writing it.
	Pos int64
	// Finished: this run's exit sentinel was reached; ExitCode is its code.
	Finished bool
	ExitCode int
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

// Read reads runID's journal from byte position from, calling fn for every complete line in
// order, and stops at this run's exit sentinel (which is not passed to fn) with
// End.Finished. Lines are fetched in bounded chunks with `tail -c +N | head -c K` through
// ex.Exec; the reader never creates the journal. Without follow it stops at the current
// end of the journal; with follow it keeps polling until the sentinel, ctx's end, or an
// error (docs/design.md §6 lets a provider that can kill background processes use `tail -f`; polling
// works everywhere and never leaves a process behind, so follow polls too). An error from
// fn or ex stops the read and is returned with the End reached so far; a line fn refused
// is not counted in End.Pos.
func Read(ctx context.Context, ex sandbox.Executor, psid, dir, runID string, from int64, follow bool, fn func(Line) error, opts ...ReadOption) (End, error) {
	cfg := readConfig{chunk: DefaultChunkBytes, poll: DefaultPollInterval}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return End{Pos: from}, err
	}
	if from < 0 {
		return End{Pos: from}, sandbox.Invalid("from", "negative byte position %d", from)
	}
	nonce := ExitNonce(runID)
	var (
		pos     = from // after the last complete line
		fetched = from // next byte to fetch
		partial []byte // the current line so far, nil once it outgrew MaxLineBytes
		size    int64  // the current line's length so far
		over    bool   // the current line is longer than MaxLineBytes
	)
	for {
		if err := ctx.Err(); err != nil {
			return End{Pos: pos}, err
		}
		cmd := fmt.Sprintf("tail -c +%d -- %s 2>/dev/null | head -c %d", fetched+1, Quote(p.Journal), cfg.chunk)
		res, err := ex.Exec(ctx, psid, cmd)
		if err != nil {
			return End{Pos: pos}, fmt.Errorf("journal: read %s at %d: %w", runID, fetched, err)
		}
		out := res.Stdout
		if len(out) > cfg.chunk {
			out = out[:cfg.chunk] // a shell ignoring head's bound must not break positions
		}
		fetched += int64(len(out))
		for len(out) > 0 {
			seg, rest, nl := bytes.Cut(out, []byte{'\n'})
			out = rest
			size += int64(len(seg))
			if !over && size > MaxLineBytes {
				over, partial = true, nil
			}
			if !over {
				partial = append(partial, seg...)
			}
			if !nl {
				break
			}
			line := Line{Size: size, Src: pos + size + 1}
			if !over {
				line.Data = partial
				if partial == nil {
					line.Data = []byte{}
				}
			}
			partial, size, over = nil, 0, false
			if !line.Truncated() {
				if code, ok := parseSentinel(line.Data, nonce); ok {
					return End{Pos: line.Src, Finished: true, ExitCode: code}, nil
				}
			}
			if err := fn(line); err != nil {
				return End{Pos: pos}, err
			}
			pos = line.Src
		}
		if int64(len(res.Stdout)) >= int64(cfg.chunk) {
			continue // more is probably there already
		}
		if !follow {
			return End{Pos: pos}, nil
		}
		select {
		case <-ctx.Done():
			return End{Pos: pos}, ctx.Err()
		case <-time.After(cfg.poll):
		}
	}
}
