package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// pushDial opens a push connection to dev as tenant ("" = the default).
func pushDial(ctx context.Context, t *testing.T, devURL, tenant string, hdr http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	if hdr == nil {
		hdr = http.Header{}
	}
	if tenant != "" {
		hdr.Set(httpapi.TenantHeader, tenant)
	}
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(devURL, "http")+wire.SubscribePath,
		&websocket.DialOptions{HTTPHeader: hdr, Host: hdr.Get("Host"), Subprotocols: []string{wire.PushSubprotocol}})
	if c != nil {
		t.Cleanup(func() { c.CloseNow() })
	}
	return c, resp, err
}

// pushRead reads one push message.
func pushRead(ctx context.Context, c *websocket.Conn) (wire.PushMessage, error) {
	var m wire.PushMessage
	_, b, err := c.Read(ctx)
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	return m, err
}

// pushFollow subscribes c to runID after `after` and returns the offsets delivered up to
// the close (failing on a duplicate, a gap or anything but the protocol's messages).
func pushFollow(ctx context.Context, c *websocket.Conn, runID string, after int64) ([]int64, error) {
	b, _ := json.Marshal(wire.PushRequest{Type: wire.PushSubscribe, RunID: runID, After: &after})
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		return nil, err
	}
	var got []int64
	next := after
	for {
		m, err := pushRead(ctx, c)
		if err != nil {
			return got, err
		}
		switch m.Type {
		case wire.PushSubscribed:
		case wire.PushEvents:
			for _, e := range m.Events {
				if e.Offset != next+1 {
					return got, fmt.Errorf("offset %d after %d", e.Offset, next)
				}
				next = e.Offset
				got = append(got, e.Offset)
			}
		case wire.PushClosed:
			return got, nil
		case wire.PushError:
			return got, fmt.Errorf("error %s: %s", m.Problem.Code, m.Problem.Detail)
		default:
			return got, fmt.Errorf("unexpected %+v", m)
		}
	}
}

// TestDevPushesToWatchers: a real WebSocket client on a real `sandkeep dev` (both
// backends) gets a run's events after its offset once each, stored ones and live ones, then
// the close; another tenant's subscribe gets unknown-run; the Host rule holds for the
// upgrade. On a table, a second server's appends reach the first one's watcher (the poll).
func TestDevPushesToWatchers(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			args := b.args(t)
			dev := clitest.StartDev(t, nil, append(args, "--push-poll", "100ms")...)
			writer := dev
			if b.name == "dynalite" {
				writer = clitest.StartDev(t, nil, append(args, "--push-poll", "0")...) // appends made elsewhere
			}
			ctx := clitest.Context(t)
			c, err := apiclient.New(apiclient.Config{BaseURL: writer.URL})
			if err != nil {
				t.Fatal(err)
			}
			st, err := c.Start(ctx, wire.StartRequest{RunID: "run-p", ThreadID: "thread-p", Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
			if err != nil {
				t.Fatal(err)
			}
			cursor := st.Cursor
			appendN := func(n int) {
				t.Helper()
				evs := make([]wire.EventIn, n)
				for i := range evs {
					evs[i] = wire.EventIn{Data: json.RawMessage(`{"line":"x"}`)}
				}
				res, err := c.Append(ctx, "run-p", wire.AppendRequest{Cursor: cursor, Events: evs})
				if err != nil {
					t.Fatal(err)
				}
				cursor = res.Cursor
			}
			appendN(5)
			ws, _, err := pushDial(ctx, t, dev.URL, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			var got []int64
			go func() {
				var err error
				got, err = pushFollow(ctx, ws, "run-p", 2)
				done <- err
			}()
			for range 4 {
				appendN(3)
			}
			if _, err := c.Finish(ctx, "run-p", wire.FinishRequest{Cursor: cursor, Status: string(contract.StatusCompleted)}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("watcher: %v (got %v)", err, got)
			}
			if len(got) != 15 || got[0] != 3 || got[14] != 17 {
				t.Fatalf("delivered %v, want 3..17", got)
			}
			// Another tenant: unknown-run, nothing else.
			other, _, err := pushDial(ctx, t, dev.URL, "other", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pushFollow(ctx, other, "run-p", 0); err == nil || !strings.Contains(err.Error(), "unknown-run") {
				t.Fatalf("another tenant's subscribe: %v", err)
			}
			// A DNS-rebinding page: the upgrade is refused like any request.
			port := dev.URL[strings.LastIndex(dev.URL, ":")+1:]
			_, resp, err := pushDial(ctx, t, dev.URL, "", http.Header{"Host": {"rebound.example:" + port}})
			if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
				t.Fatalf("rebound Host: %v %v", resp, err)
			}
		})
	}
}
