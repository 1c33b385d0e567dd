package dynamotest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// FaultKind is what the Proxy does to a request a Fault selects.
type FaultKind int

// The fault kinds.
const (
	// ApplyThenDrop forwards the request, lets the engine apply it, then drops the client's
	// connection without a response (or answers 500 when Fault.As500 is set): the SDK sees
	// a connection error and retries a write that already landed — an ambiguous write.
	ApplyThenDrop FaultKind = iota + 1
	// Throttle answers a DynamoDB throttling error (HTTP 400, ThrottlingException or
	// ProvisionedThroughputExceededException) without forwarding.
	Throttle
	// ServerError answers HTTP 500 InternalServerError without forwarding.
	ServerError
	// Delay waits Fault.Delay (or until the client gives up), then forwards.
	Delay
)

// String names the kind as test logs show it.
func (k FaultKind) String() string {
	switch k {
	case ApplyThenDrop:
		return "apply-then-drop"
	case Throttle:
		return "throttle"
	case ServerError:
		return "server-error"
	case Delay:
		return "delay"
	}
	return fmt.Sprintf("fault(%d)", int(k))
}

// Fault selects requests and says what to do to them. A request is matched by operation,
// then Match, then a roll against Probability; Times bounds how often it fires.
type Fault struct {
	Kind FaultKind
	// Op is the DynamoDB operation (the X-Amz-Target suffix, e.g. "PutItem"); "" = all.
	Op string
	// Match, when set, must also accept the request's JSON body.
	Match func(op string, body []byte) bool
	// Probability of firing on a matching request; 0 means always.
	Probability float64
	// Times is the most this fault fires; 0 = unlimited.
	Times int
	// Delay is the wait of a Delay fault.
	Delay time.Duration
	// ProvisionedThroughput makes a Throttle answer ProvisionedThroughputExceededException
	// instead of ThrottlingException.
	ProvisionedThroughput bool
	// As500 makes ApplyThenDrop answer 500 after applying instead of dropping the connection.
	As500 bool
}

// Rule is an installed Fault; Hits tells how often it fired.
type Rule struct {
	f    Fault
	hits atomic.Int64
}

// Hits returns how many requests this rule has acted on.
func (r *Rule) Hits() int64 { return r.hits.Load() }

// Proxy is a loopback HTTP reverse proxy in front of a DynamoDB endpoint that injects
// programmable faults, for tests of retries and ambiguous writes. Point an SDK client at
// URL(); the client's retryer must be allowed enough attempts (and no retry quota) for the
// faults injected. Safe for concurrent use.
type Proxy struct {
	target string
	srv    *httptest.Server
	client *http.Client

	mu    sync.Mutex
	rng   *rand.Rand
	rules []*Rule

	injected  [Delay + 1]atomic.Int64
	forwarded atomic.Int64
}

// NewProxy starts a proxy forwarding to target (e.g. "http://127.0.0.1:4567"); it panics
// when it cannot listen, like httptest.NewServer. Faults roll a rand seeded with 1 until
// Seed is called.
func NewProxy(target string) *Proxy {
	p := &Proxy{
		target: strings.TrimRight(target, "/"),
		rng:    rand.New(rand.NewPCG(1, 1)),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
	}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	return p
}

// URL is the proxy's endpoint.
func (p *Proxy) URL() string { return p.srv.URL }

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.srv.CloseClientConnections()
	p.srv.Close()
	p.client.CloseIdleConnections()
}

// Seed reseeds the probability rolls, so a run's fault pattern can be reproduced.
func (p *Proxy) Seed(seed uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rng = rand.New(rand.NewPCG(seed, seed))
}

// Inject installs f after the installed rules (the first rule that fires on a request
// wins) and returns it.
func (p *Proxy) Inject(f Fault) *Rule {
	r := &Rule{f: f}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, r)
	return r
}

// Clear removes every rule; counters are kept.
func (p *Proxy) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = nil
}

// Injected returns how many faults of kind k the proxy injected.
func (p *Proxy) Injected(k FaultKind) int64 {
	if k < ApplyThenDrop || k > Delay {
		return 0
	}
	return p.injected[k].Load()
}

// Forwarded returns how many requests reached the engine.
func (p *Proxy) Forwarded() int64 { return p.forwarded.Load() }

// pick returns the rule acting on this request, or nil.
func (p *Proxy) pick(op string, body []byte) *Rule {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.rules {
		f := &r.f
		if f.Op != "" && f.Op != op || f.Times > 0 && r.hits.Load() >= int64(f.Times) {
			continue
		}
		if f.Match != nil && !f.Match(op, body) {
			continue
		}
		if f.Probability > 0 && p.rng.Float64() >= f.Probability {
			continue
		}
		r.hits.Add(1)
		p.injected[f.Kind].Add(1)
		return r
	}
	return nil
}

func (p *Proxy) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	op := req.Header.Get("X-Amz-Target")
	if i := strings.LastIndexByte(op, '.'); i >= 0 {
		op = op[i+1:]
	}
	r := p.pick(op, body)
	if r == nil {
		p.forward(w, req, body)
		return
	}
	switch r.f.Kind {
	case Throttle:
		code := "ThrottlingException"
		if r.f.ProvisionedThroughput {
			code = "ProvisionedThroughputExceededException"
		}
		writeError(w, http.StatusBadRequest, code, "injected by dynamotest.Proxy: rate exceeded")
	case ServerError:
		writeError(w, http.StatusInternalServerError, "InternalServerError", "injected by dynamotest.Proxy")
	case Delay:
		t := time.NewTimer(r.f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
			p.forward(w, req, body)
		case <-req.Context().Done():
		}
	case ApplyThenDrop:
		// Apply first, with a context the client cannot cancel, so the write lands.
		resp, err := p.roundTrip(context.WithoutCancel(req.Context()), req, body)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		if r.f.As500 {
			writeError(w, http.StatusInternalServerError, "InternalServerError", "injected by dynamotest.Proxy after applying")
			return
		}
		drop(w)
	default:
		p.forward(w, req, body)
	}
}

// drop closes the client's connection without a response.
func drop(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("dynamotest.Proxy: response writer cannot be hijacked")
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"__type":"com.amazonaws.dynamodb.v20120810#%s","message":%q}`, code, msg)
}

func (p *Proxy) roundTrip(ctx context.Context, req *http.Request, body []byte) (*http.Response, error) {
	out, err := http.NewRequestWithContext(ctx, req.Method, p.target+req.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = req.Header.Clone()
	out.Host = req.Host
	p.forwarded.Add(1)
	return p.client.Do(out)
}

func (p *Proxy) forward(w http.ResponseWriter, req *http.Request, body []byte) {
	resp, err := p.roundTrip(req.Context(), req, body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// FastRetries is a client option for tests through a Proxy: up to attempts tries per call,
// no retry quota (injected faults would drain it) and a short linear backoff (2 ms per
// attempt, at most 20 ms) for every retryable error, throttles included.
func FastRetries(attempts int) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		o.RetryMaxAttempts = attempts // over dynamostore.Retries, which would cap this retryer
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = attempts
			so.RateLimiter = ratelimit.None
			so.Backoff = retry.BackoffDelayerFunc(func(attempt int, _ error) (time.Duration, error) {
				return time.Duration(min(attempt, 10)) * 2 * time.Millisecond, nil
			})
		})
	}
}
