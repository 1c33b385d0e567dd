// Package pushtest is a local stand-in of an API Gateway WebSocket API's management
// endpoint (PostToConnection) for tests of the deployed push (docs/design.md §8.1): it
// verifies each request's SigV4 signature (Verifier), records what each connection was
// sent, and answers 410 for a connection marked gone. Verifier is also the check of a
// stand-in of the WebSocket API's IAM-authorized $connect (the Go client's signed upgrade).
package pushtest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/sandkeep/sandkeep/shared/api/wire"
)

// The stand-in's own account: a poster must sign with these to be accepted.
const (
	AccessKey = "AKIDSTANDIN0000PUSH"
	SecretKey = "stand-in secret of the push management endpoint"
	Region    = "us-east-1"
	Stage     = "dev"
)

// Post is one accepted PostToConnection.
type Post struct {
	ConnID string
	Body   []byte
	At     time.Time // when the stand-in received it
}

// StandIn is a running stand-in; safe for concurrent use.
type StandIn struct {
	srv      *httptest.Server
	mu       sync.Mutex
	posts    []Post
	gone     map[string]bool
	refused  []string      // why requests were refused (a signature that did not verify)
	changed  chan struct{} // closed and replaced at every post
	received int
}

// Start starts a stand-in, stopped when the test ends.
func Start(t testing.TB) *StandIn {
	s := &StandIn{gone: map[string]bool{}, changed: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// Endpoint is the management endpoint, https://{api}.execute-api.{region}.amazonaws.com/{stage}'s stand-in.
func (s *StandIn) Endpoint() string { return s.srv.URL + "/" + Stage }

// Credentials are the credentials the stand-in verifies signatures with.
func Credentials() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, "")
}

// Gone makes every later post to connID a 410.
func (s *StandIn) Gone(connID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone[connID] = true
}

// Refused returns why requests were refused (empty: every signature verified).
func (s *StandIn) Refused() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.refused)
}

// Received counts the requests received (accepted, refused or answered 410).
func (s *StandIn) Received() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received
}

// Posts returns the accepted posts to connID ("" for all), in arrival order.
func (s *StandIn) Posts(connID string) []Post {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Post
	for _, p := range s.posts {
		if connID == "" || p.ConnID == connID {
			out = append(out, p)
		}
	}
	return out
}

// Messages decodes the messages connID was sent.
func (s *StandIn) Messages(t testing.TB, connID string) []wire.PushMessage {
	t.Helper()
	var out []wire.PushMessage
	for _, p := range s.Posts(connID) {
		var m wire.PushMessage
		if err := json.Unmarshal(p.Body, &m); err != nil {
			t.Fatalf("the stand-in received a message that is not a push message: %q", p.Body)
		}
		out = append(out, m)
	}
	return out
}

// Await waits (bounded by timeout) until done reports true over connID's messages; it is
// checked at every post, never by sleeping.
func (s *StandIn) Await(t testing.TB, connID string, timeout time.Duration, done func([]wire.PushMessage) bool) []wire.PushMessage {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		msgs := s.Messages(t, connID)
		if done(msgs) {
			return msgs
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("connection %s: condition not met within %s; messages: %d", connID, timeout, len(msgs))
		}
	}
}

func (s *StandIn) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.received++
	s.mu.Unlock()
	conn, ok := strings.CutPrefix(r.URL.EscapedPath(), "/"+Stage+"/@connections/")
	if r.Method != http.MethodPost || !ok || conn == "" {
		http.Error(w, `{"message":"no such route"}`, http.StatusNotFound)
		return
	}
	id, err := url.PathUnescape(conn)
	if err != nil {
		http.Error(w, `{"message":"bad connection id"}`, http.StatusBadRequest)
		return
	}
	if why := verify(r, body); why != "" {
		s.mu.Lock()
		s.refused = append(s.refused, why)
		s.mu.Unlock()
		msg, _ := json.Marshal(map[string]string{"message": why})
		http.Error(w, string(msg), http.StatusForbidden)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone[id] {
		http.Error(w, `{"message":"GoneException"}`, http.StatusGone)
		return
	}
	s.posts = append(s.posts, Post{ConnID: id, Body: body, At: time.Now()})
	close(s.changed)
	s.changed = make(chan struct{})
	w.WriteHeader(http.StatusOK)
}

// verify checks a post's signature with the stand-in's own credentials and region.
func verify(r *http.Request, body []byte) string {
	v := Verifier{Credentials: aws.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey}, Region: Region}
	if err := v.Verify(r, body); err != nil {
		return err.Error()
	}
	return ""
}
