package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep/shared/api/wire"
)

// tinyBuffer is the socket buffer both ends of the slow consumer's connection get (the
// kernel rounds it up to its minimum): a few pages of events overflow them, whatever the
// machine's default buffer sizes.
const tinyBuffer = 4096

// smallSendListener gives every accepted connection a tiny send buffer.
type smallSendListener struct{ net.Listener }

func (l smallSendListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(tinyBuffer)
	}
	return c, err
}

// smallReceiveClient dials with a tiny receive buffer, set before the connection is made
// so the window it advertises stays small.
func smallReceiveClient() *http.Client {
	d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, tinyBuffer)
		})
		return errors.Join(err, serr)
	}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

// TestPushDropsSlowConsumer: a watcher that subscribes to a run holding far more than the
// sockets between it and the server can buffer, and never reads, is dropped once a write
// has waited WriteTimeout: the connection is cut (no close frame: a reader sees the
// abnormal closure, 1006, after the messages already in its buffer), the request log says
// slow-consumer, and the tenant's connection place is free again (its cap is 1 here, so a
// new connection is the signal, polled for with a deadline). Nothing is queued for it: what
// reached it is a fraction of the log. Both backends; no timing decides it — the server's
// writes block for as long as the consumer does not read.
func TestPushDropsSlowConsumer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newPushEnv(t, nb(t), PushConfig{WriteTimeout: 50 * time.Millisecond, MaxConnections: 1}, nil,
			func(s *httptest.Server) { s.Listener = smallSendListener{s.Listener} })
		st := e.start("", "run-1", "thread-1")
		// 40 events of 30 KB: 1.2 MB in 40 messages, far over two 4 KB socket buffers.
		big := strings.Repeat("x", 30<<10)
		cursor := st.Cursor
		for range 2 {
			data := make([]any, 20)
			for i := range data {
				data[i] = big
			}
			r := e.appendEvents("", "run-1", cursor, data...)
			r.wantStatus(t, http.StatusOK)
			cursor = decode[wire.AppendResponse](t, r).Cursor
		}
		const total = 40 * (30 << 10)
		url := "ws" + strings.TrimPrefix(e.srv.URL, "http") + wire.SubscribePath
		ctx := t.Context()
		slow, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: smallReceiveClient(), Subprotocols: []string{wire.PushSubprotocol}})
		if err != nil {
			t.Fatal(err)
		}
		defer slow.CloseNow()
		slow.SetReadLimit(1 << 20)
		if err := subscribeMsg(slow, ctx, "run-1", 0); err != nil {
			t.Fatal(err)
		}
		// The consumer reads nothing now. Its place is freed only by the drop.
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, resp, err := e.dial(ctx, "")
			if err == nil {
				c.CloseNow()
				break
			}
			if resp == nil || resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("a second connection: %v, %v", resp, err)
			}
			if time.Now().After(deadline) {
				t.Fatal("the consumer that does not read still holds its connection after 30 s: it was not dropped")
			}
			time.Sleep(20 * time.Millisecond) // bounded polling: the drop has no signal a client can wait on
		}
		for !strings.Contains(e.logs.String(), `"outcome":"slow-consumer"`) {
			if time.Now().After(deadline) {
				t.Fatalf("no slow-consumer outcome logged:\n%s", e.logs)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// What reached the consumer's buffers, then the cut: no close frame.
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		got := 0
		for {
			_, b, err := slow.Read(rctx)
			if err != nil {
				if s := websocket.CloseStatus(err); s != -1 || rctx.Err() != nil {
					t.Fatalf("the dropped connection ended with %v (status %d), want a cut without a close frame", err, s)
				}
				break
			}
			got += len(b)
		}
		if got >= total/2 {
			t.Fatalf("the dropped consumer received %d bytes of a %d-byte log: it was buffered for", got, total)
		}
		t.Logf("the dropped consumer had received %d of %d bytes", got, total)
	})
}
