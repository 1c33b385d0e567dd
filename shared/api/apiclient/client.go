// Package apiclient is a Go client of sandkeep's HTTP API (api/openapi.yaml): one method
// per route, typed with the documents the handlers use (shared/api/wire), problem+json answers
// turned into errors that match the sandbox sentinels (errors.Is(err,
// contract.ErrSuperseded)), retries only of calls that are safe to repeat, and three ways to
// authenticate: the dev server's tenant header, a JWT bearer token, and IAM (SigV4) through
// the opt-in shared/api/apiclient/sigv4auth, so a client that does not sign links no AWS package.
package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// TenantHeader names the tenant for the dev server and behind IAM (shared/api/httpapi reads it).
const TenantHeader = "X-Sandkeep-Tenant"

// Defaults of Config.
const (
	DefaultMaxAttempts = 5
	DefaultRetryBase   = 100 * time.Millisecond
	DefaultRetryMax    = 2 * time.Second
	// maxRetryAfter caps a server's Retry-After.
	maxRetryAfter = 30 * time.Second
	// maxResponseBytes bounds an answer (a page of 1000 events of up to 350 KB is far
	// below; anything larger is not ours).
	maxResponseBytes = 64 << 20
)

// Config configures a Client.
type Config struct {
	// BaseURL is the API's root, e.g. http://127.0.0.1:8080 or an API Gateway stage URL.
	BaseURL string
	// Tenant is sent in X-Sandkeep-Tenant when set (the dev server and IAM mode read it;
	// JWT mode takes the tenant from the token and ignores it).
	Tenant string
	// Auth signs each attempt; nil sends no credentials (the dev server).
	Auth Authorizer
	// HTTPClient defaults to a client without a timeout: every call is bounded by its
	// context, and a long poll waits up to 20 s by design.
	HTTPClient *http.Client
	// MaxAttempts bounds the attempts of a call that is safe to repeat (default 5).
	MaxAttempts int
	// RetryBase and RetryMax shape the jittered exponential backoff (defaults 100 ms, 2 s);
	// a larger Retry-After wins.
	RetryBase, RetryMax time.Duration
	// PushURL is the push endpoint a Subscription connects to (ws:// or wss://; the upgrade
	// is authorized by Auth). Empty: the API's own GET /v1/subscribe when Auth is nil (the
	// dev server); with a Bearer (JWT) the URL POST /v1/push/ticket names; else long polls
	// only. A Bearer client's upgrade carries a push ticket, not the JWT.
	PushURL string
}

// Authorizer adds credentials to one attempt of a request.
type Authorizer interface {
	// Authorize sets the request's credentials; body is exactly what the request sends.
	Authorize(ctx context.Context, r *http.Request, body []byte) error
}

// Client calls one sandkeep API. It is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
}

// New validates cfg and returns a Client.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("apiclient: base URL %q: want an absolute http(s) URL", cfg.BaseURL)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("apiclient: base URL %q: no credentials, query or fragment", cfg.BaseURL)
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = DefaultRetryBase
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = DefaultRetryMax
	}
	return &Client{cfg: cfg, base: u}, nil
}

// BaseURL is the API root the client calls.
func (c *Client) BaseURL() string { return c.base.String() }

// retry says whether a failed call may be sent again.
type retry int

const (
	// once: never repeated (start, attach, append, snapshot: a repeat could act twice).
	once retry = iota
	// safe: repeating has the effect of one call (reads, heartbeat, cancel, detach, finish,
	// pump, agent); repeated on 429, 502, 503, 504 and on network failures.
	safe
)

// request is one logical call.
type request struct {
	method string
	path   string // below the base URL, already escaped
	query  url.Values
	body   any // nil: no body
	retry  retry
}

// do sends rq, retrying a safe call within ctx's deadline, and decodes a 2xx answer into
// out. A non-2xx answer is an *Error; a failure without an answer is wrapped with %w.
func (c *Client) do(ctx context.Context, rq request, out any) error {
	var body []byte
	if rq.body != nil {
		var err error
		if body, err = json.Marshal(rq.body); err != nil {
			return fmt.Errorf("apiclient: %s %s: encode: %w", rq.method, rq.path, err)
		}
	}
	for attempt := 1; ; attempt++ {
		retryAfter, err := c.attempt(ctx, rq, body, out)
		if err == nil || rq.retry != safe || attempt >= c.cfg.MaxAttempts || !retryable(ctx, err) {
			return err
		}
		d := c.backoff(attempt, retryAfter)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
			return err // no room for another attempt within the deadline: the last failure
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// attempt sends one HTTP request; it returns the answer's Retry-After with its failure.
func (c *Client) attempt(ctx context.Context, rq request, body []byte, out any) (time.Duration, error) {
	target := c.base.String() + rq.path
	if len(rq.query) > 0 {
		target += "?" + rq.query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, rq.method, target, rd)
	if err != nil {
		return 0, fmt.Errorf("apiclient: %s %s: %w", rq.method, rq.path, err)
	}
	hr.Header.Set("Accept", "application/json")
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if c.cfg.Tenant != "" {
		hr.Header.Set(TenantHeader, c.cfg.Tenant)
	}
	if c.cfg.Auth != nil {
		if err := c.cfg.Auth.Authorize(ctx, hr, body); err != nil {
			return 0, fmt.Errorf("apiclient: %s %s: authorize: %w", rq.method, rq.path, err)
		}
	}
	resp, err := c.cfg.HTTPClient.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return 0, &netError{op: rq.method + " " + rq.path, err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return 0, &netError{op: rq.method + " " + rq.path, err: err}
	}
	if len(data) > maxResponseBytes {
		return 0, fmt.Errorf("apiclient: %s %s: answer larger than %d bytes", rq.method, rq.path, maxResponseBytes)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := problemError(resp, data)
		return e.RetryAfter, e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return 0, fmt.Errorf("apiclient: %s %s: undecodable answer: %w", rq.method, rq.path, err)
		}
	}
	return 0, nil
}

// netError is a call that got no answer (refused, reset, timed out).
type netError struct {
	op  string
	err error
}

func (e *netError) Error() string { return "apiclient: " + e.op + ": " + e.err.Error() }
func (e *netError) Unwrap() error { return e.err }

// retryable reports whether a failed attempt of a safe call is worth repeating.
func retryable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && Transient(err)
}

// Transient reports whether a failed call may succeed when sent again: an answer of 429,
// 502, 503 or 504, or no answer at all (refused, reset, timed out). Any other answer (a
// refusal: unknown-run, unauthenticated, a 403, invalid, a conflict), an undecodable
// answer, an encoding or authorization failure and a cancelled call repeat identically.
func Transient(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		switch e.Status {
		case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
		return false
	}
	var ne *netError
	if !errors.As(err, &ne) {
		return false // an encoding or authorization failure repeats identically
	}
	return !errors.Is(err, context.Canceled)
}

// backoff is the delay before attempt+1: exponential from RetryBase, capped at RetryMax,
// jittered over its upper half; a larger Retry-After wins (capped).
func (c *Client) backoff(attempt int, retryAfter time.Duration) time.Duration {
	d := c.cfg.RetryBase << min(attempt-1, 20)
	if d > c.cfg.RetryMax || d <= 0 {
		d = c.cfg.RetryMax
	}
	d = d/2 + rand.N(d/2+1)
	return max(d, min(retryAfter, maxRetryAfter))
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func parseRetryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
