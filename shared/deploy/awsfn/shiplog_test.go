package awsfn

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/manualclock"
)

// stdout is a function's output split as CloudWatch Logs receives it: its JSON log lines
// and its EMF documents (every one checked valid).
type stdout struct {
	logs []map[string]any
	emf  []emf.Document
}

func splitStdout(t *testing.T, out string) stdout {
	t.Helper()
	var s stdout
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		if _, ok := m["_aws"]; !ok {
			s.logs = append(s.logs, m)
			continue
		}
		e, err := emf.Parse([]byte(l))
		if err != nil {
			t.Fatal(err)
		}
		s.emf = append(s.emf, e)
	}
	return s
}

// requests returns the Requests documents of s as "route status=value@timestamp".
func (s stdout) requests() []string {
	var out []string
	for _, e := range s.emf {
		if e.Metric == "Requests" {
			out = append(out, fmt.Sprintf("%s %s=%v@%d", e.Dim("Route"), e.Dim("Status"), e.Value(), e.Timestamp))
		}
	}
	return out
}

// shipLineBudget bounds each EMF document a minute's sums write (one per route and status).
const shipLineBudget = 400

// TestShipRequestsWriteAlmostNothing drives the Ship function as deployed (NewAPI, its
// logger at INFO as template.yaml sets it, its metrics and log on one stdout) behind its
// function URL on dynalite: the probe and N stored batches in one minute write 0 bytes;
// the next minute's first request writes that minute's sums, one EMF document of at most
// shipLineBudget bytes per route and status, timestamped at the minute; a refused request
// and a failing one (a throttled table: 503) write their log line, with their context, and
// their Requests datum at once.
func TestShipRequestsWriteAlmostNothing(t *testing.T) {
	const n = 30 // within the run's ship burst: the clock moves 100 ms a request
	endpoint := dynamotest.Endpoint(t)
	table := dynamotest.FreshTable(t, dynamotest.Client(t))
	proxy := dynamotest.NewProxy(endpoint)
	defer proxy.Close()
	minute := time.Now().Truncate(emf.SumPeriod).Add(emf.SumPeriod)
	clock := manualclock.New()
	clock.Set(minute.Add(time.Second))
	env := map[string]string{EnvTable: table, EnvProvider: ProviderLocalProcess, EnvSandboxDir: t.TempDir(),
		EnvCursorKey: "ship log test key, long enough!!", EnvTrustedRoleARNs: "arn:aws:iam::123456789012:role/service/app"}
	build := func(fn Function, d Deps) *API {
		cfg, err := Load(t.Context(), fn, envOf(env), nil)
		if err != nil {
			t.Fatal(err)
		}
		a, err := NewAPI(cfg, d)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	resolve := build(Resolve, Deps{DynamoDB: dynamotest.Client(t), Logger: NewLogger(io.Discard, ""), Now: clock.Now})
	out := &syncBuffer{}
	rec := emf.NewWithClock(out, clock.Now)
	ship := build(Ship, Deps{DynamoDB: dynamotest.NewClient(proxy.URL(), dynamotest.FastRetries(2), CountThrottles(rec)),
		Logger: NewLogger(out, "INFO"), Metrics: rec, Now: clock.Now})

	resp, m := call(t, resolve, event("POST", "POST /v1/runs", "/v1/runs", "",
		map[string]any{"runId": "run-l", "threadId": "thread-l", "sandbox": map[string]any{"id": "default", "provider": ProviderLocalProcess}},
		map[string]string{httpapi.TenantHeader: "acme"}, nil))
	if resp.StatusCode != 200 {
		t.Fatalf("start: %d %v", resp.StatusCode, m)
	}
	tok := shiptoken.Mint([]byte(env[EnvCursorKey]), shiptoken.Claims{Tenant: "acme", RunID: "run-l",
		Epoch: int64(m["driverEpoch"].(float64)), Expires: clock.Now().Add(time.Hour)})
	var journalText strings.Builder
	next := int64(0)
	// send ships the journal from next (as a shipper does: one byte before the stored
	// position) with line i appended.
	send := func(i int, token string) (int, map[string]any) {
		t.Helper()
		fmt.Fprintf(&journalText, "{\"n\":%d}\n", i)
		h := map[string]string{"host": "shipid.lambda-url.us-east-1.on.aws", "content-type": wire.ShipContentType, "authorization": "Bearer " + token}
		ev := lambdaevent.Request{Method: "POST", Path: "/v1/runs/run-l/ship", Query: fmt.Sprintf("src=%d", next), Header: h,
			Body: []byte(journalText.String()[next:]), RequestID: fmt.Sprintf("req%04d=", i), SourceIP: "203.0.113.9", DomainName: h["host"]}.FunctionURL()
		resp, m := call(t, ship, ev)
		if resp.StatusCode == 200 {
			next, tok = int64(m["next"].(float64)), m["token"].(string)
		}
		return resp.StatusCode, m
	}
	probe := lambdaevent.Request{Method: "GET", Path: wire.ShipProbePath, Header: map[string]string{"host": "shipid.lambda-url.us-east-1.on.aws"},
		RequestID: "probe=", DomainName: "shipid.lambda-url.us-east-1.on.aws"}.FunctionURL()
	if resp, _ := call(t, ship, probe); resp.StatusCode != 204 {
		t.Fatalf("probe: %d", resp.StatusCode)
	}
	for i := 1; i <= n; i++ {
		if code, m := send(i, tok); code != 200 || m["state"] != wire.ShipRunning {
			t.Fatalf("ship %d: %d %v", i, code, m)
		}
		clock.Set(clock.Now().Add(100 * time.Millisecond))
	}
	if out.String() != "" {
		t.Fatalf("the probe and %d stored batches in one minute wrote %d bytes, want 0:\n%s", n, len(out.String()), out)
	}

	// The next minute's first request writes the last minute's sums.
	clock.Set(minute.Add(emf.SumPeriod + time.Second))
	if code, m := send(n+1, tok); code != 200 {
		t.Fatalf("ship %d: %d %v", n+1, code, m)
	}
	got := splitStdout(t, out.String())
	want := []string{
		fmt.Sprintf("GET /v1/ship 204=1@%d", minute.UnixMilli()),
		fmt.Sprintf("POST /v1/runs/{runId}/ship 200=%d@%d", n, minute.UnixMilli()),
	}
	if len(got.logs) != 0 || len(got.emf) != 2 || fmt.Sprint(got.requests()) != fmt.Sprint(want) {
		t.Fatalf("the next minute's first request wrote %d log lines and %v, want only %v:\n%s", len(got.logs), got.requests(), want, out)
	}
	for _, l := range out.Lines() {
		if len(l)+1 > shipLineBudget {
			t.Fatalf("a sum's document is %d bytes, over the budget of %d: %s", len(l)+1, shipLineBudget, l)
		}
	}
	t.Logf("%d ship requests over two minutes wrote %d bytes (%.1f a request)", n+2, len(out.String()), float64(len(out.String()))/float64(n+2))

	// A refusal: its line and its datum at once, the held sum still held.
	base := len(out.String())
	if code, m := send(n+2, "skship1.forged.x"); code != 401 || m["code"] != "invalid-token" {
		t.Fatalf("forged token: %d %v", code, m)
	}
	got = splitStdout(t, out.String()[base:])
	if len(got.logs) != 1 || got.logs[0]["code"] != "invalid-token" || got.logs[0]["status"] != float64(401) || got.logs[0]["requestId"] == "" ||
		fmt.Sprint(got.requests()) != fmt.Sprintf("[POST /v1/runs/{runId}/ship 401=1@%d]", clock.Now().UnixMilli()) {
		t.Fatalf("a refused ship request wrote %v and %v, want its log line and its Requests datum", got.logs, got.requests())
	}

	// A failure (the table throttles every call): 503, its ERROR line with the error and the
	// run, its Requests datum and the throttle, at once.
	base = len(out.String())
	proxy.Inject(dynamotest.Fault{Kind: dynamotest.Throttle})
	if code, m := send(n+3, tok); code != 503 {
		t.Fatalf("ship on a throttled table: %d %v", code, m)
	}
	proxy.Clear()
	got = splitStdout(t, out.String()[base:])
	var errLine map[string]any
	for _, l := range got.logs {
		if l["msg"] == "request" {
			errLine = l
		}
	}
	if errLine == nil || errLine["level"] != "ERROR" || errLine["status"] != float64(503) || errLine["runId"] != "run-l" ||
		errLine["route"] != "POST /v1/runs/{runId}/ship" || !strings.Contains(fmt.Sprint(errLine["error"]), "Throttling") || errLine["requestId"] == "" {
		t.Fatalf("the failed ship request's log line %v, want ERROR with its route, run, request id and the error; all lines %v", errLine, got.logs)
	}
	if fmt.Sprint(got.requests()) != fmt.Sprintf("[POST /v1/runs/{runId}/ship 503=1@%d]", clock.Now().UnixMilli()) || len(metricLinesOf(got, MetricThrottles)) == 0 {
		t.Fatalf("the failed ship request's metrics %v, want its 503 Requests datum and Throttles:\n%s", got.requests(), out.String()[base:])
	}

	// What the minute held is written by a flush (a later minute's first record in a Lambda).
	base = len(out.String())
	rec.Flush()
	if got := splitStdout(t, out.String()[base:]); fmt.Sprint(got.requests()) != fmt.Sprintf("[POST /v1/runs/{runId}/ship 200=1@%d]", minute.Add(emf.SumPeriod).UnixMilli()) {
		t.Fatalf("the flush wrote %v, want the second minute's one stored batch", got.requests())
	}
}

// metricLinesOf returns s's documents of metric.
func metricLinesOf(s stdout, metric string) []emf.Document {
	var out []emf.Document
	for _, e := range s.emf {
		if e.Metric == metric {
			out = append(out, e)
		}
	}
	return out
}
