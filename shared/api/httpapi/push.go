package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Problem codes of the push protocol (429 when refusing a connection).
const (
	CodeTooManyConnections   = wire.CodeTooManyConnections
	CodeTooManySubscriptions = wire.CodeTooManySubscriptions
)

// PushConfig turns on the push protocol at GET /v1/subscribe (api/asyncapi.yaml;
// docs/design.md §8.1): the dev server's in-process fan-out. Zero values take the defaults.
type PushConfig struct {
	// MaxConnections bounds one tenant's open connections (wire.DefaultMaxConnections).
	MaxConnections int
	// MaxSubscriptions bounds one connection's open subscriptions (wire.DefaultMaxSubscriptions).
	MaxSubscriptions int
	// PollEvery re-reads an idle subscription's log for writes this process did not make
	// (another server on the same table) on a backend that cannot wake its readers
	// (contract.LogWaker); 0 never polls: only this process's writes push.
	PollEvery time.Duration
	// WriteTimeout drops a consumer that has not taken a message within it (default 10 s):
	// a subscription holds one page at most and waits for the socket, never queueing more.
	WriteTimeout time.Duration
	// PageLimit is the events read per page (default wire.DefaultReadLimit).
	PageLimit int
	// Feed wakes subscriptions at this process's log writes; default the keeper's
	// Config().Wake (the seam the tests break the switch-over at).
	Feed keeper.LogWake
}

// pusher serves the push connections of one handler.
type pusher struct {
	cfg  PushConfig
	mu   sync.Mutex
	open map[string]int // connections per tenant
}

func newPusher(cfg PushConfig, k *keeper.Keeper) *pusher {
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = wire.DefaultMaxConnections
	}
	if cfg.MaxSubscriptions <= 0 {
		cfg.MaxSubscriptions = wire.DefaultMaxSubscriptions
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.PageLimit <= 0 {
		cfg.PageLimit = wire.DefaultReadLimit
	}
	if cfg.Feed == nil {
		cfg.Feed = k.Config().Wake
	}
	return &pusher{cfg: cfg, open: map[string]int{}}
}

// acquire takes one of tenant's connection slots; false when it holds them all.
func (p *pusher) acquire(tenant string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[tenant] >= p.cfg.MaxConnections {
		return false
	}
	p.open[tenant]++
	return true
}

func (p *pusher) release(tenant string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open[tenant]--; p.open[tenant] <= 0 {
		delete(p.open, tenant)
	}
}

// queryTenant is an Authenticator that also reads the tenant from the upgrade request's
// query (a browser's WebSocket cannot send headers): DevAuth.
type queryTenant interface {
	QueryTenant(r *http.Request) string
}

// subscribe upgrades GET /v1/subscribe to a push connection and serves it until the
// client leaves, a write times out (a slow consumer) or the keeper drains.
func (h *handler) subscribe(w http.ResponseWriter, r *http.Request) {
	info := infoFrom(r.Context())
	info.route = r.Pattern
	raw := h.auth.Tenant(r)
	if qa, ok := h.auth.(queryTenant); ok {
		raw = qa.QueryTenant(r)
	}
	if raw == "" {
		h.fail(w, info, &apiError{http.StatusUnauthorized, CodeUnauthenticated, "the request names no tenant"})
		return
	}
	tenant := MapTenant(raw)
	info.tenant = tenant
	if !headerHasToken(r.Header, "Upgrade", "websocket") {
		h.fail(w, info, &apiError{http.StatusBadRequest, CodeInvalid, "a WebSocket upgrade request is required (api/asyncapi.yaml)"})
		return
	}
	if !h.push.acquire(tenant) {
		h.fail(w, info, &apiError{http.StatusTooManyRequests, CodeTooManyConnections,
			fmt.Sprintf("the tenant holds %d push connections on this server, its bound", h.push.cfg.MaxConnections)})
		return
	}
	defer h.push.release(tenant)
	// The library refuses an Origin other than the Host too; DevAuth refused it already.
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.PushSubprotocol}})
	if err != nil {
		info.code = CodeInvalid
		return // Accept answered
	}
	c.SetReadLimit(wire.MaxPushRequestBytes)
	// The connection outlives the request's context (hijacked); the keeper's drain ends it.
	ctx, cancel := context.WithCancel(contract.WithTenant(context.WithoutCancel(r.Context()), tenant))
	defer cancel()
	pc := &pushConn{h: h, c: c, tenant: tenant, reqID: info.id, subs: map[string]*pushSub{}, cancel: cancel}
	pc.written = sync.NewCond(&pc.mu)
	go func() {
		select {
		case <-h.k.Drained():
			c.Close(websocket.StatusGoingAway, "server shutting down")
			cancel()
		case <-ctx.Done():
		}
	}()
	info.outcome = pc.serve(ctx)
	cancel()
	pc.wg.Wait()
	c.CloseNow()
}

// headerHasToken reports whether any of h's name values lists token (case-insensitive).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range bytes.Split([]byte(v), []byte(",")) {
			if bytes.EqualFold(bytes.TrimSpace(t), []byte(token)) {
				return true
			}
		}
	}
	return false
}

// pushConn is one push connection: its subscriptions by run id.
type pushConn struct {
	h      *handler
	c      *websocket.Conn
	tenant string
	reqID  string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	subs   map[string]*pushSub
	// slow is set when a write timed out: the consumer was dropped.
	slow bool
	// writing counts the sends in flight; written is signalled as each ends. A send whose
	// write timed out sets slow before it ends, and the cut it caused ends serve's read,
	// which waits for the sends in flight: so the outcome logged is always slow-consumer.
	writing int
	written *sync.Cond
}

type pushSub struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// serve reads the client's requests until the connection ends; it returns the log's outcome.
func (pc *pushConn) serve(ctx context.Context) string {
	for {
		typ, b, err := pc.c.Read(ctx)
		if err != nil {
			// Every end of the read closes the connection, so the sends in flight end
			// promptly (each within WriteTimeout at most).
			pc.mu.Lock()
			for pc.writing > 0 {
				pc.written.Wait()
			}
			slow := pc.slow
			pc.mu.Unlock()
			switch {
			case slow:
				return "slow-consumer"
			case ctx.Err() != nil:
				return "drained"
			}
			return "closed"
		}
		if typ != websocket.MessageText {
			pc.c.Close(websocket.StatusUnsupportedData, "text frames only")
			return "binary-frame"
		}
		req, err := DecodePushRequest(b)
		if err != nil {
			pc.sendError(ctx, req.RunID, err)
			continue
		}
		switch req.Type {
		case wire.PushSubscribe:
			pc.start(ctx, req.RunID, *req.After)
		case wire.PushUnsubscribe:
			pc.stop(req.RunID)
		}
	}
}

// start begins (or restarts, for a resume) the subscription to runID after `after`.
func (pc *pushConn) start(ctx context.Context, runID string, after int64) {
	pc.stop(runID) // a second subscribe to a run resumes it from the new offset
	pc.mu.Lock()
	if len(pc.subs) >= pc.h.push.cfg.MaxSubscriptions {
		pc.mu.Unlock()
		pc.sendError(ctx, runID, &apiError{http.StatusTooManyRequests, CodeTooManySubscriptions,
			fmt.Sprintf("the connection holds %d subscriptions, its bound; unsubscribe first", pc.h.push.cfg.MaxSubscriptions)})
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &pushSub{cancel: cancel, done: make(chan struct{})}
	pc.subs[runID] = s
	pc.mu.Unlock()
	pc.wg.Add(1)
	// release frees the subscription's place before its last message (an error or the
	// close) is sent, so a client that reads that message may subscribe again at once.
	release := func() {
		pc.mu.Lock()
		if pc.subs[runID] == s {
			delete(pc.subs, runID)
		}
		pc.mu.Unlock()
	}
	go func() {
		defer pc.wg.Done()
		defer close(s.done)
		defer cancel()
		defer release()
		pc.follow(sctx, runID, after, release)
	}()
}

// stop ends runID's subscription, if any, and waits until it sends nothing more.
func (pc *pushConn) stop(runID string) {
	pc.mu.Lock()
	s := pc.subs[runID]
	delete(pc.subs, runID)
	pc.mu.Unlock()
	if s != nil {
		s.cancel()
		<-s.done
	}
}

// follow delivers runID's events after `after`, then its close. Each turn subscribes to
// the run's wakes BEFORE reading the log from the last offset sent: a write landing between
// the read and the wait has woken the wait already, so the switch from the stored pages to
// live delivery has no gap, and reading by offset sends nothing twice.
func (pc *pushConn) follow(ctx context.Context, runID string, next int64, release func()) {
	k := pc.h.k
	// The run must be the caller's (an unknown run and another tenant's look alike).
	if _, err := k.Get(ctx, runID); err != nil {
		release()
		pc.sendError(ctx, runID, err)
		return
	}
	if !pc.send(ctx, wire.PushMessage{Type: wire.PushSubscribed, RunID: runID, Next: next}) {
		return
	}
	cfg := pc.h.push.cfg
	waker, _ := k.Config().Backend.(contract.LogWaker)
	key := keeper.RunKey{Tenant: pc.tenant, RunID: runID}
	for {
		woken, unwake := cfg.Feed.Wait(key)
		stop := unwake
		var changed <-chan struct{}
		if waker != nil {
			ch, unchange, err := waker.LogChanged(ctx, runID)
			if err != nil {
				unwake()
				release()
				pc.sendError(ctx, runID, err)
				return
			}
			changed, stop = ch, func() { unchange(); unwake() }
		}
		res, err := k.Read(ctx, runID, next, cfg.PageLimit, 0)
		if err != nil {
			stop()
			if ctx.Err() == nil {
				release()
				pc.sendError(ctx, runID, err)
			}
			return
		}
		if len(res.Events) > 0 {
			stop()
			if !pc.sendEvents(ctx, runID, res.Events) {
				return
			}
			next = res.Events[len(res.Events)-1].Offset
			continue
		}
		if res.Closed {
			stop()
			release()
			pc.send(ctx, wire.PushMessage{Type: wire.PushClosed, RunID: runID, Next: next})
			return
		}
		var poll <-chan time.Time
		t := time.NewTimer(cfg.PollEvery)
		if waker == nil && cfg.PollEvery > 0 {
			poll = t.C
		}
		select {
		case <-ctx.Done():
		case <-woken:
		case <-changed:
		case <-poll:
		}
		t.Stop()
		stop()
		if ctx.Err() != nil {
			return
		}
	}
}

// sendEvents sends events as messages within the frame bound (PushFrames).
func (pc *pushConn) sendEvents(ctx context.Context, runID string, events []contract.Event) bool {
	for _, m := range PushFrames(runID, events) {
		if !pc.send(ctx, m) {
			return false
		}
	}
	return true
}

// sendError sends a request's problem (an infrastructure error is logged, not told).
func (pc *pushConn) sendError(ctx context.Context, runID string, err error) bool {
	m, infra := PushError(runID, err, pc.reqID)
	if infra {
		pc.h.log.LogAttrs(ctx, slog.LevelError, "push", slog.String("requestId", pc.reqID),
			slog.String("tenant", pc.tenant), slog.String("runId", runID), slog.String("error", err.Error()))
	}
	return pc.send(ctx, m)
}

// send writes one message; a consumer that does not take it within WriteTimeout is
// dropped (the library closes the connection when a write's context ends).
func (pc *pushConn) send(ctx context.Context, m wire.PushMessage) bool {
	wctx, cancel := context.WithTimeout(ctx, pc.h.push.cfg.WriteTimeout)
	defer cancel()
	pc.mu.Lock()
	pc.writing++
	pc.mu.Unlock()
	err := pc.c.Write(wctx, websocket.MessageText, EncodePush(m))
	pc.mu.Lock()
	pc.writing--
	// The write's own deadline passed while the connection lived: the library cut the
	// connection for it (whatever error the cut surfaced as).
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		pc.slow = true
	}
	pc.written.Broadcast()
	pc.mu.Unlock()
	if err != nil {
		pc.cancel()
		return false
	}
	return true
}
