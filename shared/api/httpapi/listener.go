package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep/shared/api/wire"
)

// serverErrorHeaders follow the status line of the plain-text answer net/http's server
// writes, in one write and before closing, to a request it cannot parse (a bad %-escape
// in the path, a malformed request line or header, headers too large): no handler ever
// sees such a request.
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// ProblemListener wraps ln so that the plain-text error answers of an http.Server serving
// it become problem+json with code invalid (same status), like every other refusal of the
// API, each with a request id and a log line. Nothing else is changed: a handler's
// answer always carries a Date header (and API bodies are JSON, whose strings never hold
// a raw CR LF), so it never has that shape.
func ProblemListener(ln net.Listener, logger *slog.Logger) net.Listener {
	if logger == nil {
		logger = slog.Default()
	}
	return problemListener{Listener: ln, log: logger}
}

type problemListener struct {
	net.Listener
	log *slog.Logger
}

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return problemConn{Conn: c, log: l.log}, nil
}

type problemConn struct {
	net.Conn
	log *slog.Logger
}

// Write passes b through unless it is the server's own plain-text error answer.
func (c problemConn) Write(b []byte) (int, error) {
	const prefix = "HTTP/1.1 "
	if len(b) > 1024 || !bytes.HasPrefix(b, []byte(prefix)) {
		return c.Conn.Write(b)
	}
	statusLine, text, ok := strings.Cut(string(b[len(prefix):]), serverErrorHeaders)
	code, err := strconv.Atoi(strings.SplitN(statusLine, " ", 2)[0])
	if !ok || err != nil || code < 400 || code > 599 || strings.Contains(statusLine, "\r\n") {
		return c.Conn.Write(b)
	}
	id := strings.ToLower(rand.Text())
	body, _ := encodeJSON(Problem{
		Type:      wire.ProblemTypePrefix + CodeInvalid,
		Title:     titles[CodeInvalid],
		Status:    code,
		Detail:    "the request could not be parsed (" + text + "): a malformed request line, %-escape in the path, or header",
		Code:      CodeInvalid,
		RequestID: id,
	})
	c.log.LogAttrs(context.Background(), slog.LevelInfo, "request",
		slog.String("requestId", id), slog.String("route", "unparsed"), slog.Int("status", code),
		slog.String("code", CodeInvalid), slog.String("remote", c.RemoteAddr().String()))
	var out bytes.Buffer
	fmt.Fprintf(&out, "%s%d %s\r\nContent-Type: %s\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n%s: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n",
		prefix, code, http.StatusText(code), ProblemContentType, RequestIDHeader, id, len(body))
	out.Write(body)
	if _, err := c.Conn.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(b), nil
}
