package apiclient_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/apiclient/sigv4auth"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/pushtest"
)

// iamConnect is a stand-in of an IAM-authorized API Gateway WebSocket API in front of the
// real push protocol: its $connect (the stage path /dev) verifies the upgrade's SigV4
// signature with pushtest.Verifier — the known test credentials, execute-api, the region,
// the time, and the tenant header among the signed ones — refuses one that does not
// verify with 403, and serves an accepted one as the signed header's tenant (as the push
// function takes it from a trusted role's $connect). Everything else is the HTTP API (dev
// auth: the HTTP calls' signatures are sigv4auth's TestSigV4).
type iamConnect struct {
	*httptest.Server
	mu       sync.Mutex
	accepted int
	refused  []error
}

func newIAMConnect(t *testing.T) (*iamConnect, *keeper.Keeper) {
	t.Helper()
	k, quiet := newKeeper(t, memstore.New())
	creds, err := pushtest.Credentials().Retrieve(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	verifier := pushtest.Verifier{Credentials: creds, Region: pushtest.Region, Signed: []string{strings.ToLower(apiclient.TenantHeader)}}
	dev := httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{}, CursorKey: []byte("0123456789abcdef0123456789abcdef"),
		Logger: quiet, Push: &httpapi.PushConfig{}})
	s := &iamConnect{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/"+pushtest.Stage {
			dev.ServeHTTP(w, r)
			return
		}
		if err := verifier.Verify(r, nil); err != nil {
			s.mu.Lock()
			s.refused = append(s.refused, err)
			s.mu.Unlock()
			http.Error(w, `{"message":"Forbidden"}`, http.StatusForbidden)
			return
		}
		s.mu.Lock()
		s.accepted++
		s.mu.Unlock()
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawQuery, r2.Host = wire.SubscribePath, "", "127.0.0.1"
		dev.ServeHTTP(w, r2)
	}))
	t.Cleanup(func() { k.Drain(); s.Close() })
	return s, k
}

func (s *iamConnect) counts() (accepted int, refused []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, append([]error(nil), s.refused...)
}

// resigned is a broken signer: it signs what mangle makes of a copy of the request with
// the right key and copies the signature onto the request sent.
type resigned struct {
	good   *sigv4auth.SigV4
	mangle func(*http.Request)
}

func (b resigned) Authorize(ctx context.Context, r *http.Request, body []byte) error {
	c := r.Clone(ctx)
	u := *r.URL
	c.URL = &u
	b.mangle(c)
	if err := b.good.Authorize(ctx, c, body); err != nil {
		return err
	}
	for _, h := range []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token"} {
		if v := c.Header.Get(h); v != "" {
			r.Header.Set(h, v)
		}
	}
	return nil
}

// unsigned is a signer that signs nothing.
type unsigned struct{}

func (unsigned) Authorize(context.Context, *http.Request, []byte) error { return nil }

// TestSubscribeSigV4Upgrade: a SigV4 client given a push URL signs its upgrade as the GET
// it is, and a stand-in of API Gateway's IAM-authorized $connect verifies it with the AWS
// SDK's signer (iamConnect): the subscription runs over push, every event once, in order,
// then the close. Broken signers built here — signing another host, another path, another
// query, another region, another service, ten minutes ago, without the tenant header, or
// not at all — are refused by the same verifier (so its comparison can fail), and those
// subscriptions read by long polls instead.
func TestSubscribeSigV4Upgrade(t *testing.T) {
	t.Parallel()
	srv, _ := newIAMConnect(t)
	pushURL := "ws" + strings.TrimPrefix(srv.URL, "http") + "/" + pushtest.Stage
	good := &sigv4auth.SigV4{Credentials: pushtest.Credentials(), Region: pushtest.Region}
	writer := newClient(t, apiclient.Config{BaseURL: srv.URL, Tenant: "acme"})

	t.Run("signed", func(t *testing.T) {
		w := newWriter(t, writer, "run-a")
		w.append("run-a", 3)
		c := newClient(t, apiclient.Config{BaseURL: srv.URL, Tenant: "acme", PushURL: pushURL, Auth: good})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		sub := c.Subscribe(ctx, map[string]int64{"run-a": 0})
		defer sub.Close()
		wrote := make(chan struct{})
		first := make(chan struct{})
		var once sync.Once
		go func() {
			defer close(wrote)
			<-first // appends after the subscription delivered: they travel over push
			w.append("run-a", 2)
			w.finish("run-a")
		}()
		got, err := drain(ctx, sub, func(apiclient.Update) { once.Do(func() { close(first) }) }, nil)
		once.Do(func() { close(first) })
		<-wrote
		if err != nil {
			t.Fatal(err)
		}
		wantRange(t, "run-a", got.offsets["run-a"], 0, 5)
		accepted, refused := srv.counts()
		if sub.Via() != apiclient.ViaPush || accepted != 1 || len(refused) != 0 {
			t.Fatalf("via %s, %d upgrades accepted, refused %v", sub.Via(), accepted, refused)
		}
	})

	broken := map[string]apiclient.Authorizer{
		"another host":     resigned{good, func(r *http.Request) { r.URL.Host, r.Host = "abc123.execute-api.us-east-1.amazonaws.com", "" }},
		"another path":     resigned{good, func(r *http.Request) { r.URL.Path = "/prod" }},
		"another query":    resigned{good, func(r *http.Request) { r.URL.RawQuery = "tenant=other" }},
		"no tenant signed": resigned{good, func(r *http.Request) { r.Header.Del(apiclient.TenantHeader) }},
		"another region":   &sigv4auth.SigV4{Credentials: pushtest.Credentials(), Region: "eu-west-1"},
		"another secret": &sigv4auth.SigV4{Credentials: aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: pushtest.AccessKey, SecretAccessKey: "not the secret"}, nil
		})), Region: pushtest.Region},
		"ten minutes ago": &sigv4auth.SigV4{Credentials: pushtest.Credentials(), Region: pushtest.Region,
			Now: func() time.Time { return time.Now().Add(-10 * time.Minute) }},
		"another service": serviceSigner{"s3"},
		"not signed":      unsigned{},
	}
	for name, auth := range broken {
		t.Run(name, func(t *testing.T) {
			run := "run-" + strings.ReplaceAll(name, " ", "-")
			w := newWriter(t, writer, run)
			w.append(run, 3)
			w.finish(run)
			acceptedBefore, before := srv.counts()
			c := newClient(t, apiclient.Config{BaseURL: srv.URL, Tenant: "acme", PushURL: pushURL, Auth: auth})
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			sub := c.Subscribe(ctx, map[string]int64{run: 0})
			defer sub.Close()
			got, err := drain(ctx, sub, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantRange(t, run, got.offsets[run], 0, 3)
			accepted, refused := srv.counts()
			if sub.Via() != apiclient.ViaPoll || accepted != acceptedBefore || len(refused) != len(before)+1 ||
				!errors.Is(refused[len(refused)-1], pushtest.ErrSignature) {
				t.Fatalf("via %s, %d upgrades accepted (%d before), refused %v", sub.Via(), accepted, acceptedBefore, refused[len(before):])
			}
			t.Logf("refused: %v", refused[len(refused)-1])
		})
	}
}

// serviceSigner signs with the right key and region for another service.
type serviceSigner struct{ service string }

func (s serviceSigner) Authorize(ctx context.Context, r *http.Request, body []byte) error {
	creds, err := pushtest.Credentials().Retrieve(ctx)
	if err != nil {
		return err
	}
	const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	if len(body) != 0 {
		return errors.New("serviceSigner signs bodiless requests only")
	}
	return v4.NewSigner().SignHTTP(ctx, creds, r, emptySHA256, s.service, pushtest.Region, time.Now())
}
