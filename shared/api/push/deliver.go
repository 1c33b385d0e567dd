// Package push is the deployed push (docs/design.md §8.1): the API Gateway WebSocket API's
// routes ($connect, $disconnect, the client's messages) as plain Go, and the deliverer that
// posts a run's stored events to its subscribers through the API's management endpoint
// (PostToConnection, signed with SigV4). The protocol is the dev server's
// (api/asyncapi.yaml): the same messages, cut into the same frames (httpapi.PushFrames).
//
// Each writer posts the batch it stored itself: one Query lists the run's subscriptions,
// then one post per subscriber, and no delivery state is written. Each message says where
// its events begin (After), so a client that missed one — two writers' posts crossed, or a
// post failed — sees the hole and subscribes again from what it holds; a subscription's
// catch-up is written before it reads, so every batch is in the catch-up or posted to it
// (docs/design.md §8.1). Order and exactly-once are the client's, by offset. A subscriber
// puts a watch marker in the log between the two (contract.EventLog.MarkWatch), so a
// Deliverer lists a run's subscriptions again only when a batch does not begin where its
// last listing's did end, or stepped over a marker (subsCache).
package push

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// DefaultTimeout bounds one Landed call: a write's answer waits for its push.
const DefaultTimeout = 10 * time.Second

// Config configures a Deliverer. Store, Log and Poster are required.
type Config struct {
	Store     contract.PushStore
	Log       contract.EventLog
	Poster    Poster
	Timeout   time.Duration // default DefaultTimeout
	PageLimit int           // events read per page (default wire.DefaultReadLimit)
	Logger    *slog.Logger  // default slog.Default()
	// CachedRuns bounds the runs whose subscriptions are kept between writes (default
	// DefaultCachedRuns).
	CachedRuns int
}

// Deliverer posts runs' stored events to their subscribers; it is the keeper's LogPush.
type Deliverer struct {
	cfg  Config
	subs *subsCache
}

var _ keeper.LogPush = (*Deliverer)(nil)

// NewDeliverer returns a Deliverer over cfg.
func NewDeliverer(cfg Config) *Deliverer {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.PageLimit <= 0 {
		cfg.PageLimit = wire.DefaultReadLimit
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CachedRuns <= 0 {
		cfg.CachedRuns = DefaultCachedRuns
	}
	return &Deliverer{cfg: cfg, subs: newSubsCache(cfg.CachedRuns)}
}

// Landed posts what the writer stored to the run's subscribers (keeper.LogPush). The
// write has landed whatever happens here: a failure is logged, and the watcher finds the
// hole at the next message (or the close) and subscribes again.
func (d *Deliverer) Landed(ctx context.Context, key keeper.RunKey, l keeper.Landing) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.Timeout)
	defer cancel()
	if err := d.push(ctx, key, l); err != nil {
		d.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "push", slog.String("tenant", key.Tenant),
			slog.String("runId", key.RunID), slog.String("error", err.Error()))
	}
}

// Push posts runID's stored events after `after` (in ctx's tenant), and its close when it
// is closed, to each of its subscribers.
func (d *Deliverer) Push(ctx context.Context, runID string, after int64) error {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return wrap(err)
	}
	return d.push(ctx, keeper.RunKey{Tenant: tenant, RunID: runID}, keeper.Landing{After: after})
}

// push lists l's run's subscriptions — from the cache when it answers for l, else one
// consistent Query, cached — and posts l to each: its events when the writer knew them,
// else the log read after l.After (only when someone subscribes).
func (d *Deliverer) push(ctx context.Context, key keeper.RunKey, l keeper.Landing) error {
	runID := key.RunID
	subs, ok := d.subs.take(key, l)
	if !ok {
		var err error
		if subs, err = d.cfg.Store.Subscriptions(ctx, runID); err != nil {
			return wrap(err)
		}
		d.subs.put(key, subs, l.Last) // the Query came after the write that occupied l.Last
	}
	if len(subs) == 0 {
		return nil
	}
	var err error
	failed := make([]error, len(subs)) // a subscriber's first failure ends its posts here
	post := func(msgs []wire.PushMessage) error {
		for i, s := range subs {
			if failed[i] == nil {
				failed[i] = d.postAll(ctx, runID, s.ConnID, msgs)
			}
		}
		return nil
	}
	if l.Events != nil {
		err = post(Frames(runID, l.After, l.Events))
	} else {
		err = d.pages(ctx, runID, l.After, post)
	}
	for i := range failed {
		failed[i] = settled(failed[i])
	}
	return errors.Join(append(failed, err)...)
}

// pages reads runID's log after `after` a page at a time and hands each page's messages
// to f, then the close when the log is closed.
func (d *Deliverer) pages(ctx context.Context, runID string, after int64, f func([]wire.PushMessage) error) error {
	from := after // the offset of the last event read: where the next message begins
	for {
		events, n, closed, err := d.cfg.Log.Read(ctx, runID, after, d.cfg.PageLimit)
		if err != nil {
			return fmt.Errorf("push: read %q after %d: %w", runID, after, err)
		}
		msgs := Frames(runID, from, events)
		if len(events) > 0 {
			from = events[len(events)-1].Offset
		}
		if closed {
			a := from
			msgs = append(msgs, wire.PushMessage{Type: wire.PushClosed, RunID: runID, Next: max(n, after), After: &a})
		}
		if err := f(msgs); err != nil || closed || n <= after {
			return err
		}
		after = n
	}
}

// Frames are the messages of events stored right after offset `after` (no event between),
// cut to frames (httpapi.PushFrames), each saying where its events begin.
func Frames(runID string, after int64, events []contract.Event) []wire.PushMessage {
	msgs := httpapi.PushFrames(runID, events)
	for i := range msgs {
		a := after
		msgs[i].After = &a
		if msgs[i].Type == wire.PushEvents {
			after = msgs[i].Next
		} else if msgs[i].Final {
			after = msgs[i].Offset
		}
	}
	return msgs
}

// postAll posts msgs to connID in order, stopping at the first failure (ErrGone: the
// connection was removed; otherwise the client finds the hole at its next message); after
// a close it ends the subscription, and the run's cached subscriptions with it.
func (d *Deliverer) postAll(ctx context.Context, runID, connID string, msgs []wire.PushMessage) error {
	for _, m := range msgs {
		if err := d.send(ctx, connID, m); err != nil {
			return err
		}
		if m.Type == wire.PushClosed {
			if tenant, err := contract.Tenant(ctx); err == nil {
				d.subs.drop(keeper.RunKey{Tenant: tenant, RunID: runID})
			}
			return wrap(d.cfg.Store.Unsubscribe(ctx, connID, runID))
		}
	}
	return nil
}

func wrap(err error) error {
	if err != nil {
		return fmt.Errorf("push: %w", err)
	}
	return nil
}

// settled is err without ErrGone: a gone connection was removed, nothing failed.
func settled(err error) error {
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}

// send posts one message; a gone connection (410) is removed with its subscriptions (the
// cached ones too), and the answer is ErrGone.
func (d *Deliverer) send(ctx context.Context, connID string, m wire.PushMessage) error {
	err := d.cfg.Poster.Post(ctx, connID, httpapi.EncodePush(m))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrGone):
		if tenant, terr := contract.Tenant(ctx); terr == nil {
			d.subs.gone(tenant, connID)
		}
		if derr := d.cfg.Store.Disconnect(ctx, connID); derr != nil {
			return fmt.Errorf("push: remove gone connection %q: %w", connID, derr)
		}
		return ErrGone
	}
	return fmt.Errorf("push: post to %q: %w", connID, err)
}
