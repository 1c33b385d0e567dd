// Package e2bfake is a local stand-in for E2B for tests: the control plane, validated
// exchange by exchange against an OpenAPI subset document (and, when given, E2B's
// published one), and envd's process service, which runs the requested commands for
// real on this machine so process groups are real. Its Connect envelope code is its
// own, not the client's, so a codec bug on either side shows.
package e2bfake

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// A local stand-in for E2B: the control plane (validated against the subset document
// and, when available, E2B's published one) and envd's process service, which runs the
// requested commands for real on this machine so process groups are real.

// specValidator validates requests and responses against one OpenAPI document.
type specValidator struct {
	name   string
	doc    *openapi3.T
	router routers.Router
	// strict: an undeclared response status is an error (the subset declares all it
	// may see; the published document does not list 403/429/502 everywhere).
	strict bool
}

func newValidator(t testing.TB, name string, data []byte, strict bool) *specValidator {
	t.Helper()
	l := openapi3.NewLoader()
	doc, err := l.LoadFromData(data)
	if err != nil {
		t.Fatalf("%s: load: %v", name, err)
	}
	if err := doc.Validate(l.Context); err != nil {
		t.Fatalf("%s: invalid document: %v", name, err)
	}
	doc.Servers = nil // route on the path alone; the test server's address is arbitrary
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("%s: router: %v", name, err)
	}
	return &specValidator{name: name, doc: doc, router: r, strict: strict}
}

func apiKeyAuth(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	s := in.SecurityScheme
	if s.Type == "apiKey" && s.In == "header" && strings.EqualFold(s.Name, "X-API-Key") {
		if in.RequestValidationInput.Request.Header.Get("X-API-Key") == "" {
			return errors.New("no X-API-Key header")
		}
		return nil
	}
	return errors.New("scheme not used by sandkeep")
}

// check validates one exchange; it returns the problems found.
func (v *specValidator) check(r *http.Request, body []byte, status int, header http.Header, respBody []byte) []string {
	req := r.Clone(context.Background())
	req.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		return []string{fmt.Sprintf("%s: %s %s: no route: %v", v.name, r.Method, r.URL.Path, err)}
	}
	in := &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: apiKeyAuth},
	}
	var out []string
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
		out = append(out, fmt.Sprintf("%s: request %s %s: %v", v.name, r.Method, r.URL.Path, err))
	}
	rin := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: status, Header: header,
		Options: &openapi3filter.Options{IncludeResponseStatus: v.strict},
	}
	rin.SetBodyBytes(respBody)
	if err := openapi3filter.ValidateResponse(context.Background(), rin); err != nil {
		out = append(out, fmt.Sprintf("%s: response %d to %s %s: %v", v.name, status, r.Method, r.URL.Path, err))
	}
	if !v.strict && route.Operation.Responses.Status(status) == nil && route.Operation.Responses.Default() == nil {
		// Not an error: noted so the report can say which statuses only the subset covers.
		out = append(out, "note:"+fmt.Sprintf("%s %s %d", r.Method, route.Path, status))
	}
	return out
}

// Box is one fake sandbox.
type Box struct {
	ID, Template, Token string // Token: its envd access token
	Meta                map[string]string
	State               string // "running" or "paused"
	Started, End        time.Time
	AutoPause, Secure   bool
	Dir                 string // the working directory its commands run in (and their HOME)

	// The billing clock: compute time accumulated while running, and since when it has
	// been running (zero while paused).
	ran      time.Duration
	runSince time.Time
	// A held pause (HoldPause): held makes the next pause wait for release; pausing is
	// non-nil while a pause is in progress and closed when it completes.
	held    bool
	release chan struct{}
	pausing chan struct{}
}

// Fault is an injected answer for the next call of an operation.
type Fault struct {
	Status     int
	Apply      bool // perform the operation, then answer Status anyway (a lost success)
	Hang       bool // never answer; the client's attempt timeout must end it
	RetryAfter string
	// Envd, for OpEnvd only: "" answers Status before anything starts (Connect error
	// body); "truncate" starts the process, sends a start and a data event and drops
	// the connection; "end-error" answers 200 and ends the stream with an error.
	Envd string
}

// Operation names for Inject and Count: the subset document's operationIds, and Envd
// for every call to a sandbox's envd.
const (
	OpCreate  = "createSandbox"
	OpList    = "listSandboxes"
	OpGet     = "getSandbox"
	OpKill    = "killSandbox"
	OpConnect = "connectSandbox"
	OpTimeout = "setSandboxTimeout"
	OpPause   = "pauseSandbox"
	OpEnvd    = "envd"
)

// Domain is the sandbox domain the fake serves; APIKey the key it accepts.
const (
	Domain = "e2b.test"
	APIKey = "e2b_test_key_0123456789"
	// BaseURL is the control plane's address as the client should be configured.
	BaseURL = "https://api." + Domain
	// envdPort is where E2B's envd listens in a sandbox (part of its host name).
	envdPort = "49983"
)

// Docs are the OpenAPI documents exchanges are validated against.
type Docs struct {
	Subset          []byte // required: the subset the client is written against
	Published       []byte // optional: E2B's published document
	PublishedSource string // where Published came from, for the log
}

// Server is a running fake.
type Server struct {
	t       testing.TB
	hostile atomic.Bool

	subset    *specValidator
	published *specValidator
	envdDoc   *openapi3.T

	mu       sync.Mutex
	boxes    map[string]*Box
	seq      int
	faults   map[string][]Fault
	calls    map[string]int
	pageSize int
	notes    map[string]bool
	timeouts []int
	groups   []int                    // process groups the fake envd started (killed at cleanup)
	sent     map[string]int           // requests the client sent, by "METHOD path" (counted client-side)
	now      func() time.Time         // the clock of lifetimes and billing (SetClock)
	gone     map[string]time.Duration // running time of sandboxes no longer there
	held     chan string              // a held pause reached the fake: the sandbox id

	srv *httptest.Server
}

// New starts a fake validated against docs; it stops when t ends. Any contract
// violation is reported with t.Errorf.
func New(t testing.TB, docs Docs) *Server {
	t.Helper()
	f := &Server{
		t: t, boxes: map[string]*Box{}, faults: map[string][]Fault{}, calls: map[string]int{},
		pageSize: 100, notes: map[string]bool{}, sent: map[string]int{},
		now: time.Now, gone: map[string]time.Duration{}, held: make(chan string, 16),
	}
	f.subset = newValidator(t, "subset", docs.Subset, true)
	if docs.Published != nil {
		f.published = newValidator(t, "published", docs.Published, false)
	}
	f.envdDoc = f.subset.doc
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes the client abandoned
	f.srv.StartTLS()
	t.Cleanup(func() {
		f.srv.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.published != nil {
			var undeclared []string
			for n := range f.notes {
				undeclared = append(undeclared, n)
			}
			sort.Strings(undeclared)
			t.Logf("validated against the subset and the published document %s (version %s); answers only the subset declares: %v",
				docs.PublishedSource, f.published.doc.Info.Version, undeclared)
		} else {
			t.Logf("validated against the subset only (the published document is not available)")
		}
		for _, g := range f.groups {
			_ = syscall.Kill(-g, syscall.SIGKILL)
		}
	})
	return f
}

// SetHostile makes error messages echo what the client sent (its key, tokens, env
// values), as a careless or hostile server might.
func (f *Server) SetHostile(on bool) { f.hostile.Store(on) }

// Client returns an HTTP client that reaches the fake for every host (the control
// plane and every <port>-<id>.<domain>), trusting its certificate.
func (f *Server) Client() *http.Client {
	tr := f.srv.Client().Transport.(*http.Transport).Clone()
	addr := f.srv.Listener.Addr().String()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	tr.TLSClientConfig = tr.TLSClientConfig.Clone()
	tr.TLSClientConfig.ServerName = "example.com" // the name httptest's certificate carries
	tr.TLSClientConfig.MinVersion = tls.VersionTLS12
	return &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		f.mu.Lock()
		f.sent[r.Method+" "+r.URL.Path]++
		f.mu.Unlock()
		return tr.RoundTrip(r)
	})}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return rt(r) }

// SentCount is how many requests the client sent to "METHOD path" (counted on the
// client side, so an attempt abandoned before reaching the server counts too).
func (f *Server) SentCount(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent[key]
}

// TimeoutAt is the i-th time to live (seconds) the server was asked for (create,
// connect and set-timeout, in order).
func (f *Server) TimeoutAt(i int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.timeouts[i]
}

// SetPageSize sets how many sandboxes one listing page holds.
func (f *Server) SetPageSize(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pageSize = n
}

// Inject queues faults for the next calls of op.
func (f *Server) Inject(op string, fs ...Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[op] = append(f.faults[op], fs...)
}

// Count is how many calls of op reached the server.
func (f *Server) Count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Box returns a copy of sandbox id; false when it does not exist.
func (f *Server) Box(id string) (Box, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire()
	b, ok := f.boxes[id]
	if !ok {
		return Box{}, false
	}
	return *b, true
}

// NumBoxes is how many sandboxes exist.
func (f *Server) NumBoxes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire()
	return len(f.boxes)
}

// SetState sets a sandbox's state ("running" or "paused").
func (f *Server) SetState(id, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enter(f.boxes[id], state, f.now())
}

// enter moves b to state at time at on the billing clock (locked by the caller). E2B
// bills a sandbox's CPU and memory while it runs; a paused one keeps only its snapshot.
func (f *Server) enter(b *Box, state string, at time.Time) {
	if !b.runSince.IsZero() {
		b.ran += at.Sub(b.runSince)
		b.runSince = time.Time{}
	}
	b.State = state
	if state == "running" {
		b.runSince = at
	}
}

// remove deletes sandbox b, keeping its running time for the bill (locked by the caller).
func (f *Server) remove(b *Box, at time.Time) {
	f.enter(b, "killed", at)
	f.gone[b.ID] += b.ran
	delete(f.boxes, b.ID)
}

// expire ends the time to live of every running sandbox whose end has passed, as E2B
// does: paused when it was created with autoPause, killed otherwise (locked by the caller).
func (f *Server) expire() {
	now := f.now()
	for _, b := range f.boxes {
		if b.State != "running" || b.End.IsZero() || b.End.After(now) || b.pausing != nil {
			continue
		}
		if b.AutoPause {
			f.enter(b, "paused", b.End)
		} else {
			f.remove(b, b.End)
		}
	}
}

// SetClock replaces the clock of lifetimes and billing (time.Now by default), so a test
// can let an hour pass in a moment; set it before the first sandbox is created.
func (f *Server) SetClock(now func() time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// RunningTime is how long sandbox id has been running (billed for compute) by the
// fake's clock, up to now, its time to live's end, or its kill.
func (f *Server) RunningTime(id string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire()
	return f.runningTime(id)
}

// TotalRunningTime is RunningTime summed over every sandbox ever created.
func (f *Server) TotalRunningTime() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire()
	var d time.Duration
	for id := range f.gone {
		d += f.runningTime(id)
	}
	for id := range f.boxes {
		d += f.runningTime(id)
	}
	return d
}

func (f *Server) runningTime(id string) time.Duration {
	d := f.gone[id]
	if b := f.boxes[id]; b != nil {
		d += b.ran
		if !b.runSince.IsZero() {
			d += f.now().Sub(b.runSince)
		}
	}
	return d
}

// HoldPause holds the next pauses of sandbox id mid-way until release is called: the
// sandbox keeps running, a second pause answers 409, and a connect waits for the pause
// to complete and then resumes it (as E2B serializes them). Each pause that reaches the
// hold is announced on the returned channel.
func (f *Server) HoldPause(id string) (reached <-chan string, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.boxes[id]
	rel := make(chan struct{})
	b.held, b.release = true, rel
	var once sync.Once
	return f.held, func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if b := f.boxes[id]; b != nil {
				b.held = false
			}
			close(rel)
		})
	}
}

// settled waits, unlocked, until no pause of sandbox id is in progress; the box is nil
// when it is gone by then or the request ended (locked by the caller, on return too).
func (f *Server) settled(r *http.Request, id string) *Box {
	for {
		b := f.boxes[id]
		if b == nil || b.pausing == nil {
			return b
		}
		ch := b.pausing
		f.mu.Unlock()
		select {
		case <-ch:
		case <-r.Context().Done():
		}
		f.mu.Lock()
		if r.Context().Err() != nil {
			return nil
		}
	}
}

// SetEnd sets when a sandbox's time to live runs out.
func (f *Server) SetEnd(id string, end time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[id].End = end
}

func (f *Server) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.Host, envdPort+"-") {
		f.serveEnvd(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	op := "unknown"
	if route, _, err := f.subset.router.FindRoute(r); err == nil {
		op = route.Operation.OperationID
	}
	rec := httptest.NewRecorder()
	if !f.rest(rec, r, op, body) {
		// The client gave up on this attempt: abort the exchange rather than let the
		// server send an empty 200 on a stream that might still be read.
		panic(http.ErrAbortHandler)
	}
	res := rec.Result()
	respBody := rec.Body.Bytes()
	for _, v := range []*specValidator{f.subset, f.published} {
		if v == nil {
			continue
		}
		for _, p := range v.check(r, body, res.StatusCode, res.Header, respBody) {
			if n, ok := strings.CutPrefix(p, "note:"); ok {
				f.mu.Lock()
				f.notes[n] = true
				f.mu.Unlock()
				continue
			}
			f.t.Errorf("contract: %s", p)
		}
	}
	for k, vs := range res.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(respBody)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

func problem(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// rest answers one control-plane call; false when it hung until the client gave up.
func (f *Server) rest(w http.ResponseWriter, r *http.Request, op string, body []byte) bool {
	f.mu.Lock()
	f.calls[op]++
	var ft *Fault
	if q := f.faults[op]; len(q) > 0 {
		ft = &q[0]
		f.faults[op] = q[1:]
	}
	f.mu.Unlock()
	if got := r.Header.Get("X-API-Key"); got != APIKey {
		msg := "invalid API key"
		if f.hostile.Load() {
			msg += ": " + got
		}
		problem(w, http.StatusUnauthorized, msg)
		return true
	}
	if ft != nil && ft.Hang {
		if ft.Apply {
			f.do(httptest.NewRecorder(), r, op, body)
		}
		<-r.Context().Done()
		return false
	}
	if ft != nil {
		if ft.Apply {
			f.do(httptest.NewRecorder(), r, op, body)
		}
		if ft.RetryAfter != "" {
			w.Header().Set("Retry-After", ft.RetryAfter)
		}
		msg := "injected failure"
		if f.hostile.Load() {
			msg += " for key " + r.Header.Get("X-API-Key")
		}
		problem(w, ft.Status, msg)
		return true
	}
	f.do(w, r, op, body)
	return true
}

func (f *Server) summary(b *Box, withToken bool) map[string]any {
	m := map[string]any{
		"templateID": b.Template, "sandboxID": b.ID, "clientID": "client1",
		"startedAt": b.Started.UTC().Format(time.RFC3339Nano), "endAt": b.End.UTC().Format(time.RFC3339Nano),
		"state": b.State, "envdVersion": "0.5.4", "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024,
		"metadata": b.Meta,
	}
	if withToken {
		m["envdAccessToken"] = b.Token
		m["domain"] = Domain
	}
	return m
}

func (f *Server) started(b *Box) map[string]any {
	return map[string]any{
		"templateID": b.Template, "sandboxID": b.ID, "clientID": "client1", "envdVersion": "0.5.4",
		"envdAccessToken": b.Token, "domain": Domain,
	}
}

// do performs an operation as E2B would.
func (f *Server) do(w http.ResponseWriter, r *http.Request, op string, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire()
	now := f.now()
	id := r.PathValue("id")
	if id == "" {
		// The recorder path: extract /sandboxes/{id}[/...] by hand.
		if rest, ok := strings.CutPrefix(r.URL.Path, "/sandboxes/"); ok {
			id, _, _ = strings.Cut(rest, "/")
		}
	}
	switch op {
	case "createSandbox":
		var in struct {
			TemplateID string            `json:"templateID"`
			Timeout    int               `json:"timeout"`
			AutoPause  bool              `json:"autoPause"`
			Secure     bool              `json:"secure"`
			Metadata   map[string]string `json:"metadata"`
		}
		if err := json.Unmarshal(body, &in); err != nil {
			problem(w, 400, "bad body")
			return
		}
		f.seq++
		b := &Box{
			ID: fmt.Sprintf("sbx%04d", f.seq), Template: in.TemplateID, Token: fmt.Sprintf("envd-token-%04d-secret", f.seq),
			Meta: in.Metadata, Started: now, End: now.Add(time.Duration(in.Timeout) * time.Second),
			AutoPause: in.AutoPause, Secure: in.Secure, Dir: f.t.TempDir(),
		}
		f.enter(b, "running", now)
		f.boxes[b.ID] = b
		f.timeouts = append(f.timeouts, in.Timeout)
		writeJSON(w, 201, f.started(b))
	case "listSandboxes":
		q := r.URL.Query()
		want, err := url.ParseQuery(q.Get("metadata"))
		if err != nil {
			problem(w, 400, "bad metadata")
			return
		}
		states := map[string]bool{}
		for _, s := range strings.Split(q.Get("state"), ",") {
			states[s] = s != ""
		}
		var all []*Box
		for _, b := range f.boxes {
			ok := len(states) == 0 || states[b.State]
			for k := range want {
				ok = ok && b.Meta[k] == want.Get(k)
			}
			if ok {
				all = append(all, b)
			}
		}
		sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
		start, _ := strconv.Atoi(q.Get("nextToken"))
		end := min(start+f.pageSize, len(all))
		out := []map[string]any{}
		for _, b := range all[start:end] {
			out = append(out, f.summary(b, false))
		}
		if end < len(all) {
			w.Header().Set("X-Next-Token", strconv.Itoa(end))
		}
		writeJSON(w, 200, out)
	case "getSandbox":
		b, ok := f.boxes[id]
		if !ok {
			problem(w, 404, "sandbox not found")
			return
		}
		writeJSON(w, 200, f.summary(b, true))
	case "killSandbox":
		b, ok := f.boxes[id]
		if !ok {
			problem(w, 404, "sandbox not found")
			return
		}
		f.remove(b, now)
		w.WriteHeader(204)
	case "pauseSandbox":
		b, ok := f.boxes[id]
		switch {
		case !ok:
			problem(w, 404, "sandbox not found")
			return
		case b.State == "paused":
			problem(w, 409, "sandbox "+id+" is already paused")
			return
		case b.pausing != nil:
			problem(w, 409, "sandbox "+id+" is being paused")
			return
		}
		if b.held {
			done := make(chan struct{})
			b.pausing = done
			f.held <- id
			rel := b.release
			f.mu.Unlock()
			select {
			case <-rel:
			case <-r.Context().Done():
			}
			f.mu.Lock()
			b.pausing = nil
			close(done)
			if f.boxes[id] != b {
				problem(w, 404, "sandbox not found")
				return
			}
			now = f.now()
		}
		f.enter(b, "paused", now)
		w.WriteHeader(204)
	case "connectSandbox", "setSandboxTimeout":
		b := f.settled(r, id)
		if b == nil {
			problem(w, 404, "sandbox not found")
			return
		}
		now = f.now()
		var in struct {
			Timeout int `json:"timeout"`
		}
		_ = json.Unmarshal(body, &in)
		f.timeouts = append(f.timeouts, in.Timeout)
		end := now.Add(time.Duration(in.Timeout) * time.Second)
		if op == "setSandboxTimeout" {
			b.End = end
			w.WriteHeader(204)
			return
		}
		if end.After(b.End) {
			b.End = end // connect only ever lengthens
		}
		if b.State == "paused" {
			f.enter(b, "running", now)
			writeJSON(w, 201, f.started(b))
			return
		}
		writeJSON(w, 200, f.started(b))
	default:
		problem(w, 404, "no such route")
	}
}

// ---- envd ----

// Connect framing, written independently of the client's: a flag byte (0x02 marks the
// end-of-stream message), a big-endian uint32 length, the JSON message.
const endStream = 0x02

func frame(flags byte, msg []byte) []byte {
	out := make([]byte, 5, 5+len(msg))
	out[0] = flags
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}

func unframe(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("message of %d bytes", n)
	}
	msg := make([]byte, n)
	_, err := io.ReadFull(r, msg)
	return h[0], msg, err
}

// startReq is envd's StartRequest as the fake reads it.
type startReq struct {
	Process struct {
		Cmd  string            `json:"cmd"`
		Args []string          `json:"args"`
		Envs map[string]string `json:"envs"`
		Cwd  *string           `json:"cwd"`
	} `json:"process"`
	Stdin *bool `json:"stdin"`
}

func connectErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

func (f *Server) schema(name string) *openapi3.Schema {
	return f.envdDoc.Components.Schemas[name].Value
}

// checkMsg validates one envd message (its JSON form) against a subset schema.
func (f *Server) checkMsg(schema string, msg []byte) {
	var v any
	if err := json.Unmarshal(msg, &v); err != nil {
		f.t.Errorf("envd contract: %s: not JSON: %v", schema, err)
		return
	}
	if err := f.schema(schema).VisitJSON(v); err != nil {
		f.t.Errorf("envd contract: %s %s: %v", schema, msg, err)
	}
}

func (f *Server) serveEnvd(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.expire()
	f.calls["envd"]++
	var ft *Fault
	if q := f.faults["envd"]; len(q) > 0 {
		ft = &q[0]
		f.faults["envd"] = q[1:]
	}
	host, _, _ := strings.Cut(r.Host, ":")
	id, ok := strings.CutSuffix(strings.TrimPrefix(host, envdPort+"-"), "."+Domain)
	b, exists := f.boxes[id]
	var box Box
	if exists {
		box = *b
	}
	f.mu.Unlock()
	if !ok || !exists || box.State != "running" {
		// What E2B's proxy answers for a sandbox it cannot reach.
		http.Error(w, "The sandbox was not found", http.StatusBadGateway)
		return
	}
	if ft != nil && ft.Envd == "" {
		connectErr(w, ft.Status, "unavailable", "injected")
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/process.Process/Start" {
		connectErr(w, 404, "unimplemented", r.URL.Path)
		return
	}
	if got := r.Header.Get("X-Access-Token"); got != box.Token {
		msg := "bad access token"
		if f.hostile.Load() {
			msg += " " + got
		}
		connectErr(w, 401, "unauthenticated", msg)
		return
	}
	if got, want := r.Header.Get("Authorization"), "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")); got != want {
		f.t.Errorf("envd: Authorization = %q, want %q", got, want)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/connect+json" {
		f.t.Errorf("envd: Content-Type = %q", ct)
	}
	br := bufio.NewReader(r.Body)
	flags, msg, err := unframe(br)
	if err != nil || flags != 0 {
		connectErr(w, 400, "invalid_argument", "bad envelope")
		return
	}
	if _, err := br.ReadByte(); err != io.EOF {
		f.t.Errorf("envd: more than one request envelope")
	}
	f.checkMsg("EnvdStartRequest", msg)
	var req startReq
	if err := json.Unmarshal(msg, &req); err != nil {
		connectErr(w, 400, "invalid_argument", "bad message")
		return
	}
	if ft != nil {
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(200)
		switch ft.Envd {
		case "truncate":
			_, _ = w.Write(frame(0, []byte(`{"event":{"start":{"pid":4242}}}`)))
			_, _ = w.Write(frame(0, []byte(`{"event":{"data":{"stdout":"cGFydA=="}}}`)))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "end-error":
			_, _ = w.Write(frame(endStream, []byte(`{"error":{"code":"internal","message":"injected"}}`)))
		}
		return
	}
	if f.hostile.Load() {
		var vals []string
		for _, v := range req.Process.Envs {
			vals = append(vals, v)
		}
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(200)
		end, _ := json.Marshal(map[string]any{"error": map[string]string{"code": "internal", "message": "cannot start with " + strings.Join(vals, ",")}})
		_, _ = w.Write(frame(endStream, end))
		return
	}
	f.runProcess(w, r, box, req)
}

func (f *Server) runProcess(w http.ResponseWriter, r *http.Request, box Box, req startReq) {
	cmd := exec.Command(req.Process.Cmd, req.Process.Args...)
	cmd.Dir = box.Dir
	// The sandbox user's home is the box: its own (empty) profile, as in a fresh template.
	cmd.Env = append(os.Environ(), "HOME="+box.Dir)
	for k, v := range req.Process.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(200)
	var wmu sync.Mutex
	send := func(flags byte, v any) {
		msg, _ := json.Marshal(v)
		if flags == 0 {
			f.checkMsg("EnvdStartResponse", msg)
		} else {
			f.checkMsg("EnvdEndOfStream", msg)
		}
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = w.Write(frame(flags, msg))
		w.(http.Flusher).Flush()
	}
	if err := cmd.Start(); err != nil {
		send(0, map[string]any{"event": map[string]any{"end": map[string]any{"exitCode": -1, "status": "error", "error": err.Error()}}})
		send(endStream, map[string]any{})
		return
	}
	f.mu.Lock()
	f.groups = append(f.groups, cmd.Process.Pid)
	f.mu.Unlock()
	send(0, map[string]any{"event": map[string]any{"start": map[string]any{"pid": cmd.Process.Pid}}})
	var wg sync.WaitGroup
	pump := func(rd io.Reader, field string) {
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			n, err := rd.Read(buf)
			if n > 0 {
				send(0, map[string]any{"event": map[string]any{"data": map[string]any{field: buf[:n]}}})
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(stdout, "stdout")
	go pump(stderr, "stderr")
	done := make(chan struct{})
	go func() {
		select {
		case <-r.Context().Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	wg.Wait()
	err := cmd.Wait()
	close(done)
	end := map[string]any{}
	st := cmd.ProcessState
	if st.Exited() {
		end["exited"] = true
		if st.ExitCode() != 0 {
			end["exitCode"] = st.ExitCode()
		}
	} else {
		end["exitCode"] = -1
	}
	end["status"] = st.String()
	if err != nil && st == nil {
		end["error"] = err.Error()
	}
	send(0, map[string]any{"event": map[string]any{"end": end}})
	send(endStream, map[string]any{})
}

// Total is how many calls reached the server, every operation and envd together.
func (f *Server) Total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}
