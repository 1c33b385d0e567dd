package awsfn

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// metricLines returns the EMF documents of out that declare metric, each counting 1,
// failing on a malformed one (emf.Parse).
func metricLines(t *testing.T, out, metric string) []emf.Document {
	t.Helper()
	var lines []emf.Document
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		d, err := emf.Parse([]byte(l))
		switch {
		case errors.Is(err, emf.ErrNotEMF):
			continue
		case err != nil:
			t.Fatal(err)
		}
		if d.Metric != metric {
			continue
		}
		if d.Value() != 1 {
			t.Fatalf("%s: counts %v, want 1: %q", metric, d.Value(), l)
		}
		lines = append(lines, d)
	}
	return lines
}

func TestKeeperObserverLines(t *testing.T) {
	if KeeperObserver(nil) != nil {
		t.Fatal("a nil recorder must give a nil observer (nothing observed)")
	}
	buf := &syncBuffer{}
	o := KeeperObserver(emf.New(buf))
	o.LeaseLost(t.Context())
	o.ProviderError(t.Context(), ProviderDaytona, errors.New("upstream 503"))
	o.ProviderError(t.Context(), ProviderE2B, errors.New("upstream 502"))
	ll := metricLines(t, buf.String(), MetricLeaseLost)
	pe := metricLines(t, buf.String(), MetricProviderErrors)
	if len(ll) != 1 || len(ll[0].Dimensions) != 0 {
		t.Fatalf("LeaseLost lines %+v, want one without dimensions:\n%s", ll, buf.String())
	}
	if len(pe) != 2 || !slices.Equal(pe[0].Dimensions, []string{"Provider"}) || pe[0].Fields["Provider"] != ProviderDaytona || pe[1].Fields["Provider"] != ProviderE2B {
		t.Fatalf("ProviderErrors lines %+v, want one per provider with dimension Provider:\n%s", pe, buf.String())
	}
	if strings.Contains(buf.String(), "upstream") {
		t.Fatalf("a metric line carries the error text: %s", buf.String())
	}
}

// TestThrottlesCounted: a call that ends throttled after the SDK's retries writes exactly
// one Throttles line (not one per attempt); other failures and successes write none.
func TestThrottlesCounted(t *testing.T) {
	proxy := dynamotest.NewProxy("http://127.0.0.1:1") // every request below is answered by a fault
	defer proxy.Close()
	buf := &syncBuffer{}
	client := dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(3), CountThrottles(emf.New(buf)))
	get := func() error {
		_, err := client.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String("t"),
			Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "a"}, "sk": &types.AttributeValueMemberS{Value: "b"}}})
		return err
	}
	for i, f := range []dynamotest.Fault{{Kind: dynamotest.Throttle}, {Kind: dynamotest.Throttle, ProvisionedThroughput: true}} {
		proxy.Clear()
		r := proxy.Inject(f)
		err := get()
		if !IsThrottle(err) || r.Hits() != 3 {
			t.Fatalf("fault %d: %v after %d attempts, want a throttle after 3", i, err, r.Hits())
		}
		if n := len(metricLines(t, buf.String(), MetricThrottles)); n != i+1 {
			t.Fatalf("after %d throttled calls: %d Throttles lines:\n%s", i+1, n, buf.String())
		}
	}
	proxy.Clear()
	r := proxy.Inject(dynamotest.Fault{Kind: dynamotest.ServerError})
	if err := get(); err == nil || IsThrottle(err) || r.Hits() != 3 {
		t.Fatalf("server error: %v after %d attempts", err, r.Hits())
	}
	if n := len(metricLines(t, buf.String(), MetricThrottles)); n != 2 {
		t.Fatalf("a server error was counted as a throttle: %d lines", n)
	}
	// A nil recorder adds no middleware and answers the same.
	plain := dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(1), CountThrottles(nil))
	if _, err := plain.ListTables(t.Context(), &dynamodb.ListTablesInput{}); err == nil {
		t.Fatal("the fault did not fire")
	}
}

// TestAPIRecordsProviderErrorsAndThrottles drives POST /v1/runs through a built API
// function (NewAPI, as the Lambda runs it) against dynalite: a failing provider writes
// ProviderErrors{Provider=local-process}, a throttled table writes Throttles; both 503.
func TestAPIRecordsProviderErrorsAndThrottles(t *testing.T) {
	endpoint := dynamotest.Endpoint(t)
	table := dynamotest.FreshTable(t, dynamotest.Client(t))
	proxy := dynamotest.NewProxy(endpoint)
	defer proxy.Close()
	metrics := &syncBuffer{}
	rec := emf.New(metrics)
	dir := filepath.Join(t.TempDir(), "sandboxes")
	cfg := Config{Function: Resolve, Table: table, AuthMode: AuthIAM, TrustedRoles: testTrusted(t), TenantClaim: httpapi.DefaultTenantClaim,
		CursorKey: []byte("metrics test cursor key, 32 byte"), Provider: ProviderLocalProcess, SandboxDir: dir,
		LockLease: 15 * time.Second, DriverLease: time.Minute, LogRetention: time.Hour}
	api, err := NewAPI(cfg, Deps{
		DynamoDB: dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(2), CountThrottles(rec)),
		Logger:   NewLogger(&syncBuffer{}, ""), Metrics: rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := func(run string) int {
		body := map[string]any{"runId": run, "threadId": "th-" + run, "sandbox": map[string]any{"id": "s", "provider": ProviderLocalProcess}}
		resp, _ := call(t, api, event("POST", "POST /v1/runs", "/v1/runs", "", body, map[string]string{httpapi.TenantHeader: "acme"}, nil))
		return resp.StatusCode
	}
	// The provider cannot create: its directory became a file.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st := start("r1"); st != 503 {
		t.Fatalf("start with a failing provider: %d, want 503", st)
	}
	pe := metricLines(t, metrics.String(), MetricProviderErrors)
	if len(pe) != 1 || pe[0].Fields["Provider"] != ProviderLocalProcess {
		t.Fatalf("ProviderErrors lines %+v:\n%s", pe, metrics.String())
	}
	if n := len(metricLines(t, metrics.String(), MetricThrottles)); n != 0 {
		t.Fatalf("%d Throttles lines without a throttle", n)
	}
	// The table throttles every call.
	r := proxy.Inject(dynamotest.Fault{Kind: dynamotest.Throttle})
	if st := start("r2"); st != 503 {
		t.Fatalf("start on a throttled table: %d, want 503", st)
	}
	if n := len(metricLines(t, metrics.String(), MetricThrottles)); n == 0 || int64(n)*2 != r.Hits() {
		t.Fatalf("%d Throttles lines for %d throttled attempts (2 per call):\n%s", n, r.Hits(), metrics.String())
	}
	if n := len(metricLines(t, metrics.String(), MetricProviderErrors)); n != 1 {
		t.Fatalf("a throttle was counted as a provider error: %d lines", n)
	}
}
