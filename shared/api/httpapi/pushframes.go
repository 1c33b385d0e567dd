package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// The push protocol's rules shared by the dev server (push.go) and the deployed push
// (shared/api/push, docs/design.md §8.1): decoding a client's message, cutting events into
// frames, and an error's message.

// DecodePushRequest decodes and validates one client message strictly (the dev server's
// and the deployed push's one rule); After is set (0 when absent).
func DecodePushRequest(b []byte) (wire.PushRequest, error) {
	var req wire.PushRequest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return wire.PushRequest{}, contract.Invalid("message", "not a push request document")
	}
	if dec.More() {
		return wire.PushRequest{}, contract.Invalid("message", "one JSON document per message")
	}
	if req.Type != wire.PushSubscribe && req.Type != wire.PushUnsubscribe {
		return req, contract.Invalid("type", "must be subscribe or unsubscribe")
	}
	if err := contract.CheckID("runId", req.RunID); err != nil {
		req.RunID = "" // never echo an invalid id
		return req, err
	}
	if req.After == nil {
		zero := int64(0)
		req.After = &zero
	}
	if *req.After < 0 {
		return req, contract.Invalid("after", "must not be negative")
	}
	return req, nil
}

// pushEnvelope bounds what a message adds around its events (type, a 128-byte run id,
// next): a page is cut so that every message stays within wire.MaxPushMessageBytes.
const pushEnvelope = 512

// PushFrames cuts events into the messages that carry them, each within
// wire.MaxPushMessageBytes once encoded (EncodePush): whole events packed greedily, and an
// event too large for a message alone as consecutive event-part messages, each cut at a
// UTF-8 boundary and shrunk until its encoding (escapes included) fits.
func PushFrames(runID string, events []contract.Event) []wire.PushMessage {
	var out []wire.PushMessage
	var evs []contract.Event
	size := 0
	flush := func() {
		if len(evs) > 0 {
			out = append(out, wire.PushMessage{Type: wire.PushEvents, RunID: runID, Events: evs, Next: evs[len(evs)-1].Offset})
		}
		evs, size = nil, 0
	}
	for _, e := range events {
		b, err := encodeJSON(e)
		if err != nil {
			panic(fmt.Sprintf("httpapi: marshal event: %v", err)) // stored events are JSON
		}
		n := len(b) + 1
		if n+pushEnvelope > wire.MaxPushMessageBytes {
			flush()
			out = append(out, pushParts(runID, e)...)
			continue
		}
		if size+n+pushEnvelope > wire.MaxPushMessageBytes {
			flush()
		}
		evs, size = append(evs, e), size+n
	}
	flush()
	return out
}

// pushParts cuts one large event into event-part messages.
func pushParts(runID string, e contract.Event) []wire.PushMessage {
	var out []wire.PushMessage
	text := string(e.Data)
	for len(text) > 0 {
		n := min(len(text), (wire.MaxPushMessageBytes-pushEnvelope)/2)
		for {
			for n < len(text) && n > 0 && !utf8.RuneStart(text[n]) {
				n--
			}
			m := wire.PushMessage{Type: wire.PushEventPart, RunID: runID, Next: e.Offset, Offset: e.Offset, Src: e.Src,
				Text: text[:n], Final: n == len(text)}
			if len(EncodePush(m)) <= wire.MaxPushMessageBytes {
				out = append(out, m)
				break
			}
			n /= 2
		}
		text = text[n:]
	}
	return out
}

// EncodePush is a message's frame: its JSON without HTML escaping or a newline.
func EncodePush(m wire.PushMessage) []byte {
	b, err := encodeJSON(m)
	if err != nil {
		panic(fmt.Sprintf("httpapi: marshal push message: %v", err))
	}
	return bytes.TrimSuffix(b, []byte("\n"))
}

// PushError is the error message answering a push request that failed with err: the HTTP
// API's problem document and code. infra reports an error that is not the client's doing
// (the caller logs it; the message says only that it may be retried).
func PushError(runID string, err error, requestID string) (m wire.PushMessage, infra bool) {
	status, code, infra := classify(err)
	return wire.PushMessage{Type: wire.PushError, RunID: runID, Problem: &Problem{
		Type: wire.ProblemTypePrefix + code, Title: titles[code], Status: status,
		Detail: detailOf(err, code, infra), Code: code, RequestID: requestID,
	}}, infra
}

// PushRefusal is an error whose push error message has the given status and code (a
// bound of the push service: CodeTooManySubscriptions, CodeTooManyConnections).
func PushRefusal(status int, code, detail string) error { return &apiError{status, code, detail} }
