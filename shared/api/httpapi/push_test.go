package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/wakeset"
)

// pushEnv is an API with the push endpoint behind a real HTTP server.
type pushEnv struct {
	*env
	k   *keeper.Keeper
	srv *httptest.Server
}

func newPushEnv(t *testing.T, b contract.Backend, pc PushConfig, wake keeper.LogWake, opts ...func(*httptest.Server)) *pushEnv {
	t.Helper()
	loadSpec(t)
	if wake == nil {
		wake = &wakeset.Set[keeper.RunKey]{}
	}
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{localprocess.New(t.TempDir())}, Wake: wake})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	h := New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: []byte("test cursor key, 32 bytes long!!"),
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), Push: &pc})
	srv := httptest.NewUnstartedServer(h)
	for _, o := range opts {
		o(srv)
	}
	srv.Start()
	t.Cleanup(func() { k.Drain(); srv.Close() })
	return &pushEnv{env: &env{t: t, h: h, backend: b, logs: logs, auth: DevAuth{}}, k: k, srv: srv}
}

// dial opens a push connection as tenant.
func (e *pushEnv) dial(ctx context.Context, tenant string) (*websocket.Conn, *http.Response, error) {
	h := http.Header{}
	if tenant != "" {
		h.Set(TenantHeader, tenant)
	}
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.srv.URL, "http")+wire.SubscribePath,
		&websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{wire.PushSubprotocol}})
	if c != nil {
		c.SetReadLimit(1 << 20) // the test sees oversize frames rather than a read error
	}
	return c, resp, err
}

func (e *pushEnv) mustDial(tenant string) *websocket.Conn {
	e.t.Helper()
	c, _, err := e.dial(e.t.Context(), tenant)
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	e.t.Cleanup(func() { c.CloseNow() })
	return c
}

func subscribeMsg(c *websocket.Conn, ctx context.Context, runID string, after int64) error {
	b, _ := json.Marshal(wire.PushRequest{Type: wire.PushSubscribe, RunID: runID, After: &after})
	return c.Write(ctx, websocket.MessageText, b)
}

// readMsg reads one server message, failing on a frame over the bound.
func readMsg(ctx context.Context, c *websocket.Conn) (wire.PushMessage, error) {
	_, b, err := c.Read(ctx)
	if err != nil {
		return wire.PushMessage{}, err
	}
	if len(b) > wire.MaxPushMessageBytes {
		return wire.PushMessage{}, fmt.Errorf("a %d-byte message, over %d", len(b), wire.MaxPushMessageBytes)
	}
	var m wire.PushMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("message %q: %w", b, err)
	}
	return m, nil
}

// watch reads runID's subscription from after to its close and checks the stream: a
// subscribed first, then every offset after `after` exactly once and in order (parts
// joined), then closed at the last. It returns the events' data in order.
func watch(ctx context.Context, c *websocket.Conn, runID string, after int64) ([]json.RawMessage, error) {
	if err := subscribeMsg(c, ctx, runID, after); err != nil {
		return nil, err
	}
	var (
		out   []json.RawMessage
		next  = after
		parts []wire.PushMessage
	)
	deliver := func(e contract.Event) error {
		if e.Offset != next+1 {
			return fmt.Errorf("offset %d after %d: a gap or a duplicate", e.Offset, next)
		}
		next = e.Offset
		out = append(out, e.Data)
		return nil
	}
	for first := true; ; first = false {
		m, err := readMsg(ctx, c)
		if err != nil {
			return out, fmt.Errorf("after offset %d: %w", next, err)
		}
		if m.RunID != runID {
			return out, fmt.Errorf("a message for run %q", m.RunID)
		}
		if first != (m.Type == wire.PushSubscribed) {
			return out, fmt.Errorf("message %d is %q", len(out), m.Type)
		}
		switch m.Type {
		case wire.PushSubscribed:
		case wire.PushEvents:
			for _, e := range m.Events {
				if err := deliver(e); err != nil {
					return out, err
				}
			}
			if m.Next != next {
				return out, fmt.Errorf("events next %d, last offset %d", m.Next, next)
			}
		case wire.PushEventPart:
			if parts = append(parts, m); m.Final {
				e, ok := wire.PushEventParts(parts)
				parts = nil
				if !ok {
					return out, fmt.Errorf("parts of offset %d do not join into JSON", m.Offset)
				}
				if err := deliver(e); err != nil {
					return out, err
				}
			}
		case wire.PushClosed:
			if m.Next != next {
				return out, fmt.Errorf("closed at %d, delivered to %d", m.Next, next)
			}
			return out, nil
		default:
			return out, fmt.Errorf("unexpected %+v", m)
		}
	}
}

// TestPushCatchUpIsExact: watchers subscribing from every kind of offset while appends
// race the subscribe see each event after their offset once, in order, then the close —
// paged catch-up (a small page), then live delivery — on both backends.
func TestPushCatchUpIsExact(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newPushEnv(t, nb(t), PushConfig{PageLimit: 3}, nil)
		st := e.start("", "run-1", "thread-1")
		cursor := st.Cursor
		const batches = 30
		type result struct {
			after int64
			got   []json.RawMessage
			err   error
		}
		results := make(chan result, 16)
		watchers := 0
		spawn := func(after int64) {
			watchers++
			c := e.mustDial("")
			go func() {
				got, err := watch(t.Context(), c, "run-1", after)
				results <- result{after, got, err}
			}()
		}
		var last int64
		for b := 1; b <= batches; b++ {
			if b%5 == 1 {
				spawn(last) // from the tail, racing the next appends
			}
			if b%10 == 0 {
				spawn(last / 2) // a catch-up of several pages, then live
			}
			n := 1 + b%3
			data := make([]any, n)
			for i := range data {
				data[i] = map[string]any{"n": last + int64(i) + 1}
			}
			r := e.appendEvents("", "run-1", cursor, data...)
			ar := decode[wire.AppendResponse](t, r)
			cursor, last = ar.Cursor, ar.LastOffset
		}
		e.finish("", "run-1", cursor, "completed").wantStatus(t, http.StatusOK)
		spawn(1) // a closed log: pages, then closed
		for range watchers {
			r := <-results
			if r.err != nil {
				t.Fatalf("watcher after %d: %v", r.after, r.err)
			}
			if int64(len(r.got)) != last-r.after {
				t.Fatalf("watcher after %d got %d events, want %d", r.after, len(r.got), last-r.after)
			}
			for i, d := range r.got {
				var v struct{ N int64 }
				if err := json.Unmarshal(d, &v); err != nil || v.N != r.after+int64(i)+1 {
					t.Fatalf("watcher after %d: event %d is %s", r.after, i, d)
				}
			}
		}
	})
}

// seamLog runs afterRead once a read of the log returns an open, empty page: the test's
// way to land an append in the window between a subscription's read and its wait.
type seamLog struct {
	contract.EventLog
	afterRead func()
}

func (l seamLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	evs, next, closed, err := l.EventLog.Read(ctx, runID, after, limit)
	if err == nil && len(evs) == 0 && !closed && l.afterRead != nil {
		l.afterRead()
	}
	return evs, next, closed, err
}

// seamBackend is a backend whose log reads go through seamLog (it hides a LogWaker: the
// feed is the subscriptions' only wake).
type seamBackend struct {
	contract.Backend
	log *seamLog
}

func (b seamBackend) Log() contract.EventLog { return b.log }

// lateFeed is a broken switch-over: it subscribes to live wakes only after the read of
// the stored pages (pending until register), so an append in between is never pushed.
type lateFeed struct {
	inner   *wakeset.Set[keeper.RunKey]
	mu      sync.Mutex
	pending []func()
}

func (f *lateFeed) Wait(k keeper.RunKey) (<-chan struct{}, func()) {
	proxy := make(chan struct{})
	var once sync.Once
	stopped := make(chan struct{})
	f.mu.Lock()
	f.pending = append(f.pending, func() {
		ch, stop := f.inner.Wait(k)
		go func() {
			defer stop()
			select {
			case <-ch:
				once.Do(func() { close(proxy) })
			case <-stopped:
			}
		}()
	})
	f.mu.Unlock()
	return proxy, func() { close(stopped) }
}

func (f *lateFeed) Wake(k keeper.RunKey) { f.inner.Wake(k) }

// register subscribes the waits taken so far.
func (f *lateFeed) register() {
	f.mu.Lock()
	p := f.pending
	f.pending = nil
	f.mu.Unlock()
	for _, fn := range p {
		fn()
	}
}

// switchOver subscribes a watcher from the tail while, at the seam, an append lands
// between its first read and its wait; it reports whether that event reached the watcher
// before a later, unrelated deadline (the broken switch-over never delivers it).
func switchOver(t *testing.T, nb backendFactory, broken bool) error {
	real := &wakeset.Set[keeper.RunKey]{}
	var feed keeper.LogWake = real
	lf := &lateFeed{inner: real}
	if broken {
		feed = lf
	}
	sl := &seamLog{}
	inner := nb(t)
	sl.EventLog = inner.Log()
	// The keeper wakes the real set; the subscriptions wait on feed.
	e := newPushEnv(t, seamBackend{Backend: inner, log: sl}, PushConfig{Feed: feed}, real)
	st := e.start("", "run-1", "thread-1")
	ar := decode[wire.AppendResponse](t, e.appendEvents("", "run-1", st.Cursor, "one"))
	var once sync.Once
	landed := make(chan error, 1)
	sl.afterRead = func() {
		once.Do(func() {
			// Through the keeper, as POST /events does: it wakes the feed.
			ctx := contract.WithTenant(context.WithoutCancel(t.Context()), DefaultDevTenant)
			_, err := e.k.Append(ctx, "run-1", mustCursor(t, e, ar.Cursor), []contract.Event{{Data: json.RawMessage(`"two"`)}})
			landed <- err
			if broken {
				lf.register()
			}
		})
	}
	c := e.mustDial("")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if err := subscribeMsg(c, ctx, "run-1", ar.LastOffset); err != nil {
		t.Fatal(err)
	}
	if m, err := readMsg(ctx, c); err != nil || m.Type != wire.PushSubscribed {
		t.Fatalf("first message %+v, %v", m, err)
	}
	m, err := readMsg(ctx, c)
	if aerr := <-landed; aerr != nil {
		t.Fatalf("the seam's append: %v", aerr)
	}
	if err != nil {
		return fmt.Errorf("the event appended during the switch-over never arrived: %w", err)
	}
	if m.Type != wire.PushEvents || len(m.Events) != 1 || string(m.Events[0].Data) != `"two"` {
		return fmt.Errorf("got %+v", m)
	}
	return nil
}

// mustCursor decodes a cursor the API signed, as the append route does.
func mustCursor(t *testing.T, e *pushEnv, signed string) contract.Cursor {
	t.Helper()
	hh := e.h.(*handler)
	cl, err := hh.cursors.open(signed)
	if err != nil {
		t.Fatal(err)
	}
	return cl.cursor()
}

// TestPushSwitchOverHasNoGap: an append landing between a subscription's read of the
// stored log and its wait is pushed; a feed subscribed after the read (the broken
// switch-over, built here at the Feed seam) loses it — the check catches that.
func TestPushSwitchOverHasNoGap(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		if err := switchOver(t, nb, false); err != nil {
			t.Fatal(err)
		}
		if err := switchOver(t, nb, true); err == nil {
			t.Fatal("the broken switch-over passed the check")
		}
	})
}

// TestPushBounds: the tenant's connection cap (429 too-many-connections before the
// upgrade; another tenant unaffected), the connection's subscription cap, and a subscribe
// to an unknown run or another tenant's answered with unknown-run and nothing else.
func TestPushBounds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newPushEnv(t, nb(t), PushConfig{MaxConnections: 2, MaxSubscriptions: 2}, nil)
		e.start("", "run-1", "thread-1")
		e.start("", "run-2", "thread-2")
		e.start("", "run-3", "thread-3")
		e.start("other", "theirs", "thread-9")
		c := e.mustDial("")
		e.mustDial("")
		_, resp, err := e.dial(t.Context(), "")
		if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("a third connection: %v, %v", resp, err)
		}
		var p Problem
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Code != CodeTooManyConnections {
			t.Fatalf("refusal %+v, %v", p, err)
		}
		e.mustDial("other") // another tenant's cap is its own
		ctx := t.Context()
		for _, run := range []string{"nope", "theirs"} {
			if err := subscribeMsg(c, ctx, run, 0); err != nil {
				t.Fatal(err)
			}
			m, err := readMsg(ctx, c)
			if err != nil || m.Type != wire.PushError || m.RunID != run || m.Problem == nil || m.Problem.Code != CodeUnknownRun {
				t.Fatalf("subscribe %s: %+v, %v", run, m, err)
			}
		}
		for _, run := range []string{"run-1", "run-2", "run-3"} {
			if err := subscribeMsg(c, ctx, run, 0); err != nil {
				t.Fatal(err)
			}
		}
		// Nothing else came of the refused subscribes: the next messages are these.
		got := map[string]string{}
		for range 3 {
			m, err := readMsg(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			got[m.RunID] = m.Type
			if m.Type == wire.PushError {
				got[m.RunID] = m.Problem.Code
			}
		}
		want := map[string]string{"run-1": wire.PushSubscribed, "run-2": wire.PushSubscribed, "run-3": CodeTooManySubscriptions}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("got %v, want %v", got, want)
		}
		// Bad requests are problems too, and the connection stays.
		for _, bad := range []string{`{"type":"subscribe","runId":"a b"}`, `{"type":"x","runId":"run-1"}`, `{"type":"subscribe","runId":"run-1","after":-1}`, `[`, `{"type":"subscribe","runId":"run-1","tenant":"other"}`} {
			if err := c.Write(ctx, websocket.MessageText, []byte(bad)); err != nil {
				t.Fatal(err)
			}
			m, err := readMsg(ctx, c)
			if err != nil || m.Type != wire.PushError || m.Problem.Code != CodeInvalid || m.Problem.Status != http.StatusBadRequest {
				t.Fatalf("%s: %+v, %v", bad, m, err)
			}
		}
	})
}

// TestPushUpgradeRules: the dev server's Host rule and origin rule hold for the upgrade,
// and a plain GET is refused with a problem, not upgraded.
func TestPushUpgradeRules(t *testing.T) {
	b := backends()["memstore"](t)
	e := newPushEnv(t, b, PushConfig{}, nil)
	e.k.Config() // built
	_, port, _ := strings.Cut(strings.TrimPrefix(e.srv.URL, "http://"), ":")
	h := New(Config{Keeper: e.k, Auth: DevAuth{}, CursorKey: []byte("test cursor key, 32 bytes long!!"),
		AllowHost: LoopbackHost(port), Push: &PushConfig{}})
	e.srv.Config.Handler = h
	dial := func(hdr http.Header) *http.Response {
		t.Helper()
		_, resp, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(e.srv.URL, "http")+wire.SubscribePath, &websocket.DialOptions{HTTPHeader: hdr, Host: hdr.Get("Host")})
		if err == nil || resp == nil {
			t.Fatalf("upgrade with %v accepted", hdr)
		}
		return resp
	}
	code := func(resp *http.Response) string {
		var p Problem
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return p.Code
	}
	if r := dial(http.Header{"Host": {"evil.example:" + port}}); r.StatusCode != http.StatusForbidden || code(r) != CodeForbiddenHost {
		t.Fatalf("rebound Host: %d", r.StatusCode)
	}
	if r := dial(http.Header{"Origin": {"http://evil.example"}}); r.StatusCode != http.StatusForbidden || code(r) != CodeForbiddenOrigin {
		t.Fatalf("cross origin: %d", r.StatusCode)
	}
	resp, err := http.Get(e.srv.URL + wire.SubscribePath)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest || code(resp) != CodeInvalid {
		t.Fatalf("plain GET: %d", resp.StatusCode)
	}
	// The query names the tenant for a browser; the origin rule still holds.
	c, _, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(e.srv.URL, "http")+wire.SubscribePath+"?tenant=other",
		&websocket.DialOptions{HTTPHeader: http.Header{"Origin": {e.srv.URL}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if err := subscribeMsg(c, t.Context(), "run-x", 0); err != nil {
		t.Fatal(err)
	}
	if m, err := readMsg(t.Context(), c); err != nil || m.Problem == nil || m.Problem.Code != CodeUnknownRun {
		t.Fatalf("%+v, %v", m, err)
	}
}

// TestPushLargeEvents: an event over a frame arrives as parts within the bound.
func TestPushLargeEvents(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newPushEnv(t, nb(t), PushConfig{}, nil)
		st := e.start("", "run-1", "thread-1")
		big := strings.Repeat(`"é\n`, 30_000) // escapes and multi-byte runes across parts
		r := e.appendEvents("", "run-1", st.Cursor, map[string]any{"s": big}, "small")
		r.wantStatus(t, http.StatusOK)
		ar := decode[wire.AppendResponse](t, r)
		e.finish("", "run-1", ar.Cursor, "completed").wantStatus(t, http.StatusOK)
		c := e.mustDial("")
		got, err := watch(t.Context(), c, "run-1", 0)
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ S string }
		if len(got) != 2 || json.Unmarshal(got[0], &v) != nil || v.S != big || string(got[1]) != `"small"` {
			t.Fatalf("got %d events", len(got))
		}
	})
}
