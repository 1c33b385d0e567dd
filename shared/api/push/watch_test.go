package push_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// The deliverer lists a run's subscriptions again only when a write does not begin where
// its last listing's write ended or steps over a marker (docs/design.md §8.1); a subscribe
// puts a watch marker between its subscription and its catch-up. These tests meet the one
// write a stale listing could miss: the first after a subscribe.

// unmarked is a log whose MarkWatch leaves no trace: a subscribe broken in the test at the
// log seam (the deliverer's code is the same).
type unmarked struct{ contract.EventLog }

func (unmarked) MarkWatch(context.Context, string) error { return nil }

// counted counts the push store's Subscriptions and Disconnect calls.
type counted struct {
	contract.PushStore
	mu                 sync.Mutex
	lists, disconnects int
}

func (c *counted) Subscriptions(ctx context.Context, runID string) ([]contract.Subscription, error) {
	c.mu.Lock()
	c.lists++
	c.mu.Unlock()
	return c.PushStore.Subscriptions(ctx, runID)
}

func (c *counted) Disconnect(ctx context.Context, connID string) error {
	c.mu.Lock()
	c.disconnects++
	c.mu.Unlock()
	return c.PushStore.Disconnect(ctx, connID)
}

func (c *counted) counts() (lists, disconnects int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists, c.disconnects
}

// TestSubscribeBetweenCachedWrites (both backends): a writer appends e1 (its deliverer
// lists nobody and keeps that), a watcher subscribes through the routes, the writer
// appends e2 at its cursor: the watcher holds e1 (its catch-up) and e2 (posted, since the
// catch-up read before e2 was stored) once each. A subscribe broken in the test at the
// log seam — its watch marker never stored — loses e2, and the check catches it.
func TestSubscribeBetweenCachedWrites(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		for _, broken := range []bool{false, true} {
			name := map[bool]string{false: "correct", true: "broken: no watch marker"}[broken]
			t.Run(name, func(t *testing.T) {
				o := rigOptions{}
				if broken {
					o.log = func(l contract.EventLog) contract.EventLog { return unmarked{l} }
				}
				r := newRig(o)
				cur := r.run("r1")
				cur = r.append("r1", cur, 0, 1, 0) // e1: nobody listed, and kept
				r.connect("c1")
				r.send("c1", `{"type":"subscribe","runId":"r1"}`)
				caughtUp := len(r.standin.Messages(t, "c1"))
				r.append("r1", cur, 1, 1, 0) // e2, at the writer's cursor
				why := r.watch("c1", "r1", 0).check(0, false)
				msgs := r.standin.Messages(t, "c1")
				posted := len(msgs) > caughtUp && msgs[len(msgs)-1].Type == wire.PushEvents
				switch {
				case !broken && why != "":
					t.Fatalf("correct subscribe: %s", why)
				case !broken && !posted:
					t.Fatalf("e2 was not posted after the catch-up: %+v", msgs)
				case broken && why == "":
					t.Fatal("a subscribe without its watch marker went unnoticed")
				case broken:
					t.Logf("caught: %s", why)
				}
			})
		}
	})
}

// forgedAfter is a keeper.LogPush between a keeper and its deliverer that tells the
// deliverer every batch of events began where the last one it was told of ended: the
// deliverer's check that a batch begins where its listing's write ended then always
// passes — a cache without that check, built in the test at the LogPush seam.
type forgedAfter struct {
	d    *push.Deliverer
	mu   sync.Mutex
	last map[keeper.RunKey]int64
}

func (f *forgedAfter) Landed(ctx context.Context, key keeper.RunKey, l keeper.Landing) {
	f.mu.Lock()
	if prev, ok := f.last[key]; ok && l.Events != nil {
		l.After = prev
	}
	f.last[key] = l.Last
	f.mu.Unlock()
	f.d.Landed(ctx, key, l)
}

// TestCachedListingOfAnotherProcess (both backends): one writer's appends land through two
// processes' deliverers, as a shipped run's requests do across function instances. A
// appends e1 (lists nobody, keeps that); a watcher subscribes; B appends e2 (steps over
// the marker, lists, posts); A appends e3, whose batch does not begin where A's listing
// ended: A must list again and post e3. A deliverer broken in the test to take any batch
// as beginning there (forgedAfter) posts e3 to nobody, and the check catches it.
func TestCachedListingOfAnotherProcess(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		for _, broken := range []bool{false, true} {
			name := map[bool]string{false: "correct", true: "broken: batches taken as beginning where the listing ended"}[broken]
			t.Run(name, func(t *testing.T) {
				r := newRig(rigOptions{})
				quiet := slog.New(slog.DiscardHandler)
				var pushA keeper.LogPush = push.NewDeliverer(push.Config{Store: r.store, Log: r.backend.Log(), Poster: r.poster, Logger: quiet})
				if broken {
					pushA = &forgedAfter{d: pushA.(*push.Deliverer), last: map[keeper.RunKey]int64{}}
				}
				a, err := keeper.New(keeper.Config{Backend: r.backend, Logger: quiet, Push: pushA})
				if err != nil {
					t.Fatal(err)
				}
				appendVia := func(k *keeper.Keeper, cur contract.Cursor, i int) contract.Cursor {
					t.Helper()
					res, err := k.Append(r.ctx(), "r1", cur, []contract.Event{{Data: fmt.Appendf(nil, `{"i":%d}`, i)}})
					if err != nil {
						t.Fatalf("append %d: %v", i, err)
					}
					return res.Cursor
				}
				cur := appendVia(a, r.run("r1"), 1)
				r.connect("c1")
				r.send("c1", `{"type":"subscribe","runId":"r1"}`)
				cur = appendVia(r.k, cur, 2) // process B
				appendVia(a, cur, 3)
				why := r.watch("c1", "r1", 0).check(0, false)
				switch {
				case !broken && why != "":
					t.Fatalf("correct deliverers: %s", why)
				case broken && why == "":
					t.Fatal("the broken cache went unnoticed")
				case broken:
					t.Logf("caught: %s", why)
				}
			})
		}
	})
}

// TestSubscriptionsListedOncePerSubscribe (both backends): a writer's appends with one
// watcher list the run's subscriptions once — at the first append after the subscribe,
// which steps over its marker — then not again; each later subscribe, re-subscribe and
// unsubscribe costs one more listing. On DynamoDB the Query calls of the appends are
// counted at the client. A connection answered 410 is dropped from the kept listing: the
// next append posts to it no more (no second removal). Every watcher holds every event
// after its offset once, and the unsubscribed one nothing after it left.
func TestSubscriptionsListedOncePerSubscribe(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		store := &counted{}
		r := newRig(rigOptions{wrap: func(s contract.PushStore) contract.PushStore { store.PushStore = s; return store }})
		cur := r.run("r1")
		i := 0
		// appends appends n one-event batches at the writer's cursor and returns the
		// subscription listings they cost and, on DynamoDB, the Query calls of all but
		// the first (the first may step over a marker and read the log: more Queries).
		appends := func(n int) (lists, laterQueries int) {
			t.Helper()
			l0, _ := store.counts()
			q0 := 0
			for j := range n {
				if j == 1 && r.calls != nil {
					q0 = r.calls.Calls("Query")
				}
				cur = r.append("r1", cur, i, 1, 0)
				i++
			}
			l1, _ := store.counts()
			if r.calls != nil && n > 1 {
				laterQueries = r.calls.Calls("Query") - q0
			}
			return l1 - l0, laterQueries
		}
		want := func(what string, n, wantLists int) {
			t.Helper()
			lists, later := appends(n)
			if lists != wantLists || later != 0 {
				t.Fatalf("%s: %d appends listed subscriptions %d times, want %d; %d Query calls after the first append, want none",
					what, n, lists, wantLists, later)
			}
		}
		want("no watcher yet", 3, 1)
		r.connect("c1")
		r.send("c1", `{"type":"subscribe","runId":"r1"}`)
		want("one watcher", 8, 1)
		r.connect("c2")
		r.send("c2", `{"type":"subscribe","runId":"r1","after":2}`)
		want("a second watcher", 4, 1)
		w1 := r.watch("c1", "r1", 0)
		w1.catchUp()
		r.send("c1", fmt.Sprintf(`{"type":"subscribe","runId":"r1","after":%d}`, w1.last))
		want("a re-subscribe", 4, 1)
		if why := r.watch("c2", "r1", 2).check(2, false); why != "" {
			t.Fatalf("c2: %s", why)
		}
		r.send("c2", `{"type":"unsubscribe","runId":"r1"}`)
		left := len(r.standin.Messages(t, "c2"))
		want("an unsubscribe", 4, 1)
		if n := len(r.standin.Messages(t, "c2")); n != left {
			t.Fatalf("c2 was posted %d messages after it unsubscribed", n-left)
		}
		if why := w1.check(0, false); why != "" {
			t.Fatalf("c1: %s", why)
		}
		// Gone: the first post answers 410 and removes c1; the kept listing forgets it.
		r.standin.Gone("c1")
		_, d0 := store.counts()
		if lists, _ := appends(3); lists != 0 { // (removing c1 queries its subscriptions on DynamoDB)
			t.Fatalf("a gone watcher: 3 appends listed subscriptions %d times, want none", lists)
		}
		if _, d1 := store.counts(); d1-d0 != 1 {
			t.Fatalf("a gone connection was removed %d times by 3 appends, want once", d1-d0)
		}
	})
}

// markFails is a log whose MarkWatch fails as a table that cannot be written would.
type markFails struct{ contract.EventLog }

var errMarkFails = errors.New("the table refused the watch marker")

func (markFails) MarkWatch(context.Context, string) error { return errMarkFails }

// TestSubscribeWithoutItsMarkerEnds (both backends): a subscribe whose watch marker cannot
// be put (its subscription item already written) removes that subscription and answers
// the error: the watcher is told, is not subscribed, and is posted nothing later — a
// subscription kept without its marker could miss a write and never learn it.
func TestSubscribeWithoutItsMarkerEnds(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		r := newRig(rigOptions{log: func(l contract.EventLog) contract.EventLog { return markFails{l} }})
		cur := r.run("r1")
		cur = r.append("r1", cur, 0, 1, 0)
		r.connect("c1")
		if err := r.routes.Message(r.t.Context(), "c1", "req-1", []byte(`{"type":"subscribe","runId":"r1"}`)); !errors.Is(err, errMarkFails) {
			t.Fatalf("subscribe answered %v, want the marker's error", err)
		}
		msgs := r.standin.Messages(t, "c1")
		if len(msgs) != 1 || msgs[0].Type != wire.PushError || msgs[0].Problem == nil || msgs[0].Problem.RequestID != "req-1" {
			t.Fatalf("the watcher was told %+v, want one error message for req-1", msgs)
		}
		subs, err := r.store.Subscriptions(r.ctx(), "r1")
		if err != nil || len(subs) != 0 {
			t.Fatalf("subscriptions after the failed subscribe: %+v (%v), want none", subs, err)
		}
		r.append("r1", cur, 1, 1, 0)
		if got := r.standin.Messages(t, "c1"); len(got) != 1 {
			t.Fatalf("posted after the failed subscribe: %+v", got[1:])
		}
	})
}
