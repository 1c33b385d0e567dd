package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// The subscription client of the push protocol (api/asyncapi.yaml; docs/design.md §8.1):
// one connection carries any number of runs; where the API offers no push endpoint (404, a
// refused upgrade) or the connection cannot be made, the same subscription long-polls
// GET /v1/runs/{runId}/events instead, so a caller never chooses.

// Transports a Subscription reports (Via).
const (
	ViaPush = "push"
	ViaPoll = "poll"
)

// ErrNoSubscriptions: every run of the subscription has closed, been refused or removed.
var ErrNoSubscriptions = errors.New("apiclient: the subscription holds no open run")

// Bounds of a subscription's calls.
const (
	// pushDialTimeout bounds an upgrade: a server that does not answer it is a failed
	// connection, and the subscription long-polls instead.
	pushDialTimeout = 10 * time.Second
	// pushWriteTimeout bounds a subscribe message (the library cuts the connection when a
	// write's context ends, so this is never the caller's context).
	pushWriteTimeout = 10 * time.Second
	// pollTimeout bounds one long poll, retries included: a server that vanished without
	// closing the connection is a transient failure, not a wait for ever.
	pollTimeout = wire.MaxWaitMs*time.Millisecond + 15*time.Second
	// pushReadLimit bounds a server message: the protocol's frame bound, with room.
	pushReadLimit = 2 * wire.MaxPushMessageBytes
)

// Update is what a Subscription delivers for one run: its events after the last ones
// delivered (in order, each offset once, never empty unless Closed or Err), or its close
// (Closed: every event was delivered; Next is the log's last offset), or its refusal (Err,
// an *Error: unknown-run for another tenant's run as for none). After Closed or Err the run
// has left the subscription.
type Update struct {
	RunID string
	wire.ReadResponse
	Err error
}

// Subscription follows runs' logs from an offset, over push when the API offers it and
// over long polls otherwise. Next delivers; a failure that may heal (the connection
// dropped, no answer, 429/502-504: Transient) is returned by Next, and the following Next
// connects again and resumes every open run after the last offset it delivered, so across
// any number of reconnections each event is delivered once, in order. It is safe for
// concurrent use, but Next is meant for one reader.
type Subscription struct {
	c    *Client
	life context.Context
	stop context.CancelFunc

	mu   sync.Mutex
	runs map[string]int64 // open runs: the last offset delivered
	sess *session
	// pushOff: the API answered the upgrade with a refusal (no push endpoint): long polls
	// for the rest of the subscription. A failed connection only makes one session poll.
	pushOff bool
	via     string
	heard   time.Time // when the API last answered: a message, a page (empty ones too)
}

// session is one connection (push) or one set of long pollers (poll); its items end with
// at most one failure, after which the subscription starts another session.
type session struct {
	ctx    context.Context
	cancel context.CancelFunc
	items  chan subItem
	conn   *websocket.Conn               // push
	pulls  map[string]context.CancelFunc // poll: one long-poller per run
	wg     sync.WaitGroup
}

// subItem is one thing a session produced.
type subItem struct {
	runID  string
	page   wire.ReadResponse
	after  *int64 // the message's After (deployed push): where its events begin
	missed bool   // parts of an event did not join: subscribe again
	runErr error  // the run's refusal
	err    error  // the session ended
}

// PushTake is a push client's rule for one run's message (docs/design.md §8.1): given
// the last offset it delivered and the message's After and events, it returns the events
// to deliver (those past last, in order) and the new last — or again: the message begins
// past last, so one before it was missed (each writer posts its own batch, and posts
// may cross or fail); it is dropped, and the client subscribes again from last, whose
// stored pages bring the missing events (what then arrives twice is dropped here).
func PushTake(last int64, after *int64, events []contract.Event) (deliver []contract.Event, newLast int64, again bool) {
	if after != nil && *after > last {
		return nil, last, true
	}
	for _, e := range events {
		if e.Offset > last {
			deliver = append(deliver, e)
			last = e.Offset
		}
	}
	return deliver, last, false
}

// Subscribe returns a subscription to runs (the run and the last offset the caller holds;
// 0 from the start). More runs can be added with Add. ctx bounds the whole subscription;
// Close ends it. Nothing is sent before the first Next.
func (c *Client) Subscribe(ctx context.Context, runs map[string]int64) *Subscription {
	life, stop := context.WithCancel(ctx)
	s := &Subscription{c: c, life: life, stop: stop, runs: map[string]int64{}}
	for id, after := range runs {
		s.runs[id] = after
	}
	return s
}

// Via reports how the current (or last) session receives events: ViaPush or ViaPoll ("" before
// the first Next).
func (s *Subscription) Via() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.via
}

// Heard is when the API last answered the subscription (a push message, a long poll's
// page, empty or not): a caller that retries failures measures their streak from it.
func (s *Subscription) Heard() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heard
}

// hear records an answer of the API.
func (s *Subscription) hear() {
	s.mu.Lock()
	s.heard = time.Now()
	s.mu.Unlock()
}

// Add subscribes to runID after `after` (the last offset the caller holds); a run already
// subscribed restarts from `after`.
func (s *Subscription) Add(runID string, after int64) {
	s.mu.Lock()
	s.runs[runID] = after
	sess := s.sess
	if sess != nil && sess.conn == nil {
		s.startPull(sess, runID, after)
	}
	s.mu.Unlock()
	if sess != nil && sess.conn != nil {
		s.sendSubscribe(sess, runID, after)
	}
}

// Remove ends the subscription to runID; nothing more of it is delivered.
func (s *Subscription) Remove(runID string) {
	s.mu.Lock()
	_, open := s.runs[runID]
	delete(s.runs, runID)
	sess := s.sess
	if sess != nil && sess.pulls[runID] != nil {
		sess.pulls[runID]()
		delete(sess.pulls, runID)
	}
	s.mu.Unlock()
	if open && sess != nil && sess.conn != nil {
		b, _ := json.Marshal(wire.PushRequest{Type: wire.PushUnsubscribe, RunID: runID})
		wctx, cancel := context.WithTimeout(sess.ctx, pushWriteTimeout)
		defer cancel()
		_ = sess.conn.Write(wctx, websocket.MessageText, b) // a failure ends the session: Next says so
	}
}

// Close ends the subscription and its connection.
func (s *Subscription) Close() {
	s.stop()
	s.mu.Lock()
	sess := s.sess
	s.sess = nil
	s.mu.Unlock()
	if sess != nil {
		sess.end()
	}
}

// Next returns the next update of any open run. Its error is ctx's, ErrNoSubscriptions once
// no run is open, the failure of a session (Transient tells whether calling Next again,
// which reconnects and resumes, may succeed), or a refusal of the whole connection.
func (s *Subscription) Next(ctx context.Context) (Update, error) {
	for {
		s.mu.Lock()
		if len(s.runs) == 0 {
			s.mu.Unlock()
			return Update{}, ErrNoSubscriptions
		}
		if err := s.life.Err(); err != nil {
			s.mu.Unlock()
			return Update{}, err
		}
		sess := s.sess
		s.mu.Unlock()
		if sess == nil {
			var err error
			if sess, err = s.connect(ctx); err != nil {
				return Update{}, err
			}
		}
		var it subItem
		select {
		case <-ctx.Done():
			return Update{}, ctx.Err()
		case it = <-sess.items:
		}
		if it.err != nil {
			s.mu.Lock()
			if s.sess == sess {
				s.sess = nil
			}
			s.mu.Unlock()
			sess.end()
			return Update{}, it.err
		}
		u, ok, again := s.take(it)
		if again && sess.conn != nil {
			s.sendSubscribe(sess, u.RunID, u.Next)
		}
		if ok {
			return u, nil
		}
	}
}

// take turns an item into an update of an open run: events at or below the last offset
// delivered are dropped (a replay after a resume), so each is delivered once; again: the
// item begins past the last offset delivered (PushTake), so the run is to be subscribed
// again after u.Next.
func (s *Subscription) take(it subItem) (u Update, ok, again bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, open := s.runs[it.runID]
	if !open {
		return Update{}, false, false
	}
	u = Update{RunID: it.runID, Err: it.runErr}
	if it.runErr != nil {
		delete(s.runs, it.runID)
		return u, true, false
	}
	if it.missed {
		u.Next = last
		return u, false, true
	}
	evs, last, again := PushTake(last, it.after, it.page.Events)
	if again {
		u.Next = last
		return u, false, true
	}
	u.Events, u.Next, u.Closed = evs, max(it.page.Next, last), it.page.Closed
	if u.Closed {
		delete(s.runs, it.runID)
		return u, true, false
	}
	s.runs[it.runID] = last
	return u, len(evs) > 0, false
}

// connect starts a session: push when the API offers it, long polls otherwise.
func (s *Subscription) connect(ctx context.Context) (*session, error) {
	s.mu.Lock()
	pushOff := s.pushOff
	s.mu.Unlock()
	var conn *websocket.Conn
	if !pushOff {
		target, ticketed, refused, err := s.pushTarget(ctx)
		if err == nil {
			conn, refused, err = s.dial(ctx, target, ticketed)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil && refused {
			s.mu.Lock()
			s.pushOff = true
			s.mu.Unlock()
		}
	}
	sctx, cancel := context.WithCancel(s.life)
	sess := &session{ctx: sctx, cancel: cancel, items: make(chan subItem), conn: conn, pulls: map[string]context.CancelFunc{}}
	s.mu.Lock()
	s.sess = sess
	runs := make(map[string]int64, len(s.runs))
	for id, after := range s.runs {
		runs[id] = after
	}
	if conn == nil {
		s.via = ViaPoll
		for id, after := range runs {
			s.startPull(sess, id, after)
		}
		s.mu.Unlock()
		return sess, nil
	}
	s.via = ViaPush
	s.mu.Unlock()
	sess.wg.Add(2)
	go func() {
		defer sess.wg.Done()
		s.readPush(sess)
	}()
	go func() {
		defer sess.wg.Done()
		sess.keepAlive()
	}()
	for id, after := range runs {
		s.sendSubscribe(sess, id, after)
	}
	return sess, nil
}

// pushTarget is the push endpoint and whether it is ticketed. A JWT (Bearer) client asks
// POST /v1/push/ticket for a ticket and the push URL (Config.PushURL wins), because a
// WebSocket API's upgrade takes no JWT (docs/design.md §8.1); otherwise Config.PushURL,
// or the API's own /v1/subscribe where the client authenticates as the dev server takes it
// (the tenant header; its upgrade takes no SigV4 or JWT, and a deployed push endpoint has an
// address of its own). refused: the API offers no push (501, 404, or no endpoint at all).
func (s *Subscription) pushTarget(ctx context.Context) (target string, ticketed, refused bool, err error) {
	if _, jwt := s.c.cfg.Auth.(Bearer); jwt {
		t, err := s.c.PushTicket(ctx)
		var ae *Error
		if errors.As(err, &ae) && (ae.Status == http.StatusNotImplemented || ae.Status == http.StatusNotFound) {
			return "", false, true, err
		}
		if err != nil {
			return "", false, false, err
		}
		base := s.c.cfg.PushURL
		if base == "" {
			base = t.PushURL
		}
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") {
			return "", false, true, fmt.Errorf("apiclient: push URL %q: want ws(s)://", base)
		}
		q := u.Query()
		q.Set(wire.PushTicketQuery, t.Ticket)
		u.RawQuery = q.Encode()
		return u.String(), true, false, nil
	}
	if s.c.cfg.PushURL != "" {
		return s.c.cfg.PushURL, false, false, nil
	}
	if s.c.cfg.Auth != nil {
		return "", false, true, errors.New("apiclient: no push endpoint (Config.PushURL)")
	}
	u := *s.c.base
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	u.Path = strings.TrimRight(u.Path, "/") + wire.SubscribePath
	u.RawPath = ""
	return u.String(), false, false, nil
}

// dial opens a push connection. refused says that the API answered the upgrade with
// something else (404 where no push is served, a refusal, a proxy): it offers no push. A
// ticketed upgrade carries nothing but its ticket (the ticket names the tenant).
func (s *Subscription) dial(ctx context.Context, target string, ticketed bool) (c *websocket.Conn, refused bool, err error) {
	h := http.Header{}
	if s.c.cfg.Tenant != "" && !ticketed {
		h.Set(TenantHeader, s.c.cfg.Tenant)
	}
	if s.c.cfg.Auth != nil && !ticketed {
		// The upgrade is signed as the GET it is (an API Gateway $connect authorizes it so).
		u, err := url.Parse(target)
		if err != nil {
			return nil, true, fmt.Errorf("apiclient: push URL: %w", err)
		}
		u.Scheme = map[string]string{"ws": "http", "wss": "https"}[u.Scheme]
		hr, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return nil, true, fmt.Errorf("apiclient: push URL: %w", err)
		}
		hr.Header = h
		if err := s.c.cfg.Auth.Authorize(ctx, hr, nil); err != nil {
			return nil, true, fmt.Errorf("apiclient: authorize the push upgrade: %w", err)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, pushDialTimeout)
	defer cancel()
	c, resp, err := websocket.Dial(dctx, target, &websocket.DialOptions{HTTPClient: s.c.cfg.HTTPClient, HTTPHeader: h,
		Subprotocols: []string{wire.PushSubprotocol}})
	if err != nil {
		return nil, resp != nil, fmt.Errorf("apiclient: push upgrade: %w", err)
	}
	if c.Subprotocol() != wire.PushSubprotocol {
		c.CloseNow()
		return nil, true, errors.New("apiclient: push upgrade: the server did not select " + wire.PushSubprotocol)
	}
	c.SetReadLimit(pushReadLimit)
	return c, false, nil
}

// sendSubscribe asks the push session for runID's events after `after`; a failed write
// ends the session (the reader sees the connection cut).
func (s *Subscription) sendSubscribe(sess *session, runID string, after int64) {
	b, _ := json.Marshal(wire.PushRequest{Type: wire.PushSubscribe, RunID: runID, After: &after})
	wctx, cancel := context.WithTimeout(sess.ctx, pushWriteTimeout)
	defer cancel()
	_ = sess.conn.Write(wctx, websocket.MessageText, b)
}

// readPush turns the connection's messages into items until it ends.
func (s *Subscription) readPush(sess *session) {
	parts := map[string][]wire.PushMessage{} // an event's parts so far, by run
	for {
		// Not the session's context: its end would cut the connection before the close
		// handshake; end closes the connection, which ends this read.
		_, b, err := sess.conn.Read(context.WithoutCancel(sess.ctx))
		if err != nil {
			sess.put(subItem{err: &netError{op: "push " + wire.SubscribePath, err: err}})
			return
		}
		s.hear()
		var m wire.PushMessage
		if err := json.Unmarshal(b, &m); err != nil {
			sess.put(subItem{err: fmt.Errorf("apiclient: push: undecodable message: %w", err)})
			return
		}
		it := subItem{runID: m.RunID, after: m.After}
		switch m.Type {
		case wire.PushSubscribed:
			delete(parts, m.RunID) // a restart: parts of an earlier subscription are void
			continue
		case wire.PushEvents:
			it.page = wire.ReadResponse{Events: m.Events, Next: m.Next}
		case wire.PushEventPart:
			p := parts[m.RunID]
			if len(p) > 0 && p[0].Offset != m.Offset {
				p = nil // another event's parts: the deployed push's writers may cross
			}
			if p = append(p, m); !m.Final {
				parts[m.RunID] = p
				continue
			}
			delete(parts, m.RunID)
			e, ok := wire.PushEventParts(p)
			switch {
			case !ok && m.After == nil:
				sess.put(subItem{err: fmt.Errorf("apiclient: push: the parts of offset %d do not make an event", m.Offset)})
				return
			case !ok: // two posters' parts of one event interleaved: read it again
				it.missed = true
			default:
				it.after = p[0].After
				it.page = wire.ReadResponse{Next: m.Offset}
				it.page.Events = append(it.page.Events, e)
			}
		case wire.PushClosed:
			it.page = wire.ReadResponse{Next: m.Next, Closed: true}
		case wire.PushError:
			e := pushProblem(m.Problem)
			if m.RunID == "" {
				sess.put(subItem{err: e}) // a request of ours the server could not read
				return
			}
			it.runErr = e
		default:
			continue // a newer server's message this client does not know
		}
		if !sess.put(it) {
			return
		}
	}
}

// pushProblem is the *Error of a push error message, as the HTTP call would return it.
func pushProblem(p *wire.Problem) *Error {
	if p == nil {
		return &Error{Status: http.StatusInternalServerError, Detail: "a push error without a problem"}
	}
	return &Error{Status: p.Status, Code: p.Code, Title: p.Title, Detail: p.Detail, RequestID: p.RequestID}
}

// startPull starts runID's long-poller in a poll session (s.mu held).
func (s *Subscription) startPull(sess *session, runID string, after int64) {
	if stop := sess.pulls[runID]; stop != nil {
		stop()
	}
	pctx, stop := context.WithCancel(sess.ctx)
	sess.pulls[runID] = stop
	sess.wg.Add(1)
	go func() {
		defer sess.wg.Done()
		defer stop()
		s.pull(pctx, sess, runID, after)
	}()
}

// pull long-polls runID's log after `after` until it closes, is refused or fails.
func (s *Subscription) pull(ctx context.Context, sess *session, runID string, after int64) {
	for {
		rctx, cancel := context.WithTimeout(ctx, pollTimeout)
		page, err := s.c.ReadEvents(rctx, runID, ReadOptions{After: after, Limit: wire.MaxReadLimit, Wait: wire.MaxWaitMs * time.Millisecond})
		cancel()
		if err == nil {
			s.hear()
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && Transient(err):
			sess.put(subItem{err: err})
			return
		case err != nil:
			sess.putRun(ctx, subItem{runID: runID, runErr: err})
			return
		}
		if !sess.putRun(ctx, subItem{runID: runID, page: page}) || page.Closed {
			return
		}
		after = max(after, page.Next)
	}
}

// put hands an item to Next unless the session ends first.
func (sess *session) put(it subItem) bool {
	select {
	case sess.items <- it:
		return true
	case <-sess.ctx.Done():
		return false
	}
}

// putRun is put for one run's poller, which may be stopped on its own.
func (sess *session) putRun(ctx context.Context, it subItem) bool {
	select {
	case sess.items <- it:
		return true
	case <-ctx.Done():
		return false
	}
}

// pushPing is how often an idle push connection is pinged: a server gone without closing
// the connection (a host lost, a NAT forgot it) is a failed session, not a wait for ever.
const pushPing = 30 * time.Second

// keepAlive pings the connection until the session ends; an unanswered ping cuts it (the
// reader then ends the session as a transient failure).
func (sess *session) keepAlive() {
	t := time.NewTicker(pushPing)
	defer t.Stop()
	for {
		select {
		case <-sess.ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(sess.ctx, pushWriteTimeout)
		err := sess.conn.Ping(pctx)
		cancel()
		if err != nil && sess.ctx.Err() == nil {
			sess.conn.CloseNow()
			return
		}
	}
}

// end stops the session's producers and closes its connection (a close handshake the
// reader, woken from its hand-over by the cancel, lets through).
func (sess *session) end() {
	sess.cancel()
	if sess.conn != nil {
		sess.conn.Close(websocket.StatusNormalClosure, "")
	}
	sess.wg.Wait()
}
