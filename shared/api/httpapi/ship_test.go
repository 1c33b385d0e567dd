package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore/callcount"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// shipEnv is an API under test with its handler at hand (its ship token minting and its
// step seam).
type shipEnv struct {
	*env
	hd *handler
}

func newShipEnv(t *testing.T, b contract.Backend) *shipEnv {
	t.Helper()
	e := newEnv(t, DevAuth{}, b)
	return &shipEnv{env: e, hd: e.h.(*handler)}
}

// startShip starts runID for tenant (the dev header; "" = local) and returns the ship
// token the agent route would hand the run's shipper.
func (s *shipEnv) startShip(tenant, runID string) (string, contract.Cursor) {
	s.t.Helper()
	st := s.start(tenant, runID, "thread-"+runID)
	cl, err := s.hd.cursors.open(st.Cursor)
	if err != nil {
		s.t.Fatal(err)
	}
	raw := tenant
	if raw == "" {
		raw = DefaultDevTenant
	}
	tok, _ := s.hd.mintShip(MapTenant(raw), runID, cl.cursor(), false)
	return tok, cl.cursor()
}

func shipHeaders(tok string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + tok, "Content-Type": wire.ShipContentType}
}

func (s *shipEnv) ship(tok, runID string, src int64, body string) resp {
	s.t.Helper()
	return s.do(req{method: post, path: fmt.Sprintf("/v1/runs/%s/ship?src=%d", runID, src), body: []byte(body), headers: shipHeaders(tok)})
}

func (s *shipEnv) end(tok, runID string, code int, tail string) resp {
	s.t.Helper()
	return s.do(req{method: post, path: fmt.Sprintf("/v1/runs/%s/ship/end?code=%d", runID, code), body: []byte(tail),
		headers: map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "text/plain"}})
}

// shipOK decodes a 200 ship answer and checks its headers say the same as its body.
func shipOK(t *testing.T, r resp) wire.ShipResponse {
	t.Helper()
	r.wantStatusRaw(t, http.StatusOK)
	out := decode[wire.ShipResponse](t, r)
	if r.Header.Get(wire.ShipNextHeader) != strconv.FormatInt(out.Next, 10) || r.Header.Get(wire.ShipStateHeader) != out.State ||
		r.Header.Get(wire.ShipTokenHeader) != out.Token {
		t.Fatalf("headers %v disagree with the body %+v", r.Header, out)
	}
	return out
}

// journalOf is a journal of lines {"n":1}..{"n":n}, then (exit >= 0) the run's sentinel,
// and ends[i] the position after line i+1.
func journalOf(runID string, n, exit int) (string, []int64) {
	var b strings.Builder
	ends := make([]int64, n)
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "{\"n\":%d}\n", i)
		ends[i-1] = int64(b.Len())
	}
	if exit >= 0 {
		b.WriteString(journal.SentinelLine(runID, exit) + "\n")
	}
	return b.String(), ends
}

// logLines returns the numbered lines of runID's log in order and whether it is closed,
// read straight from the backend.
func (s *shipEnv) logLines(tenant, runID string) ([]int, bool) {
	s.t.Helper()
	var out []int
	after := int64(0)
	for {
		evs, next, closed, err := s.backend.Log().Read(tctx(s.t, tenant), runID, after, 1000)
		if err != nil {
			s.t.Fatal(err)
		}
		for _, ev := range evs {
			var m struct{ N int }
			if json.Unmarshal(ev.Data, &m) == nil && m.N > 0 {
				out = append(out, m.N)
			}
		}
		if len(evs) == 0 || closed {
			return out, closed
		}
		after = next
	}
}

// onceInOrder reports whether got is 1..n.
func onceInOrder(got []int, n int) error {
	if len(got) != n {
		return fmt.Errorf("%d lines, want %d: %v", len(got), n, got)
	}
	for i, v := range got {
		if v != i+1 {
			return fmt.Errorf("line %d is %d: %v", i, v, got)
		}
	}
	return nil
}

// exactlyOnceScenario ships a 10-line journal the way failures make a shipper send it: a
// batch whose answer is lost and is sent again grown, an older range sent again, then the
// rest with the sentinel. It returns the log's lines; it asserts nothing of its own, so
// the negative control can run it against a broken step.
func exactlyOnceScenario(s *shipEnv, runID string) ([]int, []wire.ShipResponse) {
	s.t.Helper()
	tok, _ := s.startShip("", runID)
	j, ends := journalOf(runID, 10, 0)
	var answers []wire.ShipResponse
	send := func(tok string, src, to int64) wire.ShipResponse {
		r := s.ship(tok, runID, src, j[src:to])
		if r.Status != http.StatusOK {
			return wire.ShipResponse{Token: tok}
		}
		a := decode[wire.ShipResponse](s.t, r)
		answers = append(answers, a)
		return a
	}
	send(tok, 0, ends[4])                // lines 1..5; the answer is lost
	a := send(tok, 0, ends[6])           // sent again with the old token, grown to 7
	send(a.Token, 0, ends[2])            // an older range again (the journal re-read from 0)
	a = send(a.Token, a.Next, ends[6]+3) // a partial line 8: nothing of it stored
	send(a.Token, a.Next, int64(len(j))) // the rest and the sentinel
	got, _ := s.logLines(DefaultDevTenant, runID)
	return got, answers
}

// TestShipExactlyOnce: a lost answer's batch re-sent, an older range re-sent and a partial
// line never store a line twice or skip one; the sentinel answers exited; end completes
// the run and closes the log, and is idempotent.
func TestShipExactlyOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		s := newShipEnv(t, nb(t))
		got, answers := exactlyOnceScenario(s, "run-1")
		if err := onceInOrder(got, 10); err != nil {
			t.Fatal(err)
		}
		if len(answers) != 5 || answers[4].State != wire.ShipExited {
			t.Fatalf("answers %+v: want five, the last exited", answers)
		}
		for _, a := range answers[:4] {
			if a.State != wire.ShipRunning {
				t.Fatalf("answer %+v before the sentinel", a)
			}
		}
		_, ends := journalOf("run-1", 10, 0)
		if answers[1].Next != ends[6]-1 || answers[2].Next != ends[6]-1 || answers[3].Next != ends[6]-1 {
			t.Fatalf("next %d/%d/%d, want a byte before line 7's end %d", answers[1].Next, answers[2].Next, answers[3].Next, ends[6])
		}
		tok := answers[4].Token
		for range 2 { // the second is a retry whose answer was lost
			r := s.end(tok, "run-1", 0, "")
			if e := decode[wire.ShipEndResponse](t, r.wantStatusRaw(t, 200)); e.State != wire.ShipEnded || e.Status != "completed" {
				t.Fatalf("end: %+v", e)
			}
		}
		if run := s.run("run-1"); run.Status != contract.StatusCompleted {
			t.Fatalf("run %+v", run)
		}
		if got, closed := s.logLines(DefaultDevTenant, "run-1"); !closed || onceInOrder(got, 10) != nil {
			t.Fatalf("log %v closed %v after end", got, closed)
		}
		s.ship(tok, "run-1", answers[4].Next, "").wantProblem(t, http.StatusGone, CodeTerminalRun)
	})
}

// TestShipNegativeControl: a ship step that ignores the stored position (reads the bytes
// from where they start) stores the re-sent batch again: the exactly-once scenario catches it.
func TestShipNegativeControl(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		s := newShipEnv(t, nb(t))
		s.hd.step = func(ctx context.Context, in agentrun.StepInput) (agentrun.StepResult, error) {
			if b, ok := in.Source.(journal.Bytes); ok && len(b.Data) > 0 {
				in.At.Src = b.Start // broken: the bytes' start taken for the position stored
			}
			return agentrun.Step(ctx, in)
		}
		got, _ := exactlyOnceScenario(s, "run-1")
		if err := onceInOrder(got, 10); err == nil {
			t.Fatalf("the broken step stored %v exactly once: the scenario proves nothing", got)
		} else {
			t.Logf("the broken step is caught: %v", err)
		}
	})
}

// TestShipGapAndSentinel: bytes past the stored position store nothing and name where to
// send from; a sentinel is exited only once every line before it is stored.
func TestShipGapAndSentinel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		s := newShipEnv(t, nb(t))
		tok, _ := s.startShip("", "run-g")
		j, ends := journalOf("run-g", 4, 7)
		a := shipOK(t, s.ship(tok, "run-g", 0, j[:ends[1]]))
		// The sentinel alone, sent from its own position: lines 3 and 4 are not stored.
		r := s.ship(a.Token, "run-g", ends[3], j[ends[3]:])
		r.wantProblem(t, http.StatusConflict, CodeShipGap)
		if r.Header.Get(wire.ShipNextHeader) != strconv.FormatInt(ends[1]-1, 10) {
			t.Fatalf("gap names %q, want %d", r.Header.Get(wire.ShipNextHeader), ends[1]-1)
		}
		// Bytes from the exact stored position (no byte before it): a gap too, naming a byte back.
		s.ship(a.Token, "run-g", ends[1], j[ends[1]:]).wantProblem(t, http.StatusConflict, CodeShipGap)
		if got, _ := s.logLines(DefaultDevTenant, "run-g"); onceInOrder(got, 2) != nil {
			t.Fatalf("a gap stored something: %v", got)
		}
		a = shipOK(t, s.ship(a.Token, "run-g", a.Next, j[a.Next:]))
		if a.State != wire.ShipExited {
			t.Fatalf("state %q, want exited", a.State)
		}
		if got, _ := s.logLines(DefaultDevTenant, "run-g"); onceInOrder(got, 4) != nil {
			t.Fatalf("log %v", got)
		}
		// A failed agent: its exit code and stderr tail.
		e := decode[wire.ShipEndResponse](t, s.end(a.Token, "run-g", 7, "boom: it broke\n").wantStatusRaw(t, 200))
		run := s.run("run-g")
		if e.Status != "failed" || run.Error == nil || run.Error.Code != "exit-7" || !strings.Contains(run.Error.Message, "boom: it broke") {
			t.Fatalf("end %+v, run error %+v", e, run.Error)
		}
	})
}

// TestShipRenewsEveryHalfLease: a ship answer renews the lease (and moves the token's
// expiry with it) only once half a lease has passed since the last renewal
// (agentrun.ShipRenewAfter), so a chatty run costs one run write per half lease; the
// answers in between keep the expiry and write no run.
func TestShipRenewsEveryHalfLease(t *testing.T) {
	s := newShipEnv(t, memstore.New())
	var mu sync.Mutex
	at := time.Now()
	s.hd.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return at }
	move := func(d time.Duration) { mu.Lock(); at = at.Add(d); mu.Unlock() }
	tok, cur := s.startShip("", "run-h")
	_, exp := s.hd.mintShip(DefaultDevTenant, "run-h", cur, false)
	half := s.hd.k.DriverLease() / 2 // the rule, written out: a test of ShipRenewAfter must not derive from it
	j, ends := journalOf("run-h", 3, 0)

	move(half - time.Millisecond)
	a := shipOK(t, s.ship(tok, "run-h", ShipFrom(cur), j[:ends[0]]))
	if a.ExpiresAt != exp.UnixMilli() {
		t.Fatalf("an answer %v after the renewal moved the expiry to %d (from %d); want it kept until %v", half-time.Millisecond, a.ExpiresAt, exp.UnixMilli(), half)
	}
	move(time.Millisecond)
	a = shipOK(t, s.ship(a.Token, "run-h", a.Next, j[a.Next:ends[1]]))
	if want := s.hd.now().Add(s.hd.shipLifetime()).UnixMilli(); a.ExpiresAt != want {
		t.Fatalf("an answer a half lease after the renewal: expiry %d, want it renewed to %d", a.ExpiresAt, want)
	}
}

// TestShipCancel: a cancel shows as state cancel (on a heartbeat and on a batch), and the
// end of a cancelled run is aborted whatever the code.
func TestShipCancel(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		s := newShipEnv(t, nb(t))
		tok, cur := s.startShip("", "run-c")
		j, ends := journalOf("run-c", 3, 0)
		a := shipOK(t, s.ship(tok, "run-c", ShipFrom(cur), j[:ends[0]]))
		s.do(req{method: post, path: "/v1/runs/run-c/cancel", body: map[string]any{}}).wantStatusRaw(t, http.StatusAccepted)
		a = shipOK(t, s.ship(a.Token, "run-c", a.Next, ""))
		if a.State != wire.ShipCancel {
			t.Fatalf("heartbeat after a cancel: %q", a.State)
		}
		a = shipOK(t, s.ship(a.Token, "run-c", a.Next, j[a.Next:ends[1]]))
		if a.State != wire.ShipCancel {
			t.Fatalf("batch after a cancel: %q", a.State)
		}
		a = shipOK(t, s.ship(a.Token, "run-c", a.Next, j[a.Next:]))
		if a.State != wire.ShipExited {
			t.Fatalf("sentinel after a cancel: %q", a.State)
		}
		e := decode[wire.ShipEndResponse](t, s.end(a.Token, "run-c", 143, "").wantStatusRaw(t, 200))
		if got, closed := s.logLines(DefaultDevTenant, "run-c"); e.Status != "aborted" || !closed || onceInOrder(got, 3) != nil {
			t.Fatalf("end %+v; log %v closed %v", e, got, closed)
		}
	})
}

// TestShipSupersededAfterTakeover: after a takeover's fence the old token stores nothing
// more (403 token-scope, its shipper exits), cannot end the run, and the new epoch's token
// ships on from the position stored.
func TestShipSupersededAfterTakeover(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		s := newShipEnv(t, nb(t))
		old, _ := s.startShip("", "run-t")
		j, ends := journalOf("run-t", 6, 0)
		a := shipOK(t, s.ship(old, "run-t", 0, j[:ends[2]]))
		at := decode[wire.AttachResponse](t, s.do(req{method: post, path: "/v1/runs/run-t/attach", body: map[string]any{}}).wantStatusRaw(t, 200))
		cl, err := s.hd.cursors.open(at.Cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []resp{
			s.ship(a.Token, "run-t", a.Next, j[a.Next:ends[4]]), // the old shipper's next batch
			s.ship(old, "run-t", 0, j[:ends[4]]),                // and its stale first token
			s.ship(a.Token, "run-t", a.Next, ""),                // a heartbeat
			s.end(a.Token, "run-t", 0, ""),
		} {
			r.wantProblem(t, http.StatusForbidden, CodeTokenScope)
		}
		if got, _ := s.logLines(DefaultDevTenant, "run-t"); onceInOrder(got, 3) != nil {
			t.Fatalf("the superseded token stored past the fence: %v", got)
		}
		tok, _ := s.hd.mintShip(DefaultDevTenant, "run-t", cl.cursor(), false)
		if ShipFrom(cl.cursor()) != ends[2]-1 {
			t.Fatalf("the takeover's cursor src %d, want %d", cl.cursor().Src, ends[2])
		}
		a = shipOK(t, s.ship(tok, "run-t", 0, j))
		if got, _ := s.logLines(DefaultDevTenant, "run-t"); onceInOrder(got, 6) != nil || a.State != wire.ShipExited {
			t.Fatalf("the new epoch's shipper: log %v, state %q", got, a.State)
		}
		if run := s.run("run-t"); run.Status.Terminal() {
			t.Fatalf("the old token ended the run: %+v", run)
		}
	})
}

// snapshot is what a refused request must leave unchanged: the run's record and its log.
func (s *shipEnv) snapshot(tenant, runID string) string {
	s.t.Helper()
	st, err := s.backend.Runs().State(tctx(s.t, tenant), runID)
	if err != nil {
		s.t.Fatal(err)
	}
	evs, next, closed, err := s.backend.Log().Read(tctx(s.t, tenant), runID, 0, 1000)
	if err != nil {
		s.t.Fatal(err)
	}
	b, _ := json.Marshal([]any{st, evs, next, closed})
	return string(b)
}

// TestShipTokenScope: a ship token on every other route, for another run, at a superseded
// epoch, of another tenant, expired, forged or tampered is refused with 401/403
// problem+json, and the run's record and log are exactly as before.
func TestShipTokenScope(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		s := newShipEnv(t, nb(t))
		tok, cur := s.startShip("", "run-a")
		j, ends := journalOf("run-a", 4, 0)
		a := shipOK(t, s.ship(tok, "run-a", 0, j[:ends[1]]))
		before := s.snapshot(DefaultDevTenant, "run-a")
		st := s.start("", "run-b", "thread-b")

		// Every other route, the token as the only credential (the dev server would take
		// the request as tenant local, the run's owner, without it).
		others := append(runRoutes("run-a", st.Cursor),
			req{method: get, path: "/v1/runs"},
			req{method: post, path: "/v1/runs", body: startBody("run-z", "thread-z")},
			req{method: get, path: "/v1/threads/thread-run-a/active-run"},
			req{method: post, path: "/v1/threads/thread-run-a/cancel", body: map[string]any{}},
			req{method: post, path: "/v1/runs/run-a/agent", body: map[string]any{"cursor": st.Cursor, "command": "true"}},
			req{method: post, path: "/v1/runs/run-a/pump", body: map[string]any{"cursor": st.Cursor}},
			req{method: get, path: "/v1/reaper/sweeps", specSays: "silent"},
			req{method: post, path: wire.PushTicketPath, body: map[string]any{}},
			req{method: get, path: "/v1/store/runs/run-a", specSays: "silent"},
			req{method: get, path: "/v1/nowhere", specSays: "silent"},
		)
		covered := map[string]bool{}
		for _, r := range others {
			r.headers = map[string]string{"Authorization": "Bearer " + a.Token}
			if r.specSays == "" {
				r.specSays = "silent" // the document's security is not what this checks
			}
			s.do(r).wantProblem(t, http.StatusForbidden, CodeTokenScope)
			_, pat := s.hd.mux.Handler(httptestRequest(r.method, r.path))
			covered[pat] = true
		}
		for _, rt := range Routes() {
			if !rt.Ship() && !strings.HasPrefix(rt.Path, "/v1/store/") && !covered[rt.Pattern()] {
				t.Errorf("route %s not probed with a ship token", rt.Pattern())
			}
		}

		key := []byte("test cursor key, 32 bytes long!!")
		now := time.Now()
		claims := shiptoken.Claims{Tenant: DefaultDevTenant, RunID: "run-a", Epoch: cur.Epoch, Expires: now.Add(time.Hour), Next: cur.Next, Src: cur.Src}
		mint := func(k []byte, c shiptoken.Claims) string { return shiptoken.Mint(k, c) }
		expired, other, forgedKey, tenantB := claims, claims, claims, claims
		expired.Expires = now.Add(-time.Second)
		other.RunID = "run-b"
		tenantB.Tenant = "tenant-b"
		tampered := []byte(a.Token)
		tampered[len(shiptoken.Prefix)+3] ^= 1
		cases := []struct {
			name   string
			r      req
			status int
			code   string
		}{
			{"expired", req{headers: shipHeaders(mint(key, expired))}, 401, CodeTokenExpired},
			{"forged", req{headers: shipHeaders(mint([]byte("another key, another key, 32 by"), forgedKey))}, 401, CodeInvalidToken},
			{"tampered", req{headers: shipHeaders(string(tampered))}, 401, CodeInvalidToken},
			{"not a token", req{headers: shipHeaders("eyJhbGciOiJIUzI1NiJ9.e30.x")}, 401, CodeInvalidToken},
			{"none", req{headers: map[string]string{"Content-Type": wire.ShipContentType}}, 401, CodeInvalidToken},
			{"a cursor", req{headers: shipHeaders(st.Cursor)}, 401, CodeInvalidToken},
			{"with a tenant header", req{tenant: DefaultDevTenant, headers: shipHeaders(a.Token)}, 401, CodeInvalidToken},
			{"another run's", req{headers: shipHeaders(mint(key, other))}, 403, CodeTokenScope},
			// Its own tenant has no run-a: refused (a 4xx problem), whatever the reason given.
			{"another tenant's", req{headers: shipHeaders(mint(key, tenantB))}, 0, ""},
		}
		for _, c := range cases {
			for _, p := range []string{fmt.Sprintf("/v1/runs/run-a/ship?src=%d", a.Next), "/v1/runs/run-a/ship/end?code=0"} {
				r := c.r
				r.method, r.path, r.body = post, p, []byte(j[a.Next:])
				got := s.do(r)
				if c.status != 0 {
					got.wantProblem(t, c.status, c.code)
				} else if got.Status < 400 || got.Status >= 500 || got.problem(t).Code == "" {
					t.Fatalf("%s at %s: %d %s, want a refusal", c.name, p, got.Status, got.Body)
				}
			}
			if after := s.snapshot(DefaultDevTenant, "run-a"); after != before {
				t.Fatalf("%s: the run changed:\n%s\n%s", c.name, before, after)
			}
		}
		// The other tenant's token names its own tenant's run-a, which does not exist: it
		// can only ever reach that tenant.
		if got, _ := s.logLines(MapTenant("tenant-b"), "run-a"); len(got) != 0 {
			t.Fatalf("tenant-b's log of run-a: %v", got)
		}
		// The superseded epoch is TestShipSupersededAfterTakeover's; the genuine token
		// still works after all of this.
		shipOK(t, s.ship(a.Token, "run-a", a.Next, j[a.Next:]))
		if got, _ := s.logLines(DefaultDevTenant, "run-a"); onceInOrder(got, 4) != nil {
			t.Fatalf("log %v", got)
		}
	})
}

func httptestRequest(method, path string) *http.Request {
	r, _ := http.NewRequest(method, "http://127.0.0.1"+path, nil)
	return r
}

// TestShipBounds: a flooding agent stays within the bounds: a body past 1 MiB is refused
// whole, a huge line is stored as pieces within the event bound, many lines in one body
// are stored in order within the event bound, and past the run's rate 429 rate-limited stores nothing.
func TestShipBounds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		s := newShipEnv(t, nb(t))
		tok, _ := s.startShip("", "run-f")
		s.hd.shipRate = newShipRate(ShipLimits{Rate: 1000, Burst: 1000, ByteRate: 1 << 30, ByteBurst: 1 << 30}) // the rate is checked below
		s.do(req{method: post, path: "/v1/runs/run-f/ship?src=0", body: []byte(strings.Repeat("x", wire.MaxShipBytes+1)),
			headers: shipHeaders(tok), specSays: "invalid"}).wantProblem(t, http.StatusBadRequest, CodeInvalid)

		// A line of 2.5 MiB, sent in three bodies.
		huge := strings.Repeat("y", 5<<19) + "\n"
		var a wire.ShipResponse
		a.Token = tok
		for pos, round := int64(0), 0; pos == 0 || a.Next+1 < int64(len(huge)); pos, round = a.Next, round+1 {
			if round == 5 {
				t.Fatalf("the line is not stored after %d bodies: next %d of %d", round, a.Next, len(huge))
			}
			end := min(pos+wire.MaxShipBytes, int64(len(huge)))
			a = shipOK(t, s.ship(a.Token, "run-f", pos, huge[pos:end]))
			if a.Next+1 < end-int64(journal.MaxLineBytes) {
				t.Fatalf("after bytes to %d the next position is %d: a long line is held back", end, a.Next)
			}
		}
		// Then 6,500 short lines in one body (a full MiB of them takes dynalite minutes).
		var many bytes.Buffer
		for i := 1; many.Len() < 64<<10; i++ {
			fmt.Fprintf(&many, "{\"n\":%d}\n", i)
		}
		start := int64(len(huge))
		body := huge[a.Next:] + many.String()
		a = shipOK(t, s.ship(a.Token, "run-f", a.Next, body))
		if a.Next != start+int64(many.Len())-1 {
			t.Fatalf("next %d, want %d", a.Next, start+int64(many.Len())-1)
		}
		evs, text := s.readAll("run-f")
		if text != huge[:len(huge)-1] {
			t.Fatalf("the long line's pieces rebuild %d bytes, want %d", len(text), len(huge)-1)
		}
		nums := 0
		for _, ev := range evs {
			if len(ev.Data) > contract.MaxEventBytes {
				t.Fatalf("an event of %d bytes", len(ev.Data))
			}
			var m struct{ N int }
			if json.Unmarshal(ev.Data, &m) == nil && m.N > 0 {
				if nums++; m.N != nums {
					t.Fatalf("line %d where %d belongs", m.N, nums)
				}
			}
		}
		if want := bytes.Count(many.Bytes(), []byte("\n")); nums != want {
			t.Fatalf("%d short lines stored, want %d", nums, want)
		}

		// The rate: a burst of three requests, then 429 with Retry-After and nothing stored.
		s.hd.shipRate = newShipRate(ShipLimits{Rate: 1e-6, Burst: 3})
		j := fmt.Sprintf("\n{\"n\":%d}\n", nums+1) // from next: the stored line's newline, then one more
		for range 3 {
			shipOK(t, s.ship(a.Token, "run-f", a.Next, ""))
		}
		before := s.snapshot(DefaultDevTenant, "run-f")
		r := s.ship(a.Token, "run-f", a.Next, j)
		r.wantProblem(t, http.StatusTooManyRequests, CodeRateLimited)
		if r.Header.Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
		if s.snapshot(DefaultDevTenant, "run-f") != before {
			t.Fatal("a rate-limited request changed the run")
		}
		// The byte bound: a fresh run's bucket holds four full bodies, not five (bodies of
		// bytes already stored: the bound counts what is sent, not what is new).
		s.hd.shipRate = newShipRate(ShipLimits{Rate: 100, Burst: 100, ByteRate: 1, ByteBurst: 4 * wire.MaxShipBytes})
		for i := range 5 {
			r := s.ship(a.Token, "run-f", 0, huge[:wire.MaxShipBytes])
			if i < 4 && r.Status == http.StatusTooManyRequests || i == 4 && r.Status != http.StatusTooManyRequests {
				t.Fatalf("body %d of 1 MiB: status %d", i+1, r.Status)
			}
		}
	})
}

// readAll returns runID's events and the text of its piece events joined.
func (s *shipEnv) readAll(runID string) ([]contract.Event, string) {
	s.t.Helper()
	var out []contract.Event
	var text strings.Builder
	after := int64(0)
	for {
		evs, next, _, err := s.backend.Log().Read(tctx(s.t, DefaultDevTenant), runID, after, 1000)
		if err != nil {
			s.t.Fatal(err)
		}
		if len(evs) == 0 {
			return out, text.String()
		}
		for _, ev := range evs {
			var p struct {
				Line *string `json:"__line"`
			}
			if json.Unmarshal(ev.Data, &p) == nil && p.Line != nil {
				text.WriteString(*p.Line)
			}
		}
		out = append(out, evs...)
		after = next
	}
}

// TestShipProbeAndHost: the probe answers anyone; a dev server serves the ship routes under
// any Host (a sandbox reaches it by its public address), every other route only under its
// loopback Host or its public URL's.
func TestShipProbeAndHost(t *testing.T) {
	s := newShipEnv(t, nil)
	r := s.do(req{method: get, path: wire.ShipProbePath})
	if r.Status != http.StatusNoContent || len(r.Body) != 0 {
		t.Fatalf("probe: %d %s", r.Status, r.Body)
	}
	tok, _ := s.startShip("", "run-h")
	s.hd.host = LoopbackHost("8080")
	serve := func(method, path, body string, h map[string]string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Host = "sandkeep.example:9000" // a sandbox's view of the server
		for k, v := range h {
			r.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		s.h.ServeHTTP(rec, r)
		return rec
	}
	if rec := serve(get, wire.ShipProbePath, "", nil); rec.Code != http.StatusNoContent {
		t.Fatalf("probe under another Host: %d", rec.Code)
	}
	if rec := serve(post, "/v1/runs/run-h/ship?src=0", "{\"n\":1}\n", shipHeaders(tok)); rec.Code != http.StatusOK {
		t.Fatalf("ship under another Host: %d %s", rec.Code, rec.Body)
	}
	if rec := serve(get, "/v1/runs/run-h", "", nil); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), CodeForbiddenHost) {
		t.Fatalf("another route under another Host: %d %s", rec.Code, rec.Body)
	}
	if got, _ := s.logLines(DefaultDevTenant, "run-h"); onceInOrder(got, 1) != nil {
		t.Fatalf("log %v", got)
	}
	// The public URL's host is this server's too (an operator's forwarder): every route
	// answers under it, and still under no other.
	s.h = New(Config{Keeper: s.hd.k, Auth: DevAuth{}, CursorKey: s.hd.cursors.key, PublicURL: "http://sandkeep.example:9000",
		AllowHost: LoopbackHost("8080")})
	if rec := serve(get, "/v1/runs/run-h", "", nil); rec.Code != http.StatusOK {
		t.Fatalf("another route under the public URL's Host: %d %s", rec.Code, rec.Body)
	}
	s.h = New(Config{Keeper: s.hd.k, Auth: DevAuth{}, CursorKey: s.hd.cursors.key, PublicURL: "http://sandkeep.example:9001",
		AllowHost: LoopbackHost("8080")})
	if rec := serve(get, "/v1/runs/run-h", "", nil); rec.Code != http.StatusForbidden {
		t.Fatalf("another route under a Host neither loopback nor public: %d %s", rec.Code, rec.Body)
	}
}

// run reads runID's record (tenant local) straight from the backend.
func (s *shipEnv) run(runID string) contract.RunRecord {
	s.t.Helper()
	st, err := s.backend.Runs().State(tctx(s.t, DefaultDevTenant), runID)
	if err != nil || st == nil {
		s.t.Fatalf("run %s: %v", runID, err)
	}
	return st.RunRecord
}

// TestShipCostOnDynalite measures what one ship request of a chatty agent costs on
// dynalite: the DynamoDB calls per request of 100 lines (counted, and bounded: the
// append at the token's cursor, no fence and no run read), and the server time per request
// (line written → stored as the route sees it; reported, never judged).
func TestShipCostOnDynalite(t *testing.T) {
	count := callcount.New()
	client := dynamotest.Client(t, count.Attach)
	s := newShipEnv(t, dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)}))
	tok, cur := s.startShip("", "run-m")
	const batches, perBatch = 30, 100
	var j strings.Builder
	a := wire.ShipResponse{Token: tok, Next: ShipFrom(cur)}
	var took []time.Duration
	count.Reset()
	calls := map[string]int{}
	for b := range batches {
		start := int64(j.Len())
		for i := 1; i <= perBatch; i++ {
			fmt.Fprintf(&j, "{\"n\":%d,\"text\":\"a line of a chatty agent's output\"}\n", b*perBatch+i)
		}
		text := j.String()
		if a.Next > start {
			t.Fatalf("next %d past the batch's start %d", a.Next, start)
		}
		before := count.Total()
		t0 := time.Now()
		a = shipOK(t, s.ship(a.Token, "run-m", a.Next, text[a.Next:]))
		took = append(took, time.Since(t0))
		calls[strconv.Itoa(count.Total()-before)]++
	}
	if got, _ := s.logLines(DefaultDevTenant, "run-m"); onceInOrder(got, batches*perBatch) != nil {
		t.Fatalf("%d lines stored", len(got))
	}
	slices.Sort(took)
	t.Logf("ship request of %d lines on dynalite: p50 %v, p90 %v, max %v; DynamoDB calls per request: %v; per operation: %v",
		perBatch, took[len(took)/2], took[len(took)*9/10], took[len(took)-1], calls, count.Snapshot())
	for n := range calls {
		if k, _ := strconv.Atoi(n); k > 3 {
			t.Errorf("a ship request of %d lines made %d DynamoDB calls, want at most 3 (the append, and a heartbeat per half lease)", perBatch, k)
		}
	}
}

// TestShipLaunchTokenCarriesThePosition: the token the agent route hands a launched
// shipper carries the launch cursor's position (docs/design.md §8.2), so the shipper's
// first request (src=0, empty: where does the log stand?) appends at it and costs the run
// read alone on dynalite; a token without the hint must first fence the log (its tail
// query and write) to learn the same answer. The token is the one the real launch minted,
// caught by a stand-in API the shipper reaches.
func TestShipLaunchTokenCarriesThePosition(t *testing.T) {
	count := callcount.New()
	client := dynamotest.Client(t, count.Attach)
	b := dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
	got := make(chan string, 1)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == wire.ShipProbePath {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		select {
		case got <- strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "):
		default:
		}
		w.WriteHeader(http.StatusGone) // the shipper ends
	}))
	defer sink.Close()
	e := newEnv(t, DevAuth{}, b)
	key := []byte("test cursor key, 32 bytes long!!")
	k := e.h.(*handler).k
	e.h = New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: key, Logger: slog.New(slog.NewJSONHandler(e.logs, nil)), PublicURL: sink.URL})
	hd := e.h.(*handler)

	st := e.start("", "run-p", "thread-p")
	ap := decode[appendResponse](t, e.appendEvents("", "run-p", st.Cursor, "before the agent"))
	a := decode[wire.AgentResponse](t, e.do(req{method: post, path: "/v1/runs/run-p/agent",
		body: map[string]any{"cursor": ap.Cursor, "command": "exit 0"}}).wantStatusRaw(t, 200))
	if a.Shipping != agentrun.ShippingSandbox {
		t.Fatalf("agent: %+v, want shipping sandbox", a)
	}
	var tok string
	select {
	case tok = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the shipper sent nothing")
	}
	cl, err := shiptoken.Verify(key, tok, time.Now())
	cur, cerr := hd.cursors.open(ap.Cursor)
	if err != nil || cerr != nil || cl.Next < 1 || cl.Next != cur.cursor().Next || cl.Src != cur.cursor().Src || cl.Epoch != cur.cursor().Epoch {
		t.Fatalf("the launch token's claims %+v (err %v), want the launch cursor %+v (err %v)", cl, err, cur.cursor(), cerr)
	}
	first := func(tok string) (int, wire.ShipResponse) {
		t.Helper()
		count.Reset()
		out := shipOK(t, e.do(req{method: post, path: "/v1/runs/run-p/ship?src=0", headers: shipHeaders(tok)}))
		return count.Total(), out
	}
	hinted, ha := first(tok)
	bare := agentrun.ShipToken(key, cl.Tenant, cl.RunID, contract.Cursor{Epoch: cl.Epoch}, false, cl.Expires)
	unhinted, ua := first(bare)
	t.Logf("the shipper's first request: %d DynamoDB calls with the launch hint, %d without", hinted, unhinted)
	if ha.Next != ua.Next || ha.State != wire.ShipRunning || ua.State != wire.ShipRunning {
		t.Fatalf("answers disagree: hinted %+v, bare %+v", ha, ua)
	}
	if hinted != 1 || unhinted != 3 {
		t.Fatalf("first request: %d calls hinted, %d bare; want 1 (the run read) and 3 (the fence's query and write, then the run read)", hinted, unhinted)
	}
}

// TestShipRoutineAnswersLogAtDebug: a ship route's routine answer (the probe, a stored
// batch) writes no request line at INFO, the deployed level; a refusal, a gap and a slow
// routine answer do, with their context; at DEBUG the routine answers are there too.
func TestShipRoutineAnswersLogAtDebug(t *testing.T) {
	s := newShipEnv(t, nil)
	tok, _ := s.startShip("", "run-q")
	text, ends := journalOf("run-q", 3, -1)
	since := func() func() []map[string]any { // the request lines written from now on
		n := len(s.logs.lines(t))
		return func() []map[string]any { return s.logs.lines(t)[n:] }
	}

	quiet := since()
	s.do(req{method: get, path: wire.ShipProbePath}).wantStatusRaw(t, http.StatusNoContent)
	out := shipOK(t, s.ship(tok, "run-q", 0, text[:ends[0]]))
	if l := quiet(); len(l) != 0 {
		t.Fatalf("routine ship answers logged at INFO: %v", l)
	}

	loud := since()
	s.ship("skship1.forged.x", "run-q", out.Next, text[out.Next:ends[1]]).wantProblem(t, http.StatusUnauthorized, CodeInvalidToken)
	s.ship(out.Token, "run-q", ends[1]+5, "x\n").wantProblem(t, http.StatusConflict, CodeShipGap)
	l := loud()
	if len(l) != 2 || l[0]["level"] != "INFO" || l[0]["code"] != CodeInvalidToken || l[0]["route"] != "POST /v1/runs/{runId}/ship" ||
		l[1]["code"] != CodeShipGap || l[1]["runId"] != "run-q" || l[1]["status"] != float64(http.StatusConflict) || l[1]["requestId"] == "" {
		t.Fatalf("refusals logged %v, want an INFO line each with route, code, run and request id", l)
	}

	// A routine answer past slowShip is logged: the clock moves slowShip per reading.
	var mu sync.Mutex
	at := time.Now()
	s.hd.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		at = at.Add(slowShip)
		return at
	}
	slow := since()
	out = shipOK(t, s.ship(out.Token, "run-q", out.Next, text[out.Next:ends[1]]))
	if l := slow(); len(l) != 1 || l[0]["status"] != float64(200) || l[0]["latencyMs"].(float64) < float64(slowShip.Milliseconds()) || l[0]["outcome"] != "1" {
		t.Fatalf("a slow ship answer logged %v, want its INFO line with its latency", l)
	}
	s.hd.now = time.Now

	// At DEBUG (an operator's ApplicationLogLevel) the routine answers are logged too.
	s.hd.log = slog.New(slog.NewJSONHandler(&s.logs.Buffer, &slog.HandlerOptions{Level: slog.LevelDebug}))
	debug := since()
	shipOK(t, s.ship(out.Token, "run-q", out.Next, text[out.Next:ends[2]]))
	if l := debug(); len(l) != 1 || l[0]["level"] != "DEBUG" || l[0]["route"] != "POST /v1/runs/{runId}/ship" || l[0]["runId"] != "run-q" {
		t.Fatalf("at DEBUG a routine ship answer logged %v, want its DEBUG line", l)
	}

	for _, c := range []struct {
		pattern string
		status  int
		want    bool
	}{
		{"GET " + wire.ShipProbePath, 204, true}, {"POST /v1/runs/{runId}/ship", 200, true}, {"POST /v1/runs/{runId}/ship/end", 200, true},
		{"POST /v1/runs/{runId}/ship", 409, false}, {"POST /v1/runs/{runId}/ship", 503, false}, {"POST /v1/runs/{runId}/ship", 0, false},
		{"POST /v1/runs/{runId}/events", 200, false}, {"unmatched", 200, false}, {"", 200, false},
	} {
		if QuietShip(c.pattern, c.status) != c.want {
			t.Errorf("QuietShip(%q, %d) = %v", c.pattern, c.status, !c.want)
		}
	}
}
