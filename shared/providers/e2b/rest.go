package e2b

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

// ErrConfig marks a refusal that retrying cannot fix: the API key is missing, wrong or
// lacks permission (HTTP 401/403). The wrapping message names the provider.
var ErrConfig = errors.New("e2b: configuration error (check the API key and its team)")

// ErrStopped: the sandbox is paused, so commands cannot run in it until Resume.
var ErrStopped = errors.New("e2b: sandbox paused")

// APIError is a non-success answer of the E2B API. Message is the server's text with
// every secret the client holds removed.
type APIError struct {
	Op      string // what we were doing, e.g. "get sandbox sbx1"
	Status  int
	Code    string // E2B's machine-readable error_code, when given
	Message string
}

// Error reports the operation, status and the server's (redacted) message.
func (e *APIError) Error() string {
	s := fmt.Sprintf("e2b: %s: HTTP %d", e.Op, e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap makes 401/403 answers match ErrConfig.
func (e *APIError) Unwrap() error {
	if e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden {
		return ErrConfig
	}
	return nil
}

// retryable statuses: the request was refused or failed on E2B's side.
func retryableStatus(code int) bool {
	return code == http.StatusTooManyRequests || code >= 500
}

// response is one attempt's outcome.
type response struct {
	status int
	header http.Header
	body   []byte
}

// call performs one control-plane request with the per-attempt timeout. A transport
// error (including the attempt's timeout) is returned as err; any HTTP status is a
// response.
func (p *Provider) call(ctx context.Context, method, path string, query url.Values, body any) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(b)
	}
	u := p.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return response{}, err
	}
	req.Header.Set("X-API-Key", p.cfg.APIKey)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := p.http.Do(req)
	if err != nil {
		return response{}, p.scrub(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	if err != nil {
		return response{}, p.scrub(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}, nil
}

// scrub rewrites a transport error whose text carries a secret (it never should: the
// key travels in a header, but a proxy or a wrapped message could echo it). The
// result keeps the context errors reachable for errors.Is.
func (p *Provider) scrub(err error) error {
	msg := err.Error()
	if red := p.redact(msg); red != msg || len(msg) > 300 {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("%s: %w", red, context.DeadlineExceeded)
		case errors.Is(err, context.Canceled):
			return fmt.Errorf("%s: %w", red, context.Canceled)
		}
		return errors.New(red)
	}
	return err
}

// apiError builds the error of a non-success response.
func (p *Provider) apiError(op string, r response) *APIError {
	var body struct {
		Message   string `json:"message"`
		ErrorCode string `json:"error_code"`
	}
	msg := ""
	if json.Unmarshal(r.body, &body) == nil && body.Message != "" {
		msg = body.Message
	} else {
		msg = strings.TrimSpace(string(r.body))
	}
	return &APIError{Op: op, Status: r.status, Code: p.redact(body.ErrorCode), Message: p.redact(msg)}
}

// retryAfter reads a Retry-After header given in seconds.
func retryAfter(h http.Header) time.Duration {
	if h == nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// step is one attempt of a retried operation: done=true ends the loop with err (nil
// is success); done=false is a transient failure worth another attempt, waiting at
// least wait.
type step func(ctx context.Context, attempt int) (done bool, wait time.Duration, err error)

// retry runs fn until it is done, the attempts are used up, or the next wait would
// pass ctx's deadline; the last transient error is returned wrapped.
func (p *Provider) retry(ctx context.Context, op string, fn step) error {
	var last error
	for attempt := 0; attempt < p.cfg.Retry.Attempts; attempt++ {
		if err := ctx.Err(); err != nil {
			if last == nil {
				return fmt.Errorf("e2b: %s: %w", op, err)
			}
			return fmt.Errorf("e2b: %s: %w (after: %w)", op, err, last)
		}
		done, wait, err := fn(ctx, attempt)
		if done {
			return err
		}
		last = err
		if attempt == p.cfg.Retry.Attempts-1 {
			break
		}
		d := max(wait, p.backoff(attempt))
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
			break
		}
		p.log.Debug("e2b: retrying", "op", op, "attempt", attempt+1, "wait", d, "err", err.Error())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	return fmt.Errorf("e2b: %s: gave up (transient): %w", op, last)
}

// backoff is the full-jitter delay before attempt n+1.
func (p *Provider) backoff(n int) time.Duration {
	ceil := p.cfg.Retry.Base << min(n, 20)
	if ceil <= 0 || ceil > p.cfg.Retry.Max {
		ceil = p.cfg.Retry.Max
	}
	return rand.N(ceil + 1)
}

// idempotent runs a request that is safe to repeat, retrying transport errors and
// retryable statuses; ok lists the statuses handed back to the caller as success.
func (p *Provider) idempotent(ctx context.Context, op, method, path string, query url.Values, body any, ok ...int) (response, error) {
	var out response
	err := p.retry(ctx, op, func(ctx context.Context, _ int) (bool, time.Duration, error) {
		r, err := p.call(ctx, method, path, query, body)
		if err != nil {
			if ctx.Err() != nil {
				return true, 0, fmt.Errorf("e2b: %s: %w", op, err)
			}
			return false, 0, fmt.Errorf("e2b: %s: %w", op, err)
		}
		for _, s := range ok {
			if r.status == s {
				out = r
				return true, 0, nil
			}
		}
		apiErr := p.apiError(op, r)
		if retryableStatus(r.status) || r.status == http.StatusConflict {
			return false, retryAfter(r.header), apiErr
		}
		return true, 0, apiErr
	})
	return out, err
}
