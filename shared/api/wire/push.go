package wire

import (
	"encoding/json"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The push protocol (api/asyncapi.yaml; docs/design.md §8.1): a watcher opens one WebSocket
// connection, subscribes to runs from an offset and receives their events as they are
// stored. Every message is one JSON text frame of at most MaxPushMessageBytes, so the same
// frames pass an API Gateway WebSocket API (32 KB frames) unchanged.

// SubscribePath is the dev server's WebSocket endpoint (GET, upgraded).
const SubscribePath = "/v1/subscribe"

// PushSubprotocol is the WebSocket subprotocol a client offers; the server selects it.
const PushSubprotocol = "sandkeep.push.v1"

// Push bounds.
const (
	// MaxPushMessageBytes bounds every frame either way: API Gateway's frame limit.
	MaxPushMessageBytes = 32 << 10
	// MaxPushRequestBytes bounds a client message (a subscribe is a few hundred bytes).
	MaxPushRequestBytes = 4 << 10
	// DefaultMaxSubscriptions is a connection's default bound on open subscriptions.
	DefaultMaxSubscriptions = 64
	// DefaultMaxConnections is a tenant's default bound on open connections per server.
	DefaultMaxConnections = 256
)

// Client message types.
const (
	PushSubscribe   = "subscribe"
	PushUnsubscribe = "unsubscribe"
)

// Server message types.
const (
	// PushSubscribed acknowledges a subscribe: the run is the caller's; its events after
	// Next follow, in order.
	PushSubscribed = "subscribed"
	// PushEvents carries whole events, consecutive offsets, the page's last offset in Next.
	PushEvents = "events"
	// PushEventPart carries a slice of one event too large for a frame: the parts of one
	// offset arrive consecutively, Final on the last; their Text joined is the event's JSON.
	PushEventPart = "event-part"
	// PushClosed: the log is closed and every event up to Next was delivered; the
	// subscription is over.
	PushClosed = "closed"
	// PushError answers a request (Problem.Code is the HTTP API's code); a subscription it
	// names is over (or never began).
	PushError = "error"
)

// PushRequest is a client's message.
type PushRequest struct {
	Type  string `json:"type"`  // subscribe or unsubscribe
	RunID string `json:"runId"` // the run
	// After is the last offset the client holds (subscribe; default 0, from the start).
	After *int64 `json:"after"`
}

// PushMessage is a server's message; which members are set depends on Type.
type PushMessage struct {
	Type  string `json:"type"`
	RunID string `json:"runId,omitempty"`
	// Events: events (whole, consecutive offsets).
	Events []contract.Event `json:"events,omitempty"`
	// Next: subscribed (the offset delivery continues after), events (the last offset in
	// the message, or of the part's event), closed (the log's last offset).
	Next int64 `json:"next"`
	// After: events, event-part and closed as the deployed push posts them (absent from
	// the dev server, whose delivery is in order): no event lies between this offset and
	// the message's first (for closed, the close). A client holding less than After missed
	// a message — writers post their own batches, and two may arrive out of order — and
	// subscribes again from the last offset it holds (docs/design.md §8.1).
	After *int64 `json:"after,omitempty"`
	// Offset, Src, Text and Final: event-part.
	Offset int64  `json:"offset,omitempty"`
	Src    int64  `json:"src,omitempty"`
	Text   string `json:"text,omitempty"`
	Final  bool   `json:"final,omitempty"`
	// Problem: error.
	Problem *Problem `json:"problem,omitempty"`
}

// PushEventParts joins the Text of an event's parts into its data.
func PushEventParts(parts []PushMessage) (contract.Event, bool) {
	if len(parts) == 0 || !parts[len(parts)-1].Final {
		return contract.Event{}, false
	}
	var b []byte
	for _, p := range parts {
		b = append(b, p.Text...)
	}
	if !json.Valid(b) {
		return contract.Event{}, false
	}
	return contract.Event{Offset: parts[0].Offset, Src: parts[0].Src, Data: b}, true
}

// PushTicketPath issues push tickets (POST): in a JWT deployment the WebSocket API's
// $connect takes a ticket, not the JWT (docs/design.md §8.1).
const PushTicketPath = "/v1/push/ticket"

// PushTicketQuery is the $connect query parameter carrying a ticket (a browser's
// upgrade cannot set headers).
const PushTicketQuery = "ticket"

// PushTicketResponse answers POST /v1/push/ticket: a ticket for the caller's tenant, its
// expiry (Unix ms), and the push endpoint to connect to with ?ticket=.
type PushTicketResponse struct {
	Ticket    string `json:"ticket"`
	ExpiresAt int64  `json:"expiresAt"`
	PushURL   string `json:"pushUrl"`
}
