package apiclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// newAPI serves the real handler set over the in-memory backend and local-process
// sandboxes and returns its base URL.
func newAPI(t *testing.T) string { return clitest.ServeAPI(t, localprocess.New(t.TempDir())) }

func newClient(t *testing.T, cfg apiclient.Config) *apiclient.Client {
	t.Helper()
	c, err := apiclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func startReq(run, thread string) wire.StartRequest {
	return wire.StartRequest{RunID: run, ThreadID: thread, Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}}
}

// TestRoutes drives every route of the existing API through the client against the real
// handlers, and checks that refusals arrive as the sandbox sentinels with their codes.
func TestRoutes(t *testing.T) {
	api := newAPI(t)
	ctx := context.Background()
	c := newClient(t, apiclient.Config{BaseURL: api, Tenant: "acme"})

	st, err := c.Start(ctx, startReq("run-1", "thread-1"))
	if err != nil || st.Outcome != wire.OutcomeCreated || st.DriverEpoch != 1 || st.Cursor == "" {
		t.Fatalf("start: %+v %v", st, err)
	}
	ap, err := c.Append(ctx, "run-1", wire.AppendRequest{Cursor: st.Cursor, Events: []wire.EventIn{{Data: json.RawMessage(`{"n":1}`)}, {Data: json.RawMessage(`"two"`)}}})
	if err != nil || ap.LastOffset != 2 {
		t.Fatalf("append: %+v %v", ap, err)
	}
	page, err := c.ReadEvents(ctx, "run-1", apiclient.ReadOptions{})
	if err != nil || len(page.Events) != 2 || string(page.Events[1].Data) != `"two"` || page.Closed {
		t.Fatalf("read: %+v %v", page, err)
	}
	if run, err := c.GetRun(ctx, "run-1"); err != nil || run.Status != contract.StatusRunning {
		t.Fatalf("get: %+v %v", run, err)
	}
	if act, err := c.ActiveRun(ctx, "thread-1"); err != nil || act == nil || act.RunID != "run-1" {
		t.Fatalf("active-run: %+v %v", act, err)
	}
	if hb, err := c.Heartbeat(ctx, "run-1", ap.Cursor); err != nil || hb.LeaseUntil == 0 {
		t.Fatalf("heartbeat: %+v %v", hb, err)
	}
	if sb, err := c.Snapshot(ctx, "run-1", ap.Cursor, "before-detach"); err != nil || sb.ProviderSandboxID == "" {
		t.Fatalf("snapshot: %+v %v", sb, err)
	}
	if run, err := c.Detach(ctx, "run-1", ap.Cursor); err != nil || run.DetachedSince == nil {
		t.Fatalf("detach: %+v %v", run, err)
	}
	at, err := c.Attach(ctx, "run-1")
	if err != nil || at.DriverEpoch != 2 || at.LastOffset < 2 {
		t.Fatalf("attach: %+v %v", at, err)
	}

	// The old driver is fenced out: a sentinel with the problem's code and request id.
	_, err = c.Heartbeat(ctx, "run-1", ap.Cursor)
	var apiErr *apiclient.Error
	if !errors.Is(err, contract.ErrSuperseded) || !errors.As(err, &apiErr) || apiErr.Code != wire.CodeSuperseded || apiErr.Status != 409 || apiErr.RequestID == "" {
		t.Fatalf("stale heartbeat: %v (%+v)", err, apiErr)
	}
	// A cursor the server cannot verify (another key: a restarted dev server) is
	// ErrStaleCursor, a conflict no retry heals.
	_, err = c.Heartbeat(ctx, "run-1", "not-a-cursor."+strings.Repeat("A", 43))
	if !errors.Is(err, apiclient.ErrStaleCursor) || !errors.Is(err, contract.ErrConflict) || !errors.As(err, &apiErr) ||
		apiErr.Code != wire.CodeStaleCursor || apiErr.Status != 409 || apiclient.Transient(err) {
		t.Fatalf("unverifiable cursor: %v (%+v)", err, apiErr)
	}
	if run, err := c.Cancel(ctx, "run-1"); err != nil || !run.Cancelled() {
		t.Fatalf("cancel: %+v %v", run, err)
	}
	fin, err := c.Finish(ctx, "run-1", wire.FinishRequest{Cursor: at.Cursor, Status: "aborted"})
	if err != nil || fin.Status != contract.StatusAborted {
		t.Fatalf("finish: %+v %v", fin, err)
	}
	if page, err := c.ReadEvents(ctx, "run-1", apiclient.ReadOptions{After: 1}); err != nil || !page.Closed || len(page.Events) != 1 {
		t.Fatalf("read after finish: %+v %v", page, err)
	}
	if _, err := c.Attach(ctx, "run-1"); !errors.Is(err, contract.ErrTerminalRun) {
		t.Fatalf("attach a finished run: %v", err)
	}
	// cancel by thread
	if _, err := c.Start(ctx, startReq("run-2", "thread-1")); err != nil {
		t.Fatal(err)
	}
	if run, err := c.CancelThread(ctx, "thread-1"); err != nil || run.RunID != "run-2" || !run.Cancelled() {
		t.Fatalf("cancel thread: %+v %v", run, err)
	}

	// Tenants never cross: another tenant sees no such run.
	other := newClient(t, apiclient.Config{BaseURL: api, Tenant: "someone-else"})
	if _, err := other.GetRun(ctx, "run-1"); !errors.Is(err, contract.ErrUnknownRun) {
		t.Fatalf("foreign get: %v", err)
	}
	// A client's mistake is ErrInvalid naming the field.
	if _, err := c.Start(ctx, wire.StartRequest{RunID: "run-3", ThreadID: "t"}); !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), "sandbox") {
		t.Fatalf("invalid start: %v", err)
	}
}

// TestLongPoll: a waiting read returns as soon as an event is appended.
func TestLongPoll(t *testing.T) {
	api := newAPI(t)
	ctx := context.Background()
	c := newClient(t, apiclient.Config{BaseURL: api})
	st, err := c.Start(ctx, startReq("run-1", "thread-1"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan wire.ReadResponse, 1)
	go func() {
		page, err := c.ReadEvents(ctx, "run-1", apiclient.ReadOptions{Wait: 15 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- page
	}()
	if _, err := c.Append(ctx, "run-1", wire.AppendRequest{Cursor: st.Cursor, Events: []wire.EventIn{{Data: json.RawMessage(`1`)}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case page := <-got:
		if len(page.Events) != 1 {
			t.Fatalf("long poll answered %+v", page)
		}
	case <-time.After(14 * time.Second):
		t.Fatal("the long poll did not return on the append")
	}
}

// flaky answers the first n requests with status (and Retry-After) and forwards the rest.
type flaky struct {
	next       http.Handler
	n          int32
	status     int
	retryAfter string
	calls      atomic.Int32
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.calls.Add(1) <= f.n {
		if f.retryAfter != "" {
			w.Header().Set("Retry-After", f.retryAfter)
		}
		w.Header().Set("Content-Type", wire.ProblemContentType)
		w.WriteHeader(f.status)
		_, _ = io.WriteString(w, `{"type":"urn:sandkeep:problem:unavailable","title":"Temporarily unavailable","status":503,"detail":"retry","code":"unavailable","requestId":"r-1"}`)
		return
	}
	f.next.ServeHTTP(w, r)
}

// TestRetries: a call that is safe to repeat is repeated after the answer's Retry-After;
// one that is not (start) is never repeated; no retry outlives the context's deadline.
func TestRetries(t *testing.T) {
	api := newAPI(t)
	target, _ := url.Parse(api)
	f := &flaky{next: httputil.NewSingleHostReverseProxy(target), status: 503, retryAfter: "1"}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	c := newClient(t, apiclient.Config{BaseURL: srv.URL, RetryBase: time.Millisecond, RetryMax: 2 * time.Millisecond})
	direct := newClient(t, apiclient.Config{BaseURL: api})

	// start: never repeated.
	f.n = 1
	_, err := c.Start(ctx, startReq("run-1", "thread-1"))
	var apiErr *apiclient.Error
	if !errors.Is(err, apiclient.ErrUnavailable) || !errors.As(err, &apiErr) || apiErr.RetryAfter != time.Second || f.calls.Load() != 1 || !apiclient.Transient(err) {
		t.Fatalf("start through a 503: %v, %d calls", err, f.calls.Load())
	}
	st, err := direct.Start(ctx, startReq("run-1", "thread-1"))
	if err != nil {
		t.Fatal(err)
	}

	// heartbeat: repeated after Retry-After (1 s), then answered.
	f.calls.Store(0)
	f.n = 2
	t0 := time.Now()
	if _, err := c.Heartbeat(ctx, "run-1", st.Cursor); err != nil {
		t.Fatalf("heartbeat through two 503s: %v", err)
	}
	if n, waited := f.calls.Load(), time.Since(t0); n != 3 || waited < 2*time.Second {
		t.Fatalf("heartbeat: %d calls in %v, want 3 calls honouring Retry-After: 1 twice", n, waited)
	}

	// A deadline shorter than the Retry-After: the 503 is reported at once, not waited out.
	f.calls.Store(0)
	f.n = 100
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	t0 = time.Now()
	if _, err := c.GetRun(dctx, "run-1"); !errors.Is(err, apiclient.ErrUnavailable) {
		t.Fatalf("get under a short deadline: %v", err)
	}
	if f.calls.Load() != 1 || time.Since(t0) > 250*time.Millisecond {
		t.Fatalf("get under a short deadline: %d calls, %v", f.calls.Load(), time.Since(t0))
	}

	// A client error is never repeated.
	f.calls.Store(0)
	f.n = 0
	if _, err := c.GetRun(ctx, "no-such-run"); !errors.Is(err, contract.ErrUnknownRun) || f.calls.Load() != 1 || apiclient.Transient(err) {
		t.Fatalf("unknown run: %v after %d calls", err, f.calls.Load())
	}
}

// TestRetryNetworkFailure: a safe call survives a refused connection (the server comes
// back); the attempts stop at MaxAttempts.
func TestRetryNetworkFailure(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close() // nothing listens there now
	c := newClient(t, apiclient.Config{BaseURL: addr, MaxAttempts: 3, RetryBase: time.Millisecond, RetryMax: time.Millisecond})
	_, err := c.GetRun(context.Background(), "run-1")
	if err == nil || !strings.Contains(err.Error(), "GET /v1/runs/run-1") || !apiclient.Transient(err) {
		t.Fatalf("get from nowhere: %v", err)
	}
}

// TestForeignBody: an answer that is not problem+json (API Gateway's own 403) keeps its
// status and text and matches ErrUnauthenticated.
func TestForeignBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `{"message":"Forbidden"}`)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, apiclient.Config{BaseURL: srv.URL})
	_, err := c.GetRun(context.Background(), "run-1")
	var apiErr *apiclient.Error
	if !errors.Is(err, apiclient.ErrUnauthenticated) || !errors.As(err, &apiErr) || apiErr.Status != 403 || apiErr.Detail != "Forbidden" {
		t.Fatalf("403: %v", err)
	}
}

// TestBearer: the token rides in Authorization on every attempt; an empty token fails
// before anything is sent.
func TestBearer(t *testing.T) {
	var auth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		_, _ = io.WriteString(w, `{"run":null}`)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, apiclient.Config{BaseURL: srv.URL, Auth: apiclient.StaticToken("eyJ.token.sig")})
	if _, err := c.ActiveRun(context.Background(), "thread-1"); err != nil || auth.Load() != "Bearer eyJ.token.sig" {
		t.Fatalf("bearer: %v %v", err, auth.Load())
	}
	empty := newClient(t, apiclient.Config{BaseURL: srv.URL, Auth: apiclient.StaticToken(" ")})
	if _, err := empty.ActiveRun(context.Background(), "thread-1"); err == nil || !strings.Contains(err.Error(), "token") {
		t.Fatalf("empty token: %v", err)
	}
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://user:pw@host", "http://h/?q=1"} {
		if _, err := apiclient.New(apiclient.Config{BaseURL: u}); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
}
