package httpapi

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// routePath is a concrete path of rt: every path parameter replaced by param.
func routePath(rt Route, param string) string {
	p := strings.ReplaceAll(rt.Path, "{runId}", param)
	return strings.ReplaceAll(p, "{threadId}", param)
}

// TestMalformedQueryRefused: a query url.ParseQuery cannot read whole is 400 invalid on
// every route, never served with the parameter silently dropped (GET /v1/runs?limit=%zz
// was answered 200 with the default limit).
func TestMalformedQueryRefused(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	for _, rt := range Routes() {
		for _, q := range []string{"limit=%zz", "after=1&limit=%2", "limit=1;after=2", "%zz"} {
			out := e.do(req{method: rt.Method, path: routePath(rt, "r") + "?" + q, body: "{}", specSays: "silent"})
			p := out.wantProblem(t, http.StatusBadRequest, CodeInvalid)
			if !strings.Contains(p.Detail, "query") {
				t.Errorf("%s ?%s: detail %q does not name the query", rt.Pattern(), q, p.Detail)
			}
		}
	}
}

// rawHTTP sends request bytes on a fresh connection to addr and reads one response.
func rawHTTP(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", request, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// WantUnparsedProblem asserts the problem+json answer ProblemListener gives to a request
// net/http could not parse.
func wantUnparsedProblem(t *testing.T, resp *http.Response, body []byte, status int) {
	t.Helper()
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != ProblemContentType {
		t.Fatalf("status %d, content type %q, want %d problem+json: %s", resp.StatusCode, resp.Header.Get("Content-Type"), status, body)
	}
	var p Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem body: %v: %s", err, body)
	}
	if p.Code != CodeInvalid || p.Status != status || p.RequestID == "" || p.RequestID != resp.Header.Get(RequestIDHeader) {
		t.Fatalf("problem %+v (request id header %q)", p, resp.Header.Get(RequestIDHeader))
	}
}

// TestProblemListener: behind ProblemListener, a request net/http refuses before any
// handler (a bad %-escape in the path on every route, a malformed request line) is
// answered problem+json 400 invalid, where a bare http.Server answers text/plain; the
// requests it can parse pass through unchanged.
func TestProblemListener(t *testing.T) {
	e := newEnv(t, DevAuth{}, nil)
	serve := func(t *testing.T, wrap bool) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: e.h, ReadHeaderTimeout: 5 * time.Second}
		served := ln
		if wrap {
			served = ProblemListener(ln, slog.New(slog.NewJSONHandler(io.Discard, nil)))
		}
		go func() { _ = srv.Serve(served) }()
		t.Cleanup(func() { _ = srv.Close() })
		return ln.Addr().String()
	}
	t.Run("bare server answers plain text", func(t *testing.T) {
		addr := serve(t, false)
		resp, body := rawHTTP(t, addr, "GET /v1/runs/%zz HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") == ProblemContentType {
			t.Fatalf("the control answered %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})
	addr := serve(t, true)
	for _, rt := range Routes() {
		path := routePath(rt, "a%zz")
		if path == rt.Path {
			path += "%E0%A4%A"
		}
		resp, body := rawHTTP(t, addr, rt.Method+" "+path+" HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 2\r\n\r\n{}")
		wantUnparsedProblem(t, resp, body, http.StatusBadRequest)
	}
	resp, body := rawHTTP(t, addr, "GET /v1/runs HTTP/1.1 extra\r\nHost: "+addr+"\r\n\r\n")
	wantUnparsedProblem(t, resp, body, http.StatusBadRequest)
	// A parsed request keeps its own answer, keep-alive and all.
	resp, body = rawHTTP(t, addr, "GET /v1/runs HTTP/1.1\r\nHost: "+addr+"\r\n\r\n")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Close {
		t.Fatalf("a valid request answered %d %q (close %v): %s", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Close, body)
	}
}
