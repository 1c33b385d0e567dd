package push_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/pushtest"
)

const tenant = "acme"

// rig is one backend with the deployed push over it: a keeper whose log writes push
// (keeper.Config.Push), the WebSocket routes, and the management stand-in.
type rig struct {
	t       *testing.T
	backend contract.Backend
	store   contract.PushStore
	standin *pushtest.StandIn
	poster  push.Poster
	d       *push.Deliverer
	k       *keeper.Keeper
	routes  *push.Routes
	calls   *dynamotest.Counter // DynamoDB calls (nil on memstore)
	seq     int
}

// rigOptions vary a rig: wrap replaces the push store the deliverer and routes use (the
// seam a test breaks the switch-over at), poster wraps the management poster.
type rigOptions struct {
	wrap             func(contract.PushStore) contract.PushStore
	log              func(contract.EventLog) contract.EventLog // wraps the deliverer's log
	poster           func(push.Poster) push.Poster
	maxConnections   int
	maxSubscriptions int
}

// backends are the two backends every case runs on.
var backends = []struct {
	name string
	new  func(t *testing.T) (contract.Backend, *dynamotest.Counter)
}{
	{"memstore", func(t *testing.T) (contract.Backend, *dynamotest.Counter) { return memstore.New(), nil }},
	{"dynamodb", func(t *testing.T) (contract.Backend, *dynamotest.Counter) {
		c := dynamotest.NewCounter()
		client := dynamotest.Client(t, c.Attach)
		return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, dynamotest.Client(t))}), c
	}},
}

func eachBackend(t *testing.T, f func(t *testing.T, newRig func(rigOptions) *rig)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			f(t, func(o rigOptions) *rig {
				be, calls := b.new(t)
				return newRig(t, be, calls, o)
			})
		})
	}
}

func newRig(t *testing.T, be contract.Backend, calls *dynamotest.Counter, o rigOptions) *rig {
	t.Helper()
	si := pushtest.Start(t)
	m, err := push.NewManagement(si.Endpoint(), pushtest.Region, pushtest.Credentials(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var poster push.Poster = m
	if o.poster != nil {
		poster = o.poster(m)
	}
	store := be.(contract.PushStore)
	if o.wrap != nil {
		store = o.wrap(store)
	}
	logger := slog.New(slog.DiscardHandler)
	log := be.Log()
	if o.log != nil {
		log = o.log(log)
	}
	d := push.NewDeliverer(push.Config{Store: store, Log: log, Poster: poster, Logger: logger, PageLimit: 4})
	k, err := keeper.New(keeper.Config{Backend: be, Logger: logger, Push: d})
	if err != nil {
		t.Fatal(err)
	}
	r := push.NewRoutes(push.RoutesConfig{Keeper: k, Store: store, Deliverer: d, Logger: logger,
		MaxConnections: o.maxConnections, MaxSubscriptions: o.maxSubscriptions})
	return &rig{t: t, backend: be, store: store, standin: si, poster: poster, d: d, k: k, routes: r, calls: calls}
}

func (r *rig) ctx() context.Context { return contract.WithTenant(r.t.Context(), tenant) }

// run creates a run held at epoch 1 and returns its cursor.
func (r *rig) run(id string) contract.Cursor {
	r.t.Helper()
	_, _, err := r.backend.Runs().CreateClaimed(r.ctx(), contract.CreateClaimedRun{
		NewRun: contract.NewRun{RunID: id, ThreadID: "th-" + id, StartedAt: 1}, SandboxKey: "sk", LeaseUntil: time.Now().Add(time.Hour).UnixMilli(),
		Token: "create-" + id})
	if err != nil {
		r.t.Fatal(err)
	}
	return contract.Cursor{Epoch: 1, Next: 1}
}

// appendN appends n events (data {"i":from+j}, size bytes of padding when size > 0).
func (r *rig) append(runID string, cur contract.Cursor, from, n, size int) contract.Cursor {
	r.t.Helper()
	var evs []contract.Event
	for j := range n {
		evs = append(evs, contract.Event{Data: fmt.Appendf(nil, `{"i":%d,"pad":%q}`, from+j, strings.Repeat("x", size))})
	}
	res, err := r.k.Append(r.ctx(), runID, cur, evs)
	if err != nil {
		r.t.Fatalf("append: %v", err)
	}
	return res.Cursor
}

func (r *rig) connect(connID string) {
	r.t.Helper()
	if err := r.routes.Connect(r.t.Context(), tenant, connID); err != nil {
		r.t.Fatalf("connect %s: %v", connID, err)
	}
}

func (r *rig) send(connID, msg string) {
	r.t.Helper()
	r.seq++
	if err := r.routes.Message(r.t.Context(), connID, fmt.Sprintf("req%d", r.seq), []byte(msg)); err != nil {
		r.t.Fatalf("message %s: %v", msg, err)
	}
}

// watch is one watcher's client of a run on one connection, as apiclient.Subscription
// keeps it: each message through take (apiclient.PushTake; a test breaks it here), the
// events past its last offset delivered, and a message that begins past it dropped and
// the run subscribed again from it.
type watch struct {
	r         *rig
	conn, run string
	take      func(last int64, after *int64, evs []contract.Event) ([]contract.Event, int64, bool)
	seen      int // messages of conn taken
	last      int64
	got       []contract.Event
	parts     []wire.PushMessage
	closed    bool
	again     int // subscribes again
	problem   string
}

func (r *rig) watch(conn, run string, after int64) *watch {
	return &watch{r: r, conn: conn, run: run, last: after, take: apiclient.PushTake}
}

// catchUp takes every message conn was sent so far, in order, subscribing again where
// one was missed, until no new message arrives.
func (w *watch) catchUp() {
	w.r.t.Helper()
	for {
		msgs := w.r.standin.Messages(w.r.t, w.conn)
		if w.seen >= len(msgs) {
			return
		}
		for ; w.seen < len(msgs); w.seen++ {
			w.one(msgs[w.seen])
		}
	}
}

func (w *watch) one(m wire.PushMessage) {
	var evs []contract.Event
	after := m.After
	switch {
	case m.RunID != w.run:
		w.problem = "a message of another run: " + m.RunID
		return
	case w.closed:
		return // the client has left the run
	case m.Type == wire.PushSubscribed:
		w.parts = nil
		return
	case m.Type == wire.PushEvents:
		evs = m.Events
	case m.Type == wire.PushEventPart:
		if len(w.parts) > 0 && w.parts[0].Offset != m.Offset {
			w.parts = nil // another event's parts: two posters crossed
		}
		if w.parts = append(w.parts, m); !m.Final {
			return
		}
		e, ok := wire.PushEventParts(w.parts)
		after, evs, w.parts = w.parts[0].After, []contract.Event{e}, nil
		if !ok { // two posters' parts of one event interleaved: read it again
			one := w.last + 1
			after, evs = &one, nil
		}
	case m.Type == wire.PushClosed:
	default:
		w.problem = "unexpected message " + m.Type
		return
	}
	got, last, again := w.take(w.last, after, evs)
	if again {
		w.again++
		w.r.send(w.conn, fmt.Sprintf(`{"type":"subscribe","runId":%q,"after":%d}`, w.run, w.last))
		return
	}
	w.got, w.last = append(w.got, got...), last
	w.closed = m.Type == wire.PushClosed
}

// check takes what arrived, then compares it with the run's stored events after
// `after`: each once, in order, then closed when wantClosed; it returns what is wrong
// ("" when nothing).
func (w *watch) check(after int64, wantClosed bool) string {
	w.catchUp()
	if w.problem != "" {
		return w.problem
	}
	var want []contract.Event
	for _, e := range w.r.stored(w.run) {
		if e.Offset > after {
			want = append(want, e)
		}
	}
	got := w.got
	if len(got) != len(want) {
		return fmt.Sprintf("%d events delivered, want %d (offsets %v, want %v)", len(got), len(want), offsets(got), offsets(want))
	}
	for i := range got {
		if got[i].Offset != want[i].Offset || string(got[i].Data) != string(want[i].Data) {
			return fmt.Sprintf("event %d: offset %d, want %d (offsets %v)", i, got[i].Offset, want[i].Offset, offsets(got))
		}
	}
	if w.closed != wantClosed {
		return fmt.Sprintf("closed %v, want %v", w.closed, wantClosed)
	}
	return ""
}

func offsets(evs []contract.Event) []int64 {
	var out []int64
	for _, e := range evs {
		out = append(out, e.Offset)
	}
	return out
}

// stored reads runID's whole log.
func (r *rig) stored(runID string) []contract.Event {
	r.t.Helper()
	var out []contract.Event
	after := int64(0)
	for {
		res, err := r.k.Read(r.ctx(), runID, after, 1000, 0)
		if err != nil {
			r.t.Fatal(err)
		}
		out = append(out, res.Events...)
		if len(res.Events) == 0 {
			return out
		}
		after = res.Next
	}
}

// TestManagementPostIsSigV4ForExecuteAPI: a post reaches the stand-in signed with the
// SDK's SigV4 signer (the stand-in recomputes the signature over the body it received);
// a wrong secret is refused, and a gone connection is ErrGone.
func TestManagementPostIsSigV4ForExecuteAPI(t *testing.T) {
	si := pushtest.Start(t)
	m, err := push.NewManagement(si.Endpoint(), pushtest.Region, pushtest.Credentials(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Post(t.Context(), "L0SM9cOFvHcCIhw=", []byte(`{"type":"subscribed","runId":"r","next":0}`)); err != nil {
		t.Fatalf("post: %v (refused: %v)", err, si.Refused())
	}
	if p := si.Posts("L0SM9cOFvHcCIhw="); len(p) != 1 || string(p[0].Body) != `{"type":"subscribed","runId":"r","next":0}` {
		t.Fatalf("the stand-in recorded %+v", p)
	}
	bad, _ := push.NewManagement(si.Endpoint(), pushtest.Region, credentials.NewStaticCredentialsProvider(pushtest.AccessKey, "wrong", ""), nil)
	if err := bad.Post(t.Context(), "c1", []byte(`{}`)); err == nil || len(si.Refused()) != 1 || !strings.Contains(si.Refused()[0], "does not verify") {
		t.Fatalf("a wrong secret: %v, refused %v", err, si.Refused())
	}
	wrongRegion, _ := push.NewManagement(si.Endpoint(), "eu-west-1", pushtest.Credentials(), nil)
	if err := wrongRegion.Post(t.Context(), "c1", []byte(`{}`)); err == nil || !strings.Contains(si.Refused()[1], "region") {
		t.Fatalf("a wrong region: %v, refused %v", err, si.Refused())
	}
	si.Gone("c2")
	if err := m.Post(t.Context(), "c2", []byte(`{}`)); !errors.Is(err, push.ErrGone) {
		t.Fatalf("post to a gone connection: %v", err)
	}
	for _, e := range []string{"http://example.com/dev", "https://u:p@x.execute-api.us-east-1.amazonaws.com/dev", "ftp://127.0.0.1/x"} {
		if _, err := push.NewManagement(e, "us-east-1", pushtest.Credentials(), nil); err == nil {
			t.Errorf("endpoint %q accepted", e)
		}
	}
}

// TestCatchUpThenLiveEveryEventOnce (both backends): events stored before a subscribe,
// appended while it catches up and after it, a large event in parts, then the close:
// each watcher receives every event after its offset once, in order, then closed; a
// watcher resuming on a new connection from its last offset likewise. Every post fits a
// frame and verified.
func TestCatchUpThenLiveEveryEventOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		r := newRig(rigOptions{})
		cur := r.run("r1")
		cur = r.append("r1", cur, 0, 9, 0)
		r.connect("c1")
		r.connect("c2")
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // appends race the subscribes
			defer wg.Done()
			for i := range 6 {
				cur = r.append("r1", cur, 100+i*3, 3, 0)
			}
			cur = r.append("r1", cur, 200, 1, 40<<10) // one event over a frame: parts
		}()
		r.send("c1", `{"type":"subscribe","runId":"r1","after":3}`)
		r.send("c2", `{"type":"subscribe","runId":"r1"}`)
		wg.Wait()
		if _, err := r.k.Finish(r.ctx(), "r1", cur, keeper.FinishInput{Status: contract.StatusCompleted}); err != nil {
			t.Fatal(err)
		}
		for conn, after := range map[string]int64{"c1": 3, "c2": 0} {
			if why := r.watch(conn, "r1", after).check(after, true); why != "" {
				t.Errorf("%s: %s", conn, why)
			}
		}
		// A watcher that lost its connection after offset 12 resumes on a new one.
		r.connect("c3")
		r.send("c3", `{"type":"subscribe","runId":"r1","after":12}`)
		if why := r.watch("c3", "r1", 12).check(12, true); why != "" {
			t.Errorf("c3 (resumed after 12): %s", why)
		}
		for _, p := range r.standin.Posts("") {
			if len(p.Body) > wire.MaxPushMessageBytes {
				t.Errorf("a post of %d bytes, over the frame bound", len(p.Body))
			}
		}
		if len(r.standin.Refused()) > 0 {
			t.Errorf("refused signatures: %v", r.standin.Refused())
		}
		// A closed subscription is over: nothing left to query.
		if subs, _ := r.store.Subscriptions(r.ctx(), "r1"); len(subs) != 0 {
			t.Errorf("subscriptions left after the close: %+v", subs)
		}
	})
}

// emptyRead calls hook (once) when the deliverer's log answers an empty, open page: the
// moment after a subscribe's catch-up read its last page and before it ends. The hook's
// own write reads through it too (it steps over the subscribe's watch marker).
type emptyRead struct {
	contract.EventLog
	hook  func()
	fired atomic.Bool
}

func (g *emptyRead) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	evs, n, closed, err := g.EventLog.Read(ctx, runID, after, limit)
	if err == nil && len(evs) == 0 && !closed && g.fired.CompareAndSwap(false, true) {
		g.hook()
	}
	return evs, n, closed, err
}

// lateSubscribe is a push store whose Subscribe stores the subscription only when the
// test calls store (after the catch-up has read): a writer whose batch lands between
// the two finds nobody to post to, and the catch-up has read before it (the gap).
type lateSubscribe struct {
	contract.PushStore
	store func()
}

func (l *lateSubscribe) Subscribe(ctx context.Context, connID, runID string, after int64, max int) error {
	ctx = context.WithoutCancel(ctx)
	l.store = func() { _ = l.PushStore.Subscribe(ctx, connID, runID, after, max) }
	return nil
}

// TestSwitchOverHasNoGap (both backends): an append lands right after a subscribe's
// catch-up read its last (empty) page (gated at the log seam): its writer must find the
// subscription and post the event, so the watcher holds every event once and in order
// without another write. The same choreography against a subscribe broken in the test at
// the push-store seam — the subscription stored after the catch-up read instead of
// before — is caught.
func TestSwitchOverHasNoGap(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		for _, broken := range []bool{false, true} {
			name := map[bool]string{false: "correct", true: "broken: subscription stored after the catch-up read"}[broken]
			t.Run(name, func(t *testing.T) {
				late := &lateSubscribe{}
				var r *rig
				var cur contract.Cursor
				gate := &emptyRead{hook: func() {
					r.append("r1", cur, 3, 1, 0)
					if late.store != nil {
						late.store()
					}
				}}
				r = newRig(rigOptions{
					log: func(l contract.EventLog) contract.EventLog { gate.EventLog = l; return gate },
					wrap: func(s contract.PushStore) contract.PushStore {
						if !broken {
							return s
						}
						late.PushStore = s
						return late
					}})
				cur = r.run("r1")
				cur = r.append("r1", cur, 0, 3, 0)
				r.connect("c1")
				r.send("c1", `{"type":"subscribe","runId":"r1"}`)
				// The subscribe has returned, the gated append with it: whatever will be
				// delivered without another write has been.
				why := r.watch("c1", "r1", 0).check(0, false)
				switch {
				case !broken && why != "":
					t.Fatalf("correct switch-over: %s", why)
				case broken && why == "":
					t.Fatal("the broken switch-over went unnoticed")
				case broken:
					t.Logf("caught: %s", why)
				}
			})
		}
	})
}

// crossing is a poster that holds the post of the batch starting at offset at until
// the test releases it: another writer's later batch is posted first.
type crossing struct {
	push.Poster
	at      int64
	reached chan struct{}
	release chan struct{}
	held    atomic.Bool
}

func (c *crossing) Post(ctx context.Context, connID string, msg []byte) error {
	var m wire.PushMessage
	if json.Unmarshal(msg, &m) == nil && m.Type == wire.PushEvents && m.Events[0].Offset == c.at && m.After != nil && *m.After < c.at && c.held.CompareAndSwap(false, true) {
		close(c.reached)
		<-c.release
	}
	return c.Poster.Post(ctx, connID, msg)
}

// TestCrossedPostsEveryEventOnce (both backends): two writers race — the first's batch
// (offsets 5–7, past the subscribe's watch marker at 4) is stored, but its post is held at
// the poster seam until the second's batch (8–10) was stored and posted — so the watcher
// receives 8–10 first, then 5–7. It must see the hole, subscribe again from 3, and hold
// every event once, in order, then the close.
// A client broken in the test — one that ignores where a message begins (no subscribe
// again) — is caught.
func TestCrossedPostsEveryEventOnce(t *testing.T) {
	t.Parallel()
	ignoreAfter := func(last int64, _ *int64, evs []contract.Event) ([]contract.Event, int64, bool) {
		return apiclient.PushTake(last, nil, evs)
	}
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		for _, broken := range []bool{false, true} {
			name := map[bool]string{false: "correct", true: "broken: a client that does not subscribe again"}[broken]
			t.Run(name, func(t *testing.T) {
				cross := &crossing{at: 5, reached: make(chan struct{}), release: make(chan struct{})}
				r := newRig(rigOptions{poster: func(p push.Poster) push.Poster { cross.Poster = p; return cross }})
				cur := r.run("r1")
				cur = r.append("r1", cur, 0, 3, 0)
				r.connect("c1")
				r.send("c1", `{"type":"subscribe","runId":"r1"}`)
				w := r.watch("c1", "r1", 0)
				if broken {
					w.take = ignoreAfter
				}
				w.catchUp()
				first := make(chan contract.Cursor)
				go func() { first <- r.append("r1", cur, 3, 3, 0) }() // 5–7 (over the marker), its post held
				select {
				case <-cross.reached:
				case <-time.After(time.Minute): // a deadline, never a signal: the hold was never met
					t.Fatal("the first writer's post never reached the poster")
				}
				second := r.append("r1", contract.Cursor{Epoch: 1, Next: 8}, 6, 3, 0) // 8–10, posted
				w.catchUp()
				close(cross.release)
				<-first
				w.catchUp()
				if _, err := r.k.Finish(r.ctx(), "r1", second, keeper.FinishInput{Status: contract.StatusCompleted}); err != nil {
					t.Fatal(err)
				}
				why := w.check(0, true)
				switch {
				case !broken && why != "":
					t.Fatalf("crossed posts: %s", why)
				case !broken && w.again == 0:
					t.Fatal("the watcher never subscribed again: the posts did not cross")
				case broken && why == "":
					t.Fatal("the broken client went unnoticed")
				case broken:
					t.Logf("caught: %s", why)
				default:
					t.Logf("subscribed again %d time(s); %d messages", w.again, w.seen)
				}
			})
		}
	})
}

// TestBoundsAndRefusals (both backends): the tenant's connection bound refuses the upgrade
// with too-many-connections; the connection's subscription bound answers
// too-many-subscriptions; another tenant's run and an unknown run are answered
// unknown-run and nothing else (no subscription); a malformed message is invalid and the
// connection stays; a gone connection (410) is removed with its subscriptions.
func TestBoundsAndRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, newRig func(rigOptions) *rig) {
		r := newRig(rigOptions{maxConnections: 2, maxSubscriptions: 2})
		r.connect("c1")
		r.connect("c2")
		err := r.routes.Connect(t.Context(), tenant, "c3")
		if m, _ := httpapi.PushError("", err, "x"); err == nil || m.Problem.Code != httpapi.CodeTooManyConnections || m.Problem.Status != 429 {
			t.Fatalf("a third connection: %v", err)
		}
		if err := r.routes.Connect(t.Context(), "other", "o1"); err != nil {
			t.Fatalf("another tenant's connection: %v", err)
		}
		cur := r.run("r1")
		r.run("r2")
		r.run("r3")
		// Another tenant's run of the same id.
		octx := contract.WithTenant(t.Context(), "other")
		if _, _, err := r.backend.Runs().CreateClaimed(octx, contract.CreateClaimedRun{NewRun: contract.NewRun{RunID: "theirs", ThreadID: "t"}, SandboxKey: "k", Token: "x"}); err != nil {
			t.Fatal(err)
		}
		only := func(conn string, n int, code string) {
			t.Helper()
			msgs := r.standin.Messages(t, conn)
			if len(msgs) != n || msgs[n-1].Type != wire.PushError || msgs[n-1].Problem == nil || msgs[n-1].Problem.Code != code {
				t.Fatalf("%s: %+v, want %d messages, the last an error %s", conn, msgs, n, code)
			}
		}
		r.send("c2", `{"type":"subscribe","runId":"theirs"}`)
		only("c2", 1, httpapi.CodeUnknownRun)
		r.send("c2", `{"type":"subscribe","runId":"nope"}`)
		only("c2", 2, httpapi.CodeUnknownRun)
		if subs, _ := r.backend.(contract.PushStore).Subscriptions(octx, "theirs"); len(subs) != 0 {
			t.Fatalf("a subscription to another tenant's run: %+v", subs)
		}
		r.send("c1", `{"type":"subscribe","runId":"r1"}`)
		r.send("c1", `{"type":"subscribe","runId":"r2"}`)
		r.send("c1", `{"type":"subscribe","runId":"r3"}`)
		r.send("c1", `{"type":"subscribe","runId":"r1","extra":1}`)
		msgs := r.standin.Messages(t, "c1")
		if len(msgs) != 4 || msgs[2].Problem == nil || msgs[2].Problem.Code != httpapi.CodeTooManySubscriptions || msgs[2].RunID != "r3" ||
			msgs[3].Problem == nil || msgs[3].Problem.Code != httpapi.CodeInvalid {
			t.Fatalf("c1: %+v", msgs)
		}
		// The connection stays: an append to r1 reaches it.
		cur = r.append("r1", cur, 0, 1, 0)
		if msgs := r.standin.Messages(t, "c1"); len(msgs) != 5 || msgs[4].Type != wire.PushEvents {
			t.Fatalf("c1 after an append: %+v", msgs)
		}
		// Gone: the next post answers 410; the connection and its subscriptions go.
		r.standin.Gone("c1")
		r.append("r1", cur, 1, 1, 0)
		if _, ok, _ := r.store.ConnectionTenant(t.Context(), "c1"); ok {
			t.Fatal("a gone connection was kept")
		}
		for _, run := range []string{"r1", "r2"} {
			if subs, _ := r.store.Subscriptions(r.ctx(), run); len(subs) != 0 {
				t.Fatalf("%s: subscriptions of a gone connection kept: %+v", run, subs)
			}
		}
		r.connect("c4") // its slot is free again
	})
}
