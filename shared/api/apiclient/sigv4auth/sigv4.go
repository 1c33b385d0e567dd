// Package sigv4auth signs the Go client's requests (shared/api/apiclient) for API Gateway's
// IAM authorizer with the AWS SDK's SigV4 signer. It is opt-in: a program that
// authenticates otherwise (the dev server's tenant header, a JWT) links no AWS package.
package sigv4auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
)

// signingService is the SigV4 service of API Gateway's IAM authorizer.
const signingService = "execute-api"

// SigV4 is an apiclient.Authorizer that signs every attempt for API Gateway's IAM
// authorizer (service execute-api) with the AWS SDK's signer. The caller still names the
// tenant (apiclient.Config.Tenant): IAM authenticates the calling service, which speaks for
// its tenants.
type SigV4 struct {
	Credentials aws.CredentialsProvider
	Region      string
	Signer      *v4.Signer       // default v4.NewSigner()
	Now         func() time.Time // default time.Now
}

// New loads the AWS SDK's default credential chain (environment, shared config and
// credentials files, SSO, web identity, container and instance roles) and region. A
// region the configuration lacks is taken from an API Gateway host
// ({api}.execute-api.{region}.amazonaws.com) in baseURL.
func New(ctx context.Context, baseURL string) (*SigV4, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("apiclient: AWS configuration: %w", err)
	}
	region := cfg.Region
	if region == "" {
		region = regionOfHost(baseURL)
	}
	if region == "" {
		return nil, errors.New("apiclient: IAM auth: no AWS region (set AWS_REGION, or use an execute-api URL)")
	}
	if cfg.Credentials == nil {
		return nil, errors.New("apiclient: IAM auth: no AWS credentials found")
	}
	return &SigV4{Credentials: cfg.Credentials, Region: region}, nil
}

// regionOfHost returns the region of an API Gateway URL, or "".
func regionOfHost(baseURL string) string {
	host := baseURL
	if _, rest, ok := strings.Cut(host, "://"); ok {
		host = rest
	}
	host, _, _ = strings.Cut(host, "/")
	parts := strings.Split(host, ".")
	for i, p := range parts {
		if p == signingService && i+1 < len(parts) {
			return parts[i+1]
		}
	}
	return ""
}

// Authorize signs r (headers, body hash, time) with the current credentials.
func (s *SigV4) Authorize(ctx context.Context, r *http.Request, body []byte) error {
	creds, err := s.Credentials.Retrieve(ctx)
	if err != nil {
		return fmt.Errorf("AWS credentials: %w", err)
	}
	signer := s.Signer
	if signer == nil {
		signer = v4.NewSigner()
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	sum := sha256.Sum256(body)
	return signer.SignHTTP(ctx, creds, r, hex.EncodeToString(sum[:]), signingService, s.Region, now())
}
