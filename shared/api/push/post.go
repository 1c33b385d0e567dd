package push

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// ErrGone: the push service no longer knows the connection (the management API's 410).
var ErrGone = errors.New("push connection gone")

// Poster sends one message to one connection.
type Poster interface {
	Post(ctx context.Context, connID string, msg []byte) error
}

// SigningService is the SigV4 service name of the management API (execute-api).
const SigningService = "execute-api"

// PostTimeout bounds one PostToConnection.
const PostTimeout = 5 * time.Second

// Management posts through the WebSocket API's management endpoint: PostToConnection is
// POST {endpoint}/@connections/{connectionId} with the message as the body, signed with
// the AWS SDK's own SigV4 signer for execute-api (the SDK's apigatewaymanagementapi client
// would do the same; this needs only the SDK's core module).
type Management struct {
	endpoint string // https://{api}.execute-api.{region}.amazonaws.com/{stage}, no trailing slash
	region   string
	creds    aws.CredentialsProvider
	signer   *v4.Signer
	client   *http.Client
	now      func() time.Time
}

// NewManagement returns the poster of the API whose management endpoint is endpoint
// (https; http only for a loopback stand-in), signing for region with creds. client may be
// nil (a client with PostTimeout).
func NewManagement(endpoint, region string, creds aws.CredentialsProvider, client *http.Client) (*Management, error) {
	if err := CheckEndpoint(endpoint); err != nil {
		return nil, err
	}
	if region == "" || creds == nil {
		return nil, errors.New("push: the management endpoint needs a region and credentials")
	}
	if client == nil {
		client = &http.Client{Timeout: PostTimeout}
	}
	return &Management{endpoint: strings.TrimSuffix(endpoint, "/"), region: region, creds: creds,
		signer: v4.NewSigner(), client: client, now: time.Now}, nil
}

// CheckEndpoint accepts an absolute https URL with a stage path and nothing else (no
// credentials, query or fragment); http only on a loopback host (tests, the emulator).
func CheckEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("push: endpoint %q: want https://{api}.execute-api.{region}.amazonaws.com/{stage}", endpoint)
	}
	if u.Scheme == "https" {
		return nil
	}
	if ip := net.ParseIP(u.Hostname()); u.Scheme == "http" && (u.Hostname() == "localhost" || ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("push: endpoint %q: https only (http on a loopback host)", endpoint)
}

// Post is PostToConnection: 200 is delivered, 410 ErrGone, anything else an error.
func (m *Management) Post(ctx context.Context, connID string, msg []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.endpoint+"/@connections/"+url.PathEscape(connID), bytes.NewReader(msg))
	if err != nil {
		return fmt.Errorf("push: post request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	sum := sha256.Sum256(msg)
	creds, err := m.creds.Retrieve(ctx)
	if err != nil {
		return fmt.Errorf("push: credentials: %w", err)
	}
	if err := m.signer.SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), SigningService, m.region, m.now()); err != nil {
		return fmt.Errorf("push: sign: %w", err)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return fmt.Errorf("push: post to %q: %w", connID, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode == http.StatusGone:
		return fmt.Errorf("push: post to %q: %w", connID, ErrGone)
	}
	return fmt.Errorf("push: post to %q: status %d: %s", connID, resp.StatusCode, bytes.TrimSpace(body))
}
