package faultrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// The push items (docs/design.md §8.1): with Config.Push every replica's keeper
// pushes what it stores through a push.Deliverer over the replica's own store (so the
// DynamoDB fault proxy reaches the push items too), and "watch" operations subscribe
// watchers through push.Routes. The hub below is the WebSocket API's management endpoint
// and the watchers' sockets at once; it fails posts the way a push service does:
//
//   - a post answered 5xx and not delivered (throttled): the watcher finds the hole at
//     its next message (apiclient.PushTake) and resumes from its last offset;
//   - a post delivered whose answer is lost (5xx): a later post repeats it, which the
//     watcher drops (at or below its last offset);
//   - a slow consumer: the post times out and the push service cuts the connection;
//     later posts to it are answered 410;
//   - a watcher's connection dropped mid-stream (a watch operation, or the slow cut):
//     it reconnects on a new connection id and subscribes after its last offset, and
//     its old connection answers 410 from then on, which must remove it.
//
// At the end every watcher resumes once more through a fault-free deliverer and must
// hold the run's whole log in order, every event once, and the close when it is closed.

// PushStats are the push items' counts.
type PushStats struct {
	Watchers, Resumes, Posts, Delivered, Dropped int
	// Missed counts messages a watcher dropped because one before it never arrived
	// (apiclient.PushTake): it subscribed again from its last offset.
	Missed int
	// Throttled, LostAnswers and Slow count the hub's injected post failures.
	Throttled, LostAnswers, Slow int
	// Answered410 counts connections answered 410 at least once; Kept410 those still
	// open in the clean store at the end (a removal failed under faults; TTL ends them).
	Answered410, Kept410 int
}

// The hub's post faults, by the count of posts it answers (deterministic, so a short run
// meets each): every throttleEvery-th post is throttled, every slowEvery-th meets a slow
// consumer, every lostEvery-th loses its answer.
const (
	throttleEvery = 13
	slowEvery     = 17
	lostEvery     = 11
)

type watcher struct {
	run        string
	conn       string
	last       int64
	got        []string
	closed     bool
	needResume bool // a subscribe failed or was refused: resume at the next watch
}

type pushHub struct {
	mu       sync.Mutex
	faulty   bool
	n        int                 // posts answered while faulty
	conns    map[string]*watcher // every connection id ever opened → its watcher
	gone     map[string]bool
	answered map[string]bool // connections answered 410
	byRun    map[string]*watcher
	watchers []*watcher
	nextConn int
	stats    PushStats
	problems []string
}

func newPushHub() *pushHub {
	return &pushHub{faulty: true, conns: map[string]*watcher{},
		gone: map[string]bool{}, answered: map[string]bool{}, byRun: map[string]*watcher{}}
}

var errPostFailed = errors.New("faultrun: push stand-in answered 500")

// Post is PostToConnection (push.Poster).
func (h *pushHub) Post(_ context.Context, connID string, msg []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stats.Posts++
	if h.gone[connID] {
		h.answered[connID] = true
		return fmt.Errorf("faultrun: post to %s: 410: %w", connID, push.ErrGone)
	}
	n := 0
	if h.faulty {
		h.n++
		n = h.n
	}
	switch {
	case n > 0 && n%throttleEvery == 0:
		h.stats.Throttled++
		return errPostFailed
	case n > 0 && n%slowEvery == 0:
		h.stats.Slow++
		h.gone[connID] = true
		return fmt.Errorf("faultrun: post to %s: the consumer took nothing in time: %w", connID, context.DeadlineExceeded)
	}
	h.deliver(connID, msg)
	if n > 0 && n%lostEvery == 0 {
		h.stats.LostAnswers++
		return errPostFailed
	}
	return nil
}

// deliver is the watcher's client: it keeps events after its last offset, in order.
func (h *pushHub) deliver(connID string, msg []byte) {
	w := h.conns[connID]
	if w == nil || w.conn != connID {
		h.problems = append(h.problems, fmt.Sprintf("push: a post reached connection %s, which no watcher holds", connID))
		return
	}
	var m wire.PushMessage
	if err := json.Unmarshal(msg, &m); err != nil {
		h.problems = append(h.problems, fmt.Sprintf("push: connection %s was sent %q", connID, msg))
		return
	}
	if m.RunID != w.run {
		h.problems = append(h.problems, fmt.Sprintf("push: connection %s of run %s was sent run %q", connID, w.run, m.RunID))
		return
	}
	switch m.Type {
	case wire.PushEvents, wire.PushClosed:
		evs, last, again := apiclient.PushTake(w.last, m.After, m.Events)
		if again { // a post before this one was missed: subscribe again from last
			h.stats.Missed++
			w.needResume = true
			return
		}
		h.stats.Dropped += len(m.Events) - len(evs)
		h.stats.Delivered += len(evs)
		for _, e := range evs {
			w.got = append(w.got, strings.TrimSuffix(encodeEvents([]contract.Event{e}), ";"))
		}
		w.last = last
		w.closed = w.closed || m.Type == wire.PushClosed
	case wire.PushError:
		w.needResume = true
	case wire.PushEventPart:
		h.problems = append(h.problems, "push: a workload event was cut into parts")
	}
}

// open gives w a new connection (its old one, if any, is gone: the push service answers
// 410 to it from now on) and returns it with the offset to resume after.
func (h *pushHub) open(w *watcher) (old, conn string, after int64) {
	h.nextConn++
	old, conn = w.conn, fmt.Sprintf("conn-%05d", h.nextConn)
	if old != "" {
		h.gone[old] = true
		h.stats.Resumes++
	}
	w.conn, w.needResume = conn, false
	h.conns[conn] = w
	return old, conn, w.last
}

// newDeliverer is the push of one replica's store b (which must keep push items).
func newDeliverer(b contract.Backend, hub push.Poster) (*push.Deliverer, contract.PushStore, error) {
	ps, ok := b.(contract.PushStore)
	if !ok {
		return nil, nil, fmt.Errorf("faultrun: push: backend %T keeps no push items", b)
	}
	return push.NewDeliverer(push.Config{Store: ps, Log: b.Log(), Poster: hub, Logger: slog.New(slog.DiscardHandler)}), ps, nil
}

// poster is the replicas' push poster: the hub, wrapped by Config.PushPoster.
func (w *workload) poster() push.Poster {
	if w.cfg.PushPoster != nil {
		return w.cfg.PushPoster(w.hub)
	}
	return w.hub
}

func newRoutes(k *keeper.Keeper, ps contract.PushStore, d *push.Deliverer) *push.Routes {
	return push.NewRoutes(push.RoutesConfig{Keeper: k, Store: ps, Deliverer: d, Logger: slog.New(slog.DiscardHandler)})
}

// watchOp subscribes a watcher to r, or drops a watcher's connection mid-stream and
// resumes it on a new one after its last offset.
func (w *workload) watchOp(ctx context.Context, rep int, r *runInfo, rng *rand.Rand) {
	if r == nil {
		w.count("watch", "no-run")
		return
	}
	h := w.hub
	h.mu.Lock()
	wt := h.byRun[r.id]
	action := "watch"
	switch {
	case wt == nil:
		wt = &watcher{run: r.id}
		h.byRun[r.id] = wt
		h.watchers = append(h.watchers, wt)
		h.stats.Watchers++
	case wt.needResume || h.gone[wt.conn]:
		action = "resume"
	case rng.IntN(3) == 0:
		action = "drop"
	default:
		h.mu.Unlock()
		w.count("watch", "watching")
		return
	}
	old, conn, after := h.open(wt)
	h.mu.Unlock()
	routes := w.routes[rep]
	if old != "" && rng.IntN(2) == 0 {
		// Half the dropped connections get their $disconnect; the others are removed by
		// the 410 their next post meets.
		_ = routes.Disconnect(ctx, old)
	}
	err := w.subscribe(ctx, routes, wt, conn, after)
	w.count(action, outcome(err))
}

// subscribe connects conn and subscribes it to wt's run after `after`.
func (w *workload) subscribe(ctx context.Context, routes *push.Routes, wt *watcher, conn string, after int64) error {
	err := routes.Connect(ctx, w.cfg.Tenant, conn)
	if err == nil {
		body, _ := json.Marshal(wire.PushRequest{Type: wire.PushSubscribe, RunID: wt.run, After: &after})
		err = routes.Message(ctx, conn, "faultrun", body)
	}
	if err != nil {
		w.hub.mu.Lock()
		wt.needResume = true
		w.hub.mu.Unlock()
	}
	return err
}

// checkPush resumes every watcher once more through a fault-free deliverer over the clean
// store, then checks that each holds its run's whole log (ids, read from the clean store)
// in order, every event once, and the close of a closed log; and that a connection
// answered 410 is removed.
func (w *workload) checkPush(ctx context.Context, logs map[string][]string, closed map[string]bool) {
	h := w.hub
	ps, ok := w.cfg.Clean.(contract.PushStore)
	if !ok {
		w.violate("push: the clean backend %T keeps no push items", w.cfg.Clean)
		return
	}
	k, err := keeper.New(keeper.Config{Backend: w.cfg.Clean, Now: w.now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		w.violate("push: clean keeper: %v", err)
		return
	}
	d, _, err := newDeliverer(w.cfg.Clean, h)
	if err != nil {
		w.violate("%v", err)
		return
	}
	routes := newRoutes(k, ps, d)
	h.mu.Lock()
	h.faulty = false
	watchers := slices.Clone(h.watchers)
	h.mu.Unlock()
	// One more write's push per watched run: a dropped connection still subscribed (no
	// $disconnect came, or its removal failed under a fault) is answered 410 and removed.
	for _, wt := range watchers {
		if err := d.Push(ctx, wt.run, 0); err != nil {
			w.violate("push: run %s: the final push failed: %v", wt.run, err)
		}
	}
	for _, wt := range watchers {
		h.mu.Lock()
		_, conn, after := h.open(wt)
		h.mu.Unlock()
		if err := w.subscribe(ctx, routes, wt, conn, after); err != nil {
			w.violate("push: run %s: the final resume failed: %v", wt.run, err)
			continue
		}
		h.mu.Lock()
		got, gotClosed := slices.Clone(wt.got), wt.closed
		h.mu.Unlock()
		want := logs[wt.run]
		if !slices.Equal(got, want) {
			i := 0
			for i < min(len(got), len(want)) && got[i] == want[i] {
				i++
			}
			w.violate("push: run %s: the watcher holds %d events, the log %d; they part at #%d (got %v, want %v)",
				wt.run, len(got), len(want), i, got[i:min(len(got), i+3)], want[i:min(len(want), i+3)])
		}
		if gotClosed != closed[wt.run] {
			w.violate("push: run %s: the watcher saw closed=%v, the log is closed=%v", wt.run, gotClosed, closed[wt.run])
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.problems {
		w.violate("%s", p)
	}
	for conn := range h.answered {
		h.stats.Answered410++
		if _, open, err := ps.ConnectionTenant(ctx, conn); err != nil || open {
			h.stats.Kept410++
		}
	}
}
