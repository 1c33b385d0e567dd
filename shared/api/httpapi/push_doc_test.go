package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/sandkeep/sandkeep/shared/api/wire"
)

// pushSchemas compiles api/asyncapi.yaml's message schemas by message type.
func pushSchemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	raw, err := os.ReadFile("../../../api/asyncapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(doc)
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("asyncapi.json", v); err != nil {
		t.Fatal(err)
	}
	out := map[string]*jsonschema.Schema{}
	for typ, name := range map[string]string{
		wire.PushSubscribe: "Subscribe", wire.PushUnsubscribe: "Unsubscribe", wire.PushSubscribed: "Subscribed",
		wire.PushEvents: "Events", wire.PushEventPart: "EventPart", wire.PushClosed: "Closed", wire.PushError: "Error",
	} {
		s, err := c.Compile("asyncapi.json#/components/schemas/" + name)
		if err != nil {
			t.Fatalf("schema %s: %v", name, err)
		}
		out[typ] = s
	}
	return out
}

// TestPushMessagesMatchTheDocument: every message of a session, both ways, is what
// api/asyncapi.yaml documents; the check refuses a drifted message.
func TestPushMessagesMatchTheDocument(t *testing.T) {
	schemas := pushSchemas(t)
	check := func(b []byte) error {
		var m struct{ Type string }
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return err
		}
		s := schemas[m.Type]
		if s == nil {
			t.Fatalf("undocumented type %q", m.Type)
		}
		return s.Validate(v)
	}
	if check([]byte(`{"type":"events","runId":"r","events":[{"offset":1,"data":1,"extra":1}],"next":1}`)) == nil {
		t.Fatal("a drifted message passed")
	}
	e := newPushEnv(t, backends()["memstore"](t), PushConfig{MaxSubscriptions: 1}, nil)
	st := e.start("", "run-1", "thread-1")
	ar := decode[wire.AppendResponse](t, e.appendEvents("", "run-1", st.Cursor, "a", map[string]any{"s": strings.Repeat("x", 100_000)}))
	e.finish("", "run-1", ar.Cursor, "completed").wantStatus(t, http.StatusOK)
	c := e.mustDial("")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sent := []string{
		`{"type":"subscribe","runId":"nope"}`,
		`{"type":"subscribe","runId":"run-1","after":0}`,
		`{"type":"subscribe","runId":"other-run","after":0}`,
		`{"type":"unsubscribe","runId":"run-1"}`,
	}
	for _, s := range sent {
		if err := check([]byte(s)); err != nil {
			t.Fatalf("request %s: %v", s, err)
		}
	}
	seen := map[string]bool{}
	for _, s := range sent[:2] {
		if err := c.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
			t.Fatal(err)
		}
		if s == sent[1] {
			break
		}
		// The refused subscribe's error, before the next takes the one slot.
		_, b, err := c.Read(ctx)
		if err != nil || check(b) != nil {
			t.Fatalf("%s: %v", b, err)
		}
		seen[wire.PushError] = true
	}
	for !seen[wire.PushClosed] {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := check(b); err != nil {
			t.Fatalf("message %.200s: %v", b, err)
		}
		var m wire.PushMessage
		_ = json.Unmarshal(b, &m)
		seen[m.Type] = true
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(sent[2])); err != nil {
		t.Fatal(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil || check(b) != nil {
		t.Fatalf("%s: %v", b, err)
	}
	for _, typ := range []string{wire.PushError, wire.PushSubscribed, wire.PushEvents, wire.PushEventPart, wire.PushClosed} {
		if !seen[typ] {
			t.Errorf("the session never showed a %s message", typ)
		}
	}
}
