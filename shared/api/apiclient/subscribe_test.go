package apiclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// subBackends are the two backends a subscription is tested on.
var subBackends = map[string]func(t *testing.T) contract.Backend{
	"memstore": func(t *testing.T) contract.Backend { return memstore.New() },
	"dynalite": func(t *testing.T) contract.Backend {
		client := dynamotest.Client(t)
		return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
	},
}

// subServer is the real handler set behind a real HTTP server that counts what the
// subscriptions asked of it.
type subServer struct {
	*httptest.Server
	upgrades  atomic.Int64 // requests for GET /v1/subscribe (answered or not)
	longPolls atomic.Int64 // GET …/events with a waitMs
}

// cutter is an HTTP client whose connections the test can cut: the subscriber's network
// drops, while the writer's connections stay.
type cutter struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (c *cutter) client() *http.Client {
	d := &net.Dialer{}
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err == nil {
			c.mu.Lock()
			c.conns = append(c.conns, conn)
			c.mu.Unlock()
		}
		return conn, err
	}}}
}

// cut closes every connection made so far (push connections included).
func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

// newSubServer serves the API over b; push turns the push endpoint on.
func newSubServer(t *testing.T, b contract.Backend, push bool) *subServer {
	t.Helper()
	k, quiet := newKeeper(t, b)
	cfg := httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{}, CursorKey: []byte("0123456789abcdef0123456789abcdef"), Logger: quiet}
	if push {
		cfg.Push = &httpapi.PushConfig{PageLimit: 3} // several pages of catch-up
	}
	h := httpapi.New(cfg)
	s := &subServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == wire.SubscribePath:
			s.upgrades.Add(1)
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/events") && r.URL.Query().Get("waitMs") != "":
			s.longPolls.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { k.Drain(); s.Close() })
	return s
}

// newKeeper is a keeper over b with the local-process provider and a silent logger (which
// it returns for the API in front of it); the caller drains it.
func newKeeper(t *testing.T, b contract.Backend) (*keeper.Keeper, *slog.Logger) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{localprocess.New(t.TempDir())}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return k, quiet
}

// jwtFront is API Gateway's JWT authorizer in front of api: a bearer "jwt-of-<tenant>"
// reaches api with that tenant's claims, anything else is 401. It counts the ticket
// requests in tickets and, with noTicketRoute, answers them 404 (a deployment without
// the route).
func jwtFront(api http.Handler, tickets *atomic.Int64, noTicketRoute bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer jwt-of-")
		if !ok {
			http.Error(w, "no JWT", http.StatusUnauthorized)
			return
		}
		if r.URL.Path == wire.PushTicketPath {
			tickets.Add(1)
			if noTicketRoute {
				http.NotFound(w, r)
				return
			}
		}
		api.ServeHTTP(w, r.WithContext(httpapi.WithJWTClaims(r.Context(), map[string]string{"tenant": tenant})))
	}
}

// writer drives runs through the API: start, appends, finish.
type writer struct {
	t       *testing.T
	c       *apiclient.Client
	mu      sync.Mutex
	cursors map[string]string
	last    map[string]int64
}

func newWriter(t *testing.T, c *apiclient.Client, runs ...string) *writer {
	w := &writer{t: t, c: c, cursors: map[string]string{}, last: map[string]int64{}}
	for _, r := range runs {
		st, err := c.Start(t.Context(), startReq(r, "thread-"+r))
		if err != nil {
			t.Fatal(err)
		}
		w.cursors[r] = st.Cursor
	}
	return w
}

// append stores n events {"run":…, "n":…} on run.
func (w *writer) append(run string, n int) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := make([]wire.EventIn, n)
	for i := range evs {
		evs[i] = wire.EventIn{Data: json.RawMessage(fmt.Sprintf(`{"run":%q,"n":%d}`, run, w.last[run]+int64(i)+1))}
	}
	res, err := w.c.Append(w.t.Context(), run, wire.AppendRequest{Cursor: w.cursors[run], Events: evs})
	if err != nil {
		w.t.Error(err)
		return
	}
	w.cursors[run], w.last[run] = res.Cursor, res.LastOffset
}

func (w *writer) finish(run string) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.c.Finish(w.t.Context(), run, wire.FinishRequest{Cursor: w.cursors[run], Status: string(contract.StatusCompleted)}); err != nil {
		w.t.Error(err)
	}
}

// collected is what a subscription delivered per run.
type collected struct {
	offsets map[string][]int64
	closed  map[string]int64 // the Next of each run's close
	refused map[string]error
}

// drain calls Next until no run is open; onTransient (if set) handles a transient failure
// and says whether to go on. It checks each run's order as it goes: every offset above
// the previous one (offsets are unique and increasing, not dense).
func drain(ctx context.Context, sub *apiclient.Subscription, onEvents func(apiclient.Update), onTransient func(error) bool) (collected, error) {
	got := collected{offsets: map[string][]int64{}, closed: map[string]int64{}, refused: map[string]error{}}
	for {
		u, err := sub.Next(ctx)
		switch {
		case errors.Is(err, apiclient.ErrNoSubscriptions):
			return got, nil
		case err != nil && apiclient.Transient(err) && onTransient != nil && onTransient(err):
			continue
		case err != nil:
			return got, err
		}
		if _, done := got.closed[u.RunID]; done {
			return got, fmt.Errorf("run %s: an update after its close", u.RunID)
		}
		if u.Err != nil {
			got.refused[u.RunID] = u.Err
			continue
		}
		for _, e := range u.Events {
			o := got.offsets[u.RunID]
			if len(o) > 0 && e.Offset <= o[len(o)-1] {
				return got, fmt.Errorf("run %s: offset %d after %d", u.RunID, e.Offset, o[len(o)-1])
			}
			var v struct{ N int64 }
			if json.Unmarshal(e.Data, &v) != nil || v.N == 0 {
				return got, fmt.Errorf("run %s: event %s", u.RunID, e.Data)
			}
			got.offsets[u.RunID] = append(o, e.Offset)
		}
		if onEvents != nil && len(u.Events) > 0 {
			onEvents(u)
		}
		if u.Closed {
			got.closed[u.RunID] = u.Next
		}
	}
}

// wantRange fails unless offsets are exactly from+1..to (the runs here have no fence).
func wantRange(t *testing.T, run string, offsets []int64, from, to int64) {
	t.Helper()
	if int64(len(offsets)) != to-from {
		t.Fatalf("run %s: %d events %v, want offsets %d..%d", run, len(offsets), offsets, from+1, to)
	}
	for i, o := range offsets {
		if o != from+int64(i)+1 {
			t.Fatalf("run %s: offsets %v, want %d..%d", run, offsets, from+1, to)
		}
	}
}

// TestSubscribe: one subscription follows two runs from different offsets while they are
// appended to and finished — every later event once, in order, then each run's close — and
// an unknown run is refused alone; over push where the server offers it (one upgrade, no
// long poll) and over long polls where it does not (its upgrade answered 404), on both
// backends.
func TestSubscribe(t *testing.T) {
	for name, nb := range subBackends {
		for _, push := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/push=%v", name, push), func(t *testing.T) {
				srv := newSubServer(t, nb(t), push)
				c := newClient(t, apiclient.Config{BaseURL: srv.URL})
				w := newWriter(t, c, "run-a", "run-b")
				w.append("run-a", 4)
				w.append("run-b", 5)
				sub := c.Subscribe(t.Context(), map[string]int64{"run-a": 0, "run-b": 2, "nope": 0})
				defer sub.Close()
				done := make(chan struct{})
				var once sync.Once
				wdone := make(chan struct{})
				go func() {
					defer close(wdone)
					// Appends race the subscribe and the catch-up, then both runs end.
					<-done
					for i := range 6 {
						w.append("run-a", 1+i%3)
						w.append("run-b", 2)
					}
					w.finish("run-a")
					w.finish("run-b")
				}()
				got, err := drain(t.Context(), sub, func(apiclient.Update) { once.Do(func() { close(done) }) }, nil)
				if err != nil {
					t.Fatal(err)
				}
				<-wdone
				wantRange(t, "run-a", got.offsets["run-a"], 0, w.last["run-a"])
				wantRange(t, "run-b", got.offsets["run-b"], 2, w.last["run-b"])
				if got.closed["run-a"] != w.last["run-a"] || got.closed["run-b"] != w.last["run-b"] {
					t.Fatalf("closes %v, last offsets %v", got.closed, w.last)
				}
				if err := got.refused["nope"]; !errors.Is(err, contract.ErrUnknownRun) || len(got.refused) != 1 {
					t.Fatalf("refusals %v", got.refused)
				}
				want := apiclient.ViaPoll
				if push {
					want = apiclient.ViaPush
				}
				if v := sub.Via(); v != want {
					t.Fatalf("via %q, want %q", v, want)
				}
				ups, polls := srv.upgrades.Load(), srv.longPolls.Load()
				if ups != 1 || (push && polls != 0) || (!push && polls == 0) {
					t.Fatalf("the server saw %d upgrades and %d long polls", ups, polls)
				}
			})
		}
	}
}

// TestSubscribeResumes: the network drops every connection twice mid-stream; each Next
// after the transient failure reconnects and resumes after the last offset delivered, so
// the runs' events still arrive once each, in order — on both transports and backends.
func TestSubscribeResumes(t *testing.T) {
	for name, nb := range subBackends {
		for _, push := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/push=%v", name, push), func(t *testing.T) {
				srv := newSubServer(t, nb(t), push)
				c := newClient(t, apiclient.Config{BaseURL: srv.URL})
				w := newWriter(t, c, "run-a", "run-b")
				w.append("run-a", 7)
				w.append("run-b", 7)
				net := &cutter{}
				sc := newClient(t, apiclient.Config{BaseURL: srv.URL, HTTPClient: net.client()})
				sub := sc.Subscribe(t.Context(), map[string]int64{"run-a": 1})
				defer sub.Close()
				sub.Add("run-b", 0)
				var drops, failures atomic.Int64
				wrote := make(chan struct{}, 64)
				wdone := make(chan struct{})
				go func() {
					defer close(wdone)
					for i := 0; i < 12; i++ {
						<-wrote
						w.append("run-a", 2)
						w.append("run-b", 1)
					}
					w.finish("run-a")
					w.finish("run-b")
				}()
				got, err := drain(t.Context(), sub, func(u apiclient.Update) {
					// Cut the network after the 2nd and the 5th update, with events
					// still in flight; every update lets the writer go on.
					if n := drops.Add(1); n == 2 || n == 5 {
						net.cut()
					}
					wrote <- struct{}{}
				}, func(err error) bool {
					return failures.Add(1) <= 10
				})
				if err != nil {
					t.Fatal(err)
				}
				<-wdone
				wantRange(t, "run-a", got.offsets["run-a"], 1, w.last["run-a"])
				wantRange(t, "run-b", got.offsets["run-b"], 0, w.last["run-b"])
				if push && failures.Load() == 0 {
					t.Fatal("no transient failure: the cut did not reach the subscription")
				}
				if push && srv.upgrades.Load() < 2 {
					t.Fatalf("%d upgrades: the subscription did not reconnect over push", srv.upgrades.Load())
				}
				if push && srv.longPolls.Load() != 0 {
					t.Fatalf("%d long polls on a push server", srv.longPolls.Load())
				}
			})
		}
	}
}

// TestSubscribeFallsBackOnFailedConnection: a push endpoint that cannot be reached (no
// listener) is a failed connection, and the subscription long-polls the API instead.
func TestSubscribeFallsBackOnFailedConnection(t *testing.T) {
	srv := newSubServer(t, memstore.New(), true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String() + wire.SubscribePath
	ln.Close()
	c := newClient(t, apiclient.Config{BaseURL: srv.URL, PushURL: dead})
	w := newWriter(t, c, "run-a")
	w.append("run-a", 3)
	w.finish("run-a")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sub := c.Subscribe(ctx, map[string]int64{"run-a": 0})
	defer sub.Close()
	got, err := drain(ctx, sub, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantRange(t, "run-a", got.offsets["run-a"], 0, 3)
	if sub.Via() != apiclient.ViaPoll || srv.upgrades.Load() != 0 || srv.longPolls.Load() == 0 {
		t.Fatalf("via %s, %d upgrades, %d long polls", sub.Via(), srv.upgrades.Load(), srv.longPolls.Load())
	}
}

// TestSubscribeJWTPushTicket: a JWT (Bearer) client asks POST /v1/push/ticket for a ticket
// and the push URL, and upgrades with ?ticket= and no JWT, as a JWT deployment's WebSocket
// API takes it (docs/design.md §8.1). The server is the real handler set in JWT mode (a
// stand-in of API Gateway's JWT authorizer turns the bearer token into claims) and, at
// the push URL, a stand-in of $connect that verifies the ticket with shiptoken, refuses an
// upgrade carrying the JWT, and serves the real push protocol as the ticket's tenant.
func TestSubscribeJWTPushTicket(t *testing.T) {
	t.Parallel()
	k, quiet := newKeeper(t, memstore.New())
	key := []byte("0123456789abcdef0123456789abcdef")
	var tickets, connects, refused atomic.Int64
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { k.Drain(); srv.Close() })
	api := httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.JWTAuth{}, CursorKey: key, Logger: quiet,
		PushTicketURL: "ws" + strings.TrimPrefix(srv.URL, "http") + "/push"})
	dev := httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{}, CursorKey: key, Logger: quiet, Push: &httpapi.PushConfig{}})
	mux.Handle("/", jwtFront(api, &tickets, false))
	mux.HandleFunc("/push", func(w http.ResponseWriter, r *http.Request) {
		connects.Add(1)
		tenant, err := shiptoken.VerifyPushTicket(key, r.URL.Query().Get(wire.PushTicketQuery), time.Now())
		if err != nil || r.Header.Get("Authorization") != "" || r.Header.Get(apiclient.TenantHeader) != "" {
			refused.Add(1)
			http.Error(w, "bad ticket", http.StatusUnauthorized)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawQuery, r2.Host = wire.SubscribePath, "", "127.0.0.1"
		r2.Header.Set(apiclient.TenantHeader, tenant)
		dev.ServeHTTP(w, r2)
	})
	c := newClient(t, apiclient.Config{BaseURL: srv.URL, Auth: apiclient.StaticToken("jwt-of-acme")})
	w := newWriter(t, c, "run-a")
	w.append("run-a", 3)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	sub := c.Subscribe(ctx, map[string]int64{"run-a": 0})
	defer sub.Close()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		w.append("run-a", 2)
		w.finish("run-a")
	}()
	got, err := drain(ctx, sub, nil, nil)
	<-wrote // the close can reach the reader before the finish's answer reaches the writer
	if err != nil {
		t.Fatal(err)
	}
	wantRange(t, "run-a", got.offsets["run-a"], 0, 5)
	if sub.Via() != apiclient.ViaPush || tickets.Load() != 1 || connects.Load() != 1 || refused.Load() != 0 {
		t.Fatalf("via %s, %d tickets, %d connects (%d refused)", sub.Via(), tickets.Load(), connects.Load(), refused.Load())
	}
	// Another tenant's client never sees acme's run: its subscribe is unknown-run.
	other := newClient(t, apiclient.Config{BaseURL: srv.URL, Auth: apiclient.StaticToken("jwt-of-other")})
	osub := other.Subscribe(ctx, map[string]int64{"run-a": 0})
	defer osub.Close()
	u, err := osub.Next(ctx)
	var ae *apiclient.Error
	if err != nil || !errors.As(u.Err, &ae) || ae.Code != wire.CodeUnknownRun || len(u.Events) != 0 || osub.Via() != apiclient.ViaPush {
		t.Fatalf("other tenant's subscribe: %+v %v via %s", u, err, osub.Via())
	}
}

// TestSubscribeJWTFallsBackWithoutPush: a JWT (Bearer) client against a deployment that
// offers no push — its ticket route answers 501 (push off: the real handler with no push
// URL), or 404 (a deployment from before the route) — reads by long polls instead: every
// event once, then the close, with one ticket request (docs/design.md §8.1). A client that
// surfaced the refused ticket as the subscription's error fails it.
func TestSubscribeJWTFallsBackWithoutPush(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusNotImplemented, http.StatusNotFound} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			k, quiet := newKeeper(t, memstore.New())
			api := httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.JWTAuth{}, CursorKey: []byte("0123456789abcdef0123456789abcdef"), Logger: quiet})
			var tickets atomic.Int64
			srv := httptest.NewServer(jwtFront(api, &tickets, status == http.StatusNotFound))
			t.Cleanup(func() { k.Drain(); srv.Close() })
			c := newClient(t, apiclient.Config{BaseURL: srv.URL, Auth: apiclient.StaticToken("jwt-of-acme")})
			w := newWriter(t, c, "run-a")
			w.append("run-a", 3)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			sub := c.Subscribe(ctx, map[string]int64{"run-a": 0})
			defer sub.Close()
			wrote := make(chan struct{})
			go func() {
				defer close(wrote)
				w.append("run-a", 2)
				w.finish("run-a")
			}()
			got, err := drain(ctx, sub, nil, nil)
			<-wrote // the close can reach the reader before the finish's answer reaches the writer
			if err != nil {
				t.Fatal(err)
			}
			wantRange(t, "run-a", got.offsets["run-a"], 0, 5)
			if sub.Via() != apiclient.ViaPoll || tickets.Load() != 1 {
				t.Fatalf("via %s after %d ticket requests; want long polls after one", sub.Via(), tickets.Load())
			}
		})
	}
}

// TestSubscribeHealsCrossedPosts: a deployed push endpoint (a scripted WebSocket server)
// posts a batch that begins past what the client holds (after 3, the client holds 0) —
// another writer's earlier post has not arrived. The client must drop it and subscribe
// again after 0; the catch-up then brings 1–6 (and the crossed batch again, dropped), then
// the close: each event delivered once, in order.
func TestSubscribeHealsCrossedPosts(t *testing.T) {
	t.Parallel()
	subs := make(chan int64, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.PushSubprotocol}})
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		send := func(m wire.PushMessage) { _ = c.Write(ctx, websocket.MessageText, httpapi.EncodePush(m)) }
		evs := func(from, to int64) []contract.Event {
			var out []contract.Event
			for o := from; o <= to; o++ {
				out = append(out, contract.Event{Offset: o, Data: json.RawMessage(fmt.Sprint(o))})
			}
			return out
		}
		at := func(n int64) *int64 { return &n }
		for n := 0; ; n++ {
			_, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			var req wire.PushRequest
			_ = json.Unmarshal(b, &req)
			subs <- *req.After
			send(wire.PushMessage{Type: wire.PushSubscribed, RunID: "r1", Next: *req.After})
			if n == 0 { // the second writer's batch arrives first
				send(wire.PushMessage{Type: wire.PushEvents, RunID: "r1", Events: evs(4, 6), Next: 6, After: at(3)})
				continue
			}
			send(wire.PushMessage{Type: wire.PushEvents, RunID: "r1", Events: evs(1, 3), Next: 3, After: at(0)})
			send(wire.PushMessage{Type: wire.PushEvents, RunID: "r1", Events: evs(4, 6), Next: 6, After: at(3)}) // the catch-up's page
			send(wire.PushMessage{Type: wire.PushEvents, RunID: "r1", Events: evs(4, 6), Next: 6, After: at(3)}) // the crossed post, late
			send(wire.PushMessage{Type: wire.PushClosed, RunID: "r1", Next: 7, After: at(6)})
		}
	}))
	defer srv.Close()
	c, err := apiclient.New(apiclient.Config{BaseURL: srv.URL, Tenant: "acme", PushURL: "ws" + strings.TrimPrefix(srv.URL, "http")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	sub := c.Subscribe(ctx, map[string]int64{"r1": 0})
	defer sub.Close()
	var got []int64
	for {
		u, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("next: %v (got %v)", err, got)
		}
		for _, e := range u.Events {
			got = append(got, e.Offset)
		}
		if u.Closed {
			break
		}
	}
	if fmt.Sprint(got) != "[1 2 3 4 5 6]" || sub.Via() != apiclient.ViaPush {
		t.Fatalf("delivered %v via %s, want [1 2 3 4 5 6] via push", got, sub.Via())
	}
	if first, again := <-subs, <-subs; first != 0 || again != 0 {
		t.Fatalf("subscribed after %d, then after %d; want 0 and 0", first, again)
	}
}
