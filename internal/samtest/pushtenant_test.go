package samtest

import (
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
)

// TestPushMessageTenantIsTheConnections: the push function takes a message's tenant from
// the connection item its $connect stored, never from the message's event. API Gateway
// gives a message no headers, query or identity (lambdaevent.WebSocket builds them so);
// here the function is also handed forged message events that carry all three naming
// another tenant. Other's connection subscribing to acme's run with acme's header and
// query is unknown-run, acme's connection naming "other" subscribes as acme, a connection
// never opened is unavailable whatever it names, and acme's append then reaches acme's
// connection alone (a subscription stored for other's would be posted to as well).
func TestPushMessageTenantIsTheConnections(t *testing.T) {
	t.Parallel()
	d := newDeployment(t)
	s := d.want(200, "POST", "/v1/runs", startBody("run-f", "thread-f", nil)) // acme's
	d.tenant = "other"
	d.ws("$connect", "conn-other", "")
	d.tenant = "acme"
	d.ws("$connect", "conn-acme", "")

	forged := func(conn, tenant string) events.APIGatewayWebsocketProxyRequest {
		ev := lambdaevent.WebSocket{Route: "subscribe", ConnID: conn, Body: `{"type":"subscribe","runId":"run-f","after":0}`,
			RequestID: "ws-forged-" + conn, Stage: "dev"}.Event()
		if ev.Headers != nil || ev.QueryStringParameters != nil {
			t.Fatalf("a message event carries the upgrade's headers or query: %+v", ev)
		}
		ev.Headers = map[string]string{"Host": "push.example", httpapi.TenantHeader: tenant}
		ev.QueryStringParameters = map[string]string{"tenant": tenant}
		ev.RequestContext.Identity.UserArn = callerSession
		return ev
	}
	for _, c := range []struct{ conn, names string }{{"conn-other", "acme"}, {"conn-acme", "other"}, {"conn-never", "acme"}} {
		resp, err := d.push.Handle(t.Context(), forged(c.conn, c.names))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s's message naming %s: %v %+v", c.conn, c.names, err, resp)
		}
	}
	first := func(conn string) wire.PushMessage {
		t.Helper()
		msgs := d.standin.Messages(t, conn)
		if len(msgs) == 0 {
			t.Fatalf("%s was answered nothing", conn)
		}
		return msgs[0]
	}
	if m := first("conn-other"); m.Type != wire.PushError || m.Problem == nil || m.Problem.Code != wire.CodeUnknownRun {
		t.Fatalf("other's connection naming acme subscribed to acme's run: %+v", m)
	}
	if m := first("conn-acme"); m.Type != wire.PushSubscribed || m.RunID != "run-f" {
		t.Fatalf("acme's connection naming other: %+v", m)
	}
	if m := first("conn-never"); m.Type != wire.PushError || m.Problem == nil || m.Problem.Code != wire.CodeUnavailable {
		t.Fatalf("a connection never opened, naming acme: %+v", m)
	}
	d.want(200, "POST", "/v1/runs/run-f/events", map[string]any{"cursor": s["cursor"], "events": []any{map[string]any{"data": "secret"}}})
	got := d.standin.Messages(t, "conn-acme")
	if len(got) != 2 || got[1].Type != wire.PushEvents || len(got[1].Events) != 1 || string(got[1].Events[0].Data) != `"secret"` {
		t.Fatalf("acme's watcher received %+v", got)
	}
	if o := d.standin.Messages(t, "conn-other"); len(o) != 1 {
		t.Fatalf("other's connection received %+v", o)
	}
}
