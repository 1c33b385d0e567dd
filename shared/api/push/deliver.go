// Package push is the deployed push (docs/design.md §8.1): the API Gateway WebSocket API's
// routes ($connect, $disconnect, the client's messages) as plain Go, and the deliverer that
// posts a run's stored events to its subscribers through the API's management endpoint
// (PostToConnection, signed with SigV4). The protocol is the dev server's
// (api/asyncapi.yaml): the same messages, cut into the same frames (httpapi.PushFrames).
//
// Delivery keeps each watcher's order with one holder per subscription: a deliverer holds
// the subscription item (contract.PushStore.Hold), reads the log after the offset delivered
// through, posts, and releases; a writer that finds it held flags it, and the holder's
// release then fails once and it reads again. So an event stored while another deliverer
// posts is never left behind, and nothing is posted twice or out of order (a hold that
// lapses with its holder may re-post a page, which a client drops: at or below its last).
package push

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Defaults of Config.
const (
	// DefaultHold is how long a deliverer holds a subscription without renewing it: far
	// above a page's posts (each bounded by the poster's timeout), so a live holder never
	// loses it, and short enough that a crashed one delays its watcher only this long.
	DefaultHold = 15 * time.Second
	// DefaultTimeout bounds one Landed call: a write's answer waits for its push.
	DefaultTimeout = 10 * time.Second
)

// Config configures a Deliverer. Store, Log and Poster are required.
type Config struct {
	Store  contract.PushStore
	Log    contract.EventLog
	Poster Poster
	// Now is the wall clock of holds (default time.Now): replicas agree on it.
	Now       func() time.Time
	Hold      time.Duration // default DefaultHold
	Timeout   time.Duration // default DefaultTimeout
	PageLimit int           // events read per page (default wire.DefaultReadLimit)
	Logger    *slog.Logger  // default slog.Default()
}

// Deliverer posts runs' stored events to their subscribers; it is the keeper's LogPush.
type Deliverer struct{ cfg Config }

var _ keeper.LogPush = (*Deliverer)(nil)

// NewDeliverer returns a Deliverer over cfg.
func NewDeliverer(cfg Config) *Deliverer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Hold <= 0 {
		cfg.Hold = DefaultHold
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.PageLimit <= 0 {
		cfg.PageLimit = wire.DefaultReadLimit
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Deliverer{cfg: cfg}
}

// Landed pushes what the writer stored to the run's subscribers (keeper.LogPush). The
// write has landed whatever happens here: a failure is logged, and the next write, a
// lapsed hold or the watcher's resubscribe delivers what this one could not.
func (d *Deliverer) Landed(ctx context.Context, key keeper.RunKey, last int64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.Timeout)
	defer cancel()
	if err := d.Push(ctx, key.RunID, last); err != nil {
		d.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "push", slog.String("tenant", key.Tenant),
			slog.String("runId", key.RunID), slog.String("error", err.Error()))
	}
}

// Push delivers runID's stored events (in ctx's tenant) to each of its subscribers; last
// is the log's last offset the caller knows (0: none), so a subscriber already past it
// costs nothing more than the one Query that lists them.
func (d *Deliverer) Push(ctx context.Context, runID string, last int64) error {
	subs, err := d.cfg.Store.Subscriptions(ctx, runID)
	if err != nil {
		return fmt.Errorf("push: %w", err)
	}
	var errs []error
	for _, s := range subs {
		if last > 0 && s.Next >= last {
			continue
		}
		errs = append(errs, d.serve(ctx, runID, s.ConnID, last))
	}
	return errors.Join(errs...)
}

// serve holds the subscription and delivers, or flags it for the deliverer holding it.
func (d *Deliverer) serve(ctx context.Context, runID, connID string, last int64) error {
	for range 3 {
		holder := newHolder()
		now := d.cfg.Now().UnixMilli()
		sub, err := d.cfg.Store.Hold(ctx, runID, connID, holder, now, now+d.cfg.Hold.Milliseconds())
		if err == nil {
			return d.Deliver(ctx, runID, connID, holder, sub.Next, last)
		}
		if !errors.Is(err, contract.ErrConflict) {
			return fmt.Errorf("push: %w", err)
		}
		// Held by another deliverer: it must read again before it lets go.
		err = d.cfg.Store.Flag(ctx, runID, connID, d.cfg.Now().UnixMilli())
		if err == nil {
			return nil
		}
		if !errors.Is(err, contract.ErrConflict) {
			return fmt.Errorf("push: %w", err)
		}
		// Released (or removed) between the two: try to hold it again.
	}
	return nil // removed: nobody to deliver to
}

// Deliver posts runID's events after next to connID while holder holds its subscription,
// then the close when the log is closed (and ends the subscription), and releases the
// hold, reading again whenever the release finds it flagged. last (0: unknown) spares the
// read that would find nothing more.
func (d *Deliverer) Deliver(ctx context.Context, runID, connID, holder string, next, last int64) error {
	for {
		events, n, closed, err := d.cfg.Log.Read(ctx, runID, next, d.cfg.PageLimit)
		if err != nil {
			d.release(ctx, runID, connID, holder, next)
			return fmt.Errorf("push: read %q after %d: %w", runID, next, err)
		}
		for _, m := range httpapi.PushFrames(runID, events) {
			if err := d.post(ctx, runID, connID, holder, next, m); err != nil {
				return settled(err)
			}
		}
		progress := n > next
		next = max(next, n)
		if closed {
			if err := d.post(ctx, runID, connID, holder, next, wire.PushMessage{Type: wire.PushClosed, RunID: runID, Next: next}); err != nil {
				return settled(err)
			}
			if err := d.cfg.Store.Unsubscribe(ctx, connID, runID, holder); err != nil && !errors.Is(err, contract.ErrConflict) {
				return fmt.Errorf("push: %w", err)
			}
			return nil
		}
		if progress && (last == 0 || next < last) {
			// More may be stored already: keep holding (renewed), record progress, read on.
			if _, err := d.cfg.Store.Advance(ctx, runID, connID, holder, next, d.heldUntil(), false); err != nil {
				return d.lost(err)
			}
			continue
		}
		flagged, err := d.cfg.Store.Advance(ctx, runID, connID, holder, next, d.heldUntil(), true)
		if err != nil {
			return d.lost(err)
		}
		if !flagged {
			return nil
		}
		last = 0 // a writer stored more while we held it: read until nothing is left
	}
}

func (d *Deliverer) heldUntil() int64 { return d.cfg.Now().Add(d.cfg.Hold).UnixMilli() }

// lost: a hold lost to a resubscribe or a lapse is the new holder's to continue.
func (d *Deliverer) lost(err error) error {
	if errors.Is(err, contract.ErrConflict) {
		return nil
	}
	return fmt.Errorf("push: %w", err)
}

// release lets the hold go after a failure, delivered through next (a flag is left for
// the hold's lapse: the failure may be the store's).
func (d *Deliverer) release(ctx context.Context, runID, connID, holder string, next int64) {
	_, _ = d.cfg.Store.Advance(ctx, runID, connID, holder, next, d.heldUntil(), true)
}

// post sends one message to a held subscription's connection; on a failure other than a
// gone connection it lets the hold go (delivered through next).
func (d *Deliverer) post(ctx context.Context, runID, connID, holder string, next int64, m wire.PushMessage) error {
	err := d.send(ctx, connID, m)
	if err != nil && !errors.Is(err, ErrGone) {
		d.release(ctx, runID, connID, holder, next)
	}
	return err
}

// settled is err without ErrGone: a gone connection was removed, nothing failed.
func settled(err error) error {
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}

// send posts one message; a gone connection (410) is removed with its subscriptions, and
// the answer is ErrGone.
func (d *Deliverer) send(ctx context.Context, connID string, m wire.PushMessage) error {
	err := d.cfg.Poster.Post(ctx, connID, httpapi.EncodePush(m))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrGone):
		if derr := d.cfg.Store.Disconnect(ctx, connID); derr != nil {
			return fmt.Errorf("push: remove gone connection %q: %w", connID, derr)
		}
		return ErrGone
	}
	return fmt.Errorf("push: post to %q: %w", connID, err)
}

// newHolder is a random deliverer token.
func newHolder() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
