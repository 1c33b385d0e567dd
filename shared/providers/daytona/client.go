package daytona

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// retryMode says which failures of a request may be repeated.
type retryMode int

const (
	// retryIdempotent: 408, 429, 5xx, timeouts and network failures (GET, DELETE, start…).
	retryIdempotent retryMode = iota
	// retryRejected: only failures proving the request was not acted on (429, a failed
	// dial); for commands, which must not run twice.
	retryRejected
)

// maxRetryAfter caps a server's Retry-After.
const maxRetryAfter = 30 * time.Second

// request is one logical call to Daytona.
type request struct {
	op      string // for errors and logs
	method  string
	url     string
	body    any
	retry   retryMode
	timeout time.Duration // per attempt (0 = RequestTimeout)
	limit   int64         // response body cap (0 = 8 MiB)
}

// do sends rq with retries (jittered exponential backoff, Retry-After honoured) within
// ctx's deadline and decodes a 2xx JSON body into out (when non-nil). Any failure is an
// *APIError; its text is redacted by red.
func (p *Provider) do(ctx context.Context, rq request, out any, red redactor) error {
	var body []byte
	if rq.body != nil {
		var err error
		if body, err = json.Marshal(rq.body); err != nil {
			return fmt.Errorf("daytona: %s: encode: %w", rq.op, err)
		}
	}
	timeout := rq.timeout
	if timeout == 0 {
		timeout = p.cfg.RequestTimeout
	}
	limit := rq.limit
	if limit == 0 {
		limit = 8 << 20
	}
	for attempt := 1; ; attempt++ {
		status, retryAfter, err := p.attempt(ctx, rq, body, timeout, limit, out, red)
		if err == nil {
			return nil
		}
		err.Attempts = attempt
		if attempt >= p.cfg.MaxAttempts || !p.retryable(ctx, rq.retry, status, err) {
			return err
		}
		d := p.backoff(attempt, retryAfter)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
			return err // no room for another attempt: report the last failure now
		}
		p.cfg.Logger.DebugContext(ctx, "daytona: retrying", "op", rq.op, "status", status, "attempt", attempt, "delay", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// attempt sends one HTTP request. It returns the status (0 = none), the server's
// Retry-After, and the failure as an *APIError (nil on 2xx).
func (p *Provider) attempt(ctx context.Context, rq request, body []byte, timeout time.Duration, limit int64, out any, red redactor) (int, time.Duration, *APIError) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(actx, rq.method, rq.url, rd)
	if err != nil {
		return 0, 0, &APIError{Op: rq.op, Message: red.apply(err.Error()), err: err}
	}
	hr.Header.Set("Authorization", "Bearer "+p.cfg.APIKey)
	hr.Header.Set("Accept", "application/json")
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if p.cfg.OrganizationID != "" {
		hr.Header.Set("X-Daytona-Organization-ID", p.cfg.OrganizationID)
	}
	resp, err := p.cfg.HTTPClient.Do(hr)
	if err != nil {
		return 0, 0, p.transportErr(ctx, rq.op, err, red)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return 0, 0, p.transportErr(ctx, rq.op, err, red)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, retryAfter(resp.Header), &APIError{Op: rq.op, Status: resp.StatusCode, Message: serverMessage(data, red)}
	}
	if int64(len(data)) > limit {
		return 0, 0, &APIError{Op: rq.op, Status: resp.StatusCode, Message: fmt.Sprintf("response over %d bytes", limit)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			// A garbled 2xx body is treated as a server fault: retryable only when idempotent.
			return 0, 0, &APIError{Op: rq.op, Message: "undecodable response: " + red.apply(err.Error()), err: err}
		}
	}
	return resp.StatusCode, 0, nil
}

// transportErr wraps a failure without an HTTP response; the caller's own cancellation
// is reported as such.
func (p *Provider) transportErr(ctx context.Context, op string, err error, red redactor) *APIError {
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return &APIError{Op: op, Message: red.apply(err.Error()), err: err}
}

// retryable decides whether a failed attempt is repeated under mode.
func (p *Provider) retryable(ctx context.Context, mode retryMode, status int, err *APIError) bool {
	if ctx.Err() != nil {
		return false
	}
	if status == http.StatusTooManyRequests {
		return true
	}
	if mode == retryIdempotent {
		return transientStatus(status)
	}
	return neverSent(err.err) // retryRejected
}

// neverSent reports whether a transport error proves the request never reached a server.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// backoff is the delay before attempt+1: exponential from RetryBase, capped at
// RetryMax, with jitter over its upper half; a larger Retry-After wins (capped).
func (p *Provider) backoff(attempt int, retryAfter time.Duration) time.Duration {
	d := p.cfg.RetryBase << min(attempt-1, 20)
	if d > p.cfg.RetryMax || d <= 0 {
		d = p.cfg.RetryMax
	}
	d = d/2 + rand.N(d/2+1)
	return max(d, min(retryAfter, maxRetryAfter))
}

// retryAfter parses a Retry-After header in seconds (dates are ignored).
func retryAfter(h http.Header) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || s < 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// serverMessage extracts a short message from an error body: the "message" member of
// Daytona's JSON errors (a string or a list), else the text itself; redacted, then cut to
// 300 bytes (cutting first could leave part of a secret).
func serverMessage(data []byte, red redactor) string {
	var m struct {
		Message json.RawMessage `json:"message"`
	}
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &m) == nil && len(m.Message) > 0 {
		var s string
		var list []string
		switch {
		case json.Unmarshal(m.Message, &s) == nil:
			msg = s
		case json.Unmarshal(m.Message, &list) == nil:
			msg = strings.Join(list, "; ")
		}
	}
	msg = red.apply(msg)
	if len(msg) > 300 {
		msg = strings.ToValidUTF8(msg[:300], "") + "…"
	}
	return msg
}

// redactor removes secrets (the API key, injected env values) from text kept in errors.
type redactor []string

// apply replaces every secret in s.
func (r redactor) apply(s string) string {
	for _, sec := range r {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "[redacted]")
		}
	}
	return s
}
