package e2b

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
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

const testDomain = "e2b.test"

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

type fakeBox struct {
	id, template, token string
	meta                map[string]string
	state               string
	started, end        time.Time
	autoPause, secure   bool
	dir                 string
}

// fault is an injected answer for the next call of an operation.
type fault struct {
	status     int
	apply      bool // perform the operation, then answer status anyway (a lost success)
	hang       bool // never answer; the client's attempt timeout must end it
	retryAfter string
}

type fakeE2B struct {
	t       *testing.T
	apiKey  string
	hostile atomic.Bool // error messages echo what the client sent (keys, tokens, envs)

	subset    *specValidator
	published *specValidator
	envdDoc   *openapi3.T

	mu       sync.Mutex
	boxes    map[string]*fakeBox
	seq      int
	faults   map[string][]fault
	calls    map[string]int
	pageSize int
	notes    map[string]bool
	timeouts []int
	groups   []int // process groups the fake envd started (cleaned up)

	sent map[string]int // requests the client sent, by "METHOD path" (counted client-side)

	srv *httptest.Server
}

func newFake(t *testing.T) *fakeE2B {
	t.Helper()
	f := &fakeE2B{
		t: t, apiKey: "e2b_test_key_0123456789", boxes: map[string]*fakeBox{},
		faults: map[string][]fault{}, calls: map[string]int{}, pageSize: 100, notes: map[string]bool{},
		sent: map[string]int{},
	}
	sub, pub := specs(t)
	f.subset, f.published = sub, pub
	f.envdDoc = sub.doc
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
			t.Logf("validated against the subset and the published document (%s); answers only the subset declares: %v",
				f.published.doc.Info.Version, undeclared)
		} else {
			t.Logf("validated against the subset only (the published document is not available)")
		}
		for _, g := range f.groups {
			_ = syscall.Kill(-g, syscall.SIGKILL)
		}
	})
	return f
}

// client is an HTTP client that reaches the fake for every host (control plane and
// every <port>-<id>.<domain>), trusting its certificate.
func (f *fakeE2B) client() *http.Client {
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

// sentCount is how many requests the client sent to method+path.
func (f *fakeE2B) sentCount(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent[key]
}

func (f *fakeE2B) config() Config {
	return Config{
		APIKey: f.apiKey, BaseURL: "https://api." + testDomain, Domain: testDomain, Template: "tmpl-test",
		DetachedTTL: 15 * time.Minute, SweepPeriod: time.Minute, HTTPClient: f.client(),
		RequestTimeout: 5 * time.Second, Retry: Retry{Attempts: 4, Base: time.Millisecond, Max: 5 * time.Millisecond},
	}
}

func (f *fakeE2B) provider(mod ...func(*Config)) *Provider {
	f.t.Helper()
	cfg := f.config()
	for _, m := range mod {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// timeoutAt is the i-th timeout (seconds) the server was asked for.
func (f *fakeE2B) timeoutAt(i int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.timeouts[i]
}

func (f *fakeE2B) setPageSize(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pageSize = n
}

func (f *fakeE2B) inject(op string, fs ...fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults[op] = append(f.faults[op], fs...)
}

func (f *fakeE2B) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *fakeE2B) box(id string) (fakeBox, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[id]
	if !ok {
		return fakeBox{}, false
	}
	return *b, true
}

func (f *fakeE2B) numBoxes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.boxes)
}

func (f *fakeE2B) setState(id, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[id].state = state
}

func (f *fakeE2B) setEnd(id string, end time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[id].end = end
}

func (f *fakeE2B) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.Host, strconv.Itoa(EnvdPort)+"-") {
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
func (f *fakeE2B) rest(w http.ResponseWriter, r *http.Request, op string, body []byte) bool {
	f.mu.Lock()
	f.calls[op]++
	var ft *fault
	if q := f.faults[op]; len(q) > 0 {
		ft = &q[0]
		f.faults[op] = q[1:]
	}
	f.mu.Unlock()
	if got := r.Header.Get("X-API-Key"); got != f.apiKey {
		msg := "invalid API key"
		if f.hostile.Load() {
			msg += ": " + got
		}
		problem(w, http.StatusUnauthorized, msg)
		return true
	}
	if ft != nil && ft.hang {
		if ft.apply {
			f.do(httptest.NewRecorder(), r, op, body)
		}
		<-r.Context().Done()
		return false
	}
	if ft != nil {
		if ft.apply {
			f.do(httptest.NewRecorder(), r, op, body)
		}
		if ft.retryAfter != "" {
			w.Header().Set("Retry-After", ft.retryAfter)
		}
		msg := "injected failure"
		if f.hostile.Load() {
			msg += " for key " + r.Header.Get("X-API-Key")
		}
		problem(w, ft.status, msg)
		return true
	}
	f.do(w, r, op, body)
	return true
}

func (f *fakeE2B) summary(b *fakeBox, withToken bool) map[string]any {
	m := map[string]any{
		"templateID": b.template, "sandboxID": b.id, "clientID": "client1",
		"startedAt": b.started.UTC().Format(time.RFC3339Nano), "endAt": b.end.UTC().Format(time.RFC3339Nano),
		"state": b.state, "envdVersion": "0.5.4", "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024,
		"metadata": b.meta,
	}
	if withToken {
		m["envdAccessToken"] = b.token
		m["domain"] = testDomain
	}
	return m
}

func (f *fakeE2B) started(b *fakeBox) map[string]any {
	return map[string]any{
		"templateID": b.template, "sandboxID": b.id, "clientID": "client1", "envdVersion": "0.5.4",
		"envdAccessToken": b.token, "domain": testDomain,
	}
}

// do performs an operation as E2B would.
func (f *fakeE2B) do(w http.ResponseWriter, r *http.Request, op string, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
		b := &fakeBox{
			id: fmt.Sprintf("sbx%04d", f.seq), template: in.TemplateID, token: fmt.Sprintf("envd-token-%04d-secret", f.seq),
			meta: in.Metadata, state: "running", started: time.Now(), end: time.Now().Add(time.Duration(in.Timeout) * time.Second),
			autoPause: in.AutoPause, secure: in.Secure, dir: f.t.TempDir(),
		}
		f.boxes[b.id] = b
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
		var all []*fakeBox
		for _, b := range f.boxes {
			ok := len(states) == 0 || states[b.state]
			for k := range want {
				ok = ok && b.meta[k] == want.Get(k)
			}
			if ok {
				all = append(all, b)
			}
		}
		sort.Slice(all, func(i, j int) bool { return all[i].id < all[j].id })
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
		if _, ok := f.boxes[id]; !ok {
			problem(w, 404, "sandbox not found")
			return
		}
		delete(f.boxes, id)
		w.WriteHeader(204)
	case "connectSandbox", "setSandboxTimeout":
		b, ok := f.boxes[id]
		if !ok {
			problem(w, 404, "sandbox not found")
			return
		}
		var in struct {
			Timeout int `json:"timeout"`
		}
		_ = json.Unmarshal(body, &in)
		f.timeouts = append(f.timeouts, in.Timeout)
		end := time.Now().Add(time.Duration(in.Timeout) * time.Second)
		if op == "setSandboxTimeout" {
			b.end = end
			w.WriteHeader(204)
			return
		}
		if end.After(b.end) {
			b.end = end // connect only ever lengthens
		}
		if b.state == "paused" {
			b.state = "running"
			writeJSON(w, 201, f.started(b))
			return
		}
		writeJSON(w, 200, f.started(b))
	default:
		problem(w, 404, "no such route")
	}
}

// ---- envd ----

func connectErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

func (f *fakeE2B) schema(name string) *openapi3.Schema {
	return f.envdDoc.Components.Schemas[name].Value
}

// checkMsg validates one envd message (its JSON form) against a subset schema.
func (f *fakeE2B) checkMsg(schema string, msg []byte) {
	var v any
	if err := json.Unmarshal(msg, &v); err != nil {
		f.t.Errorf("envd contract: %s: not JSON: %v", schema, err)
		return
	}
	if err := f.schema(schema).VisitJSON(v); err != nil {
		f.t.Errorf("envd contract: %s %s: %v", schema, msg, err)
	}
}

func (f *fakeE2B) serveEnvd(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.calls["envd"]++
	var ft *fault
	if q := f.faults["envd"]; len(q) > 0 {
		ft = &q[0]
		f.faults["envd"] = q[1:]
	}
	host, _, _ := strings.Cut(r.Host, ":")
	id, ok := strings.CutSuffix(strings.TrimPrefix(host, strconv.Itoa(EnvdPort)+"-"), "."+testDomain)
	b, exists := f.boxes[id]
	var box fakeBox
	if exists {
		box = *b
	}
	f.mu.Unlock()
	if !ok || !exists || box.state != "running" {
		// What E2B's proxy answers for a sandbox it cannot reach.
		http.Error(w, "The sandbox was not found", http.StatusBadGateway)
		return
	}
	if ft != nil {
		connectErr(w, ft.status, "unavailable", "injected")
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/process.Process/Start" {
		connectErr(w, 404, "unimplemented", r.URL.Path)
		return
	}
	if got := r.Header.Get("X-Access-Token"); got != box.token {
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
	flags, msg, err := readEnvelope(br)
	if err != nil || flags != 0 {
		connectErr(w, 400, "invalid_argument", "bad envelope")
		return
	}
	if _, err := br.ReadByte(); err != io.EOF {
		f.t.Errorf("envd: more than one request envelope")
	}
	f.checkMsg("EnvdStartRequest", msg)
	var req startRequest
	if err := json.Unmarshal(msg, &req); err != nil {
		connectErr(w, 400, "invalid_argument", "bad message")
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
		_, _ = w.Write(envelope(flagEndStream, end))
		return
	}
	f.runProcess(w, r, box, req)
}

func (f *fakeE2B) runProcess(w http.ResponseWriter, r *http.Request, box fakeBox, req startRequest) {
	cmd := exec.Command(req.Process.Cmd, req.Process.Args...)
	cmd.Dir = box.dir
	// The sandbox user's home is the box: its own (empty) profile, as in a fresh template.
	cmd.Env = append(os.Environ(), "HOME="+box.dir)
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
		_, _ = w.Write(envelope(flags, msg))
		w.(http.Flusher).Flush()
	}
	if err := cmd.Start(); err != nil {
		send(0, map[string]any{"event": map[string]any{"end": map[string]any{"exitCode": -1, "status": "error", "error": err.Error()}}})
		send(flagEndStream, map[string]any{})
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
	send(flagEndStream, map[string]any{})
}
