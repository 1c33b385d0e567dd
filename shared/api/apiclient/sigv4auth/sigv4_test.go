package sigv4auth_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/apiclient/sigv4auth"
)

// TestSigV4: every attempt carries an execute-api signature that verifies: the server
// re-signs the request it received with the same key and time and gets the same header.
func TestSigV4(t *testing.T) {
	creds := credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "")
	fixed := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var checked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got := r.Header.Get("Authorization")
		want := r.Clone(r.Context())
		want.Header.Del("Authorization")
		want.Header.Del("X-Amz-Date")
		want.Header.Del("Accept-Encoding")
		want.Header.Del("User-Agent")
		want.Header.Del("Content-Length")
		want.URL.Scheme, want.URL.Host = "http", r.Host
		s := sigv4auth.SigV4{Credentials: creds, Region: "eu-west-1", Now: func() time.Time { return fixed }}
		if err := s.Authorize(r.Context(), want, body); err != nil {
			t.Error(err)
		}
		if !strings.HasPrefix(got, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261201/eu-west-1/execute-api/aws4_request") || got != want.Header.Get("Authorization") {
			t.Errorf("signature\n got %s\nwant %s", got, want.Header.Get("Authorization"))
		}
		if r.Header.Get(apiclient.TenantHeader) != "acme" {
			t.Errorf("tenant header %q", r.Header.Get(apiclient.TenantHeader))
		}
		checked.Add(1)
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"run":{"runId":"run-1","threadId":"t","status":"running","startedAt":1}}`)
	}))
	t.Cleanup(srv.Close)
	c, err := apiclient.New(apiclient.Config{BaseURL: srv.URL, Tenant: "acme",
		Auth: &sigv4auth.SigV4{Credentials: creds, Region: "eu-west-1", Now: func() time.Time { return fixed }}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(context.Background(), "run-1"); err != nil || checked.Load() != 1 {
		t.Fatalf("cancel: %v (%d checked)", err, checked.Load())
	}
	// A wrong secret gives another signature (the comparison above can fail).
	bad := sigv4auth.SigV4{Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "other", ""), Region: "eu-west-1", Now: func() time.Time { return fixed }}
	good := sigv4auth.SigV4{Credentials: creds, Region: "eu-west-1", Now: func() time.Time { return fixed }}
	r1, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/runs/run-1/cancel", nil)
	r2, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/runs/run-1/cancel", nil)
	_ = bad.Authorize(context.Background(), r1, []byte("{}"))
	_ = good.Authorize(context.Background(), r2, []byte("{}"))
	if r1.Header.Get("Authorization") == r2.Header.Get("Authorization") {
		t.Fatal("signatures of two secrets are equal")
	}
}

// TestNew: the default credential chain and a region taken from the API's host.
func TestNew(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	s, err := sigv4auth.New(context.Background(), "https://abc123.execute-api.ap-south-1.amazonaws.com/prod")
	if err != nil || s.Region != "ap-south-1" {
		t.Fatalf("New: %+v %v", s, err)
	}
	c, err := s.Credentials.Retrieve(context.Background())
	if err != nil || c.AccessKeyID != "AKIDENV" {
		t.Fatalf("credentials %+v %v", c, err)
	}
	if _, err := sigv4auth.New(context.Background(), "http://127.0.0.1:8080"); err == nil || !strings.Contains(err.Error(), "region") {
		t.Fatalf("no region: %v", err)
	}
}
