package pushtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// MaxSkew is how far a request's X-Amz-Date may be from the verifier's clock: API
// Gateway refuses a signature more than five minutes off its own.
const MaxSkew = 5 * time.Minute

// authShape is a SigV4 Authorization header for execute-api.
var authShape = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([a-z0-9-]+)/execute-api/aws4_request, SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$`)

// ErrSignature is every refusal of Verify.
var ErrSignature = errors.New("pushtest: the SigV4 signature does not verify")

// Verifier checks a request's SigV4 signature for execute-api as API Gateway's IAM
// authorizer does: the key is the one it knows, the credential scope is execute-api in its
// region on the request's day, the time is within MaxSkew of its clock, host and
// x-amz-date (and Signed) are signed, and the signature recomputed with the AWS SDK's own
// signer over the request as received (method, host, path, query, the signed headers, the
// body's SHA-256) is the one sent.
type Verifier struct {
	Credentials aws.Credentials // the key and secret the signer must use
	Region      string
	// Signed are more headers the request must have signed (the tenant header of an
	// upgrade, which API Gateway hands to $connect), lower-case.
	Signed []string
	Now    func() time.Time // default time.Now
}

// Verify returns nil when r's signature verifies over body, otherwise an ErrSignature
// saying why.
func (v Verifier) Verify(r *http.Request, body []byte) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSignature}, args...)...)
	}
	m := authShape.FindStringSubmatch(r.Header.Get("Authorization"))
	if m == nil {
		return refuse("authorization header is not SigV4 for execute-api: %q", r.Header.Get("Authorization"))
	}
	key, day, region, signed := m[1], m[2], m[3], strings.Split(m[4], ";")
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	switch {
	case err != nil:
		return refuse("bad X-Amz-Date %q", r.Header.Get("X-Amz-Date"))
	case key != v.Credentials.AccessKeyID:
		return refuse("unknown access key %s", key)
	case region != v.Region:
		return refuse("credential scope region %s, want %s", region, v.Region)
	case at.Format("20060102") != day:
		return refuse("credential scope date differs from X-Amz-Date")
	case at.Sub(now()).Abs() > MaxSkew:
		return refuse("signed at %s, more than %s from %s", at.Format(time.RFC3339), MaxSkew, now().UTC().Format(time.RFC3339))
	}
	for _, h := range append([]string{"host", "x-amz-date"}, v.Signed...) {
		if !slices.Contains(signed, h) {
			return refuse("signed headers %s lack %s", m[4], h)
		}
	}
	// Recompute: the same request as received, with only the headers it signed.
	u := &url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	again, err := http.NewRequestWithContext(context.Background(), r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return refuse("rebuild the request: %v", err)
	}
	for _, h := range signed {
		if h != "host" && h != "content-length" {
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	again.Header.Del("X-Amz-Date") // the signer sets it from the time
	sum := sha256.Sum256(body)
	if err := v4.NewSigner().SignHTTP(context.Background(), v.Credentials, again, hex.EncodeToString(sum[:]), "execute-api", v.Region, at); err != nil {
		return refuse("re-sign: %v", err)
	}
	if again.Header.Get("Authorization") != r.Header.Get("Authorization") {
		return refuse("the signature does not verify over the request as received")
	}
	return nil
}
