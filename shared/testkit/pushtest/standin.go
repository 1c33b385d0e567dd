// Package pushtest is a local stand-in of an API Gateway WebSocket API's management
// endpoint (PostToConnection) for tests of the deployed push (docs/design.md §8.1): it
// verifies each request's SigV4 signature (shape, then the signature itself, recomputed
// with the AWS SDK's signer over the body it received), records what each connection was
// sent, and answers 410 for a connection marked gone.
package pushtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
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

// authShape is a SigV4 Authorization header for execute-api.
var authShape = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([a-z0-9-]+)/execute-api/aws4_request, SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$`)

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
		http.Error(w, `{"message":"`+why+`"}`, http.StatusForbidden)
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

// verify checks the request's SigV4 signature: the Authorization header's shape (algorithm,
// credential scope for execute-api in Region, signed headers host and x-amz-date), the
// X-Amz-Date, then the signature itself, recomputed over the headers it names and the
// SHA-256 of the body as received. It returns why it does not verify ("" when it does).
func verify(r *http.Request, body []byte) string {
	m := authShape.FindStringSubmatch(r.Header.Get("Authorization"))
	if m == nil {
		return "authorization header is not SigV4 for execute-api: " + r.Header.Get("Authorization")
	}
	key, day, region, signed := m[1], m[2], m[3], strings.Split(m[4], ";")
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	switch {
	case err != nil:
		return "bad X-Amz-Date"
	case key != AccessKey:
		return "unknown access key " + key
	case region != Region:
		return "credential scope region " + region
	case at.Format("20060102") != day:
		return "credential scope date differs from X-Amz-Date"
	case !slices.Contains(signed, "host") || !slices.Contains(signed, "x-amz-date"):
		return "signed headers lack host or x-amz-date: " + m[4]
	}
	// Recompute: the same request as sent, with only the headers it signed.
	u := &url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath}
	again, _ := http.NewRequestWithContext(context.Background(), r.Method, u.String(), bytes.NewReader(body))
	for _, h := range signed {
		if h != "host" && h != "content-length" {
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	again.Header.Del("X-Amz-Date") // the signer sets it from the time
	sum := sha256.Sum256(body)
	creds := aws.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), "execute-api", Region, at); err != nil {
		return fmt.Sprintf("re-sign: %v", err)
	}
	if again.Header.Get("Authorization") != r.Header.Get("Authorization") {
		return "signature does not verify over the received body"
	}
	return ""
}
