package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

// outBuffer is a goroutine-safe writer that can be polled for a pattern.
type outBuffer struct{ syncbuf.Buffer }

// waitFor polls until re matches the output, failing after a deadline.
func (o *outBuffer) waitFor(t *testing.T, re *regexp.Regexp, what string) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(o.String()); m != nil {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %s within the deadline; output:\n%s", what, o.String())
	return nil
}

var listeningRE = regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)\n`)

// startDev runs the dev command in the background and returns its base URL and a stop
// function that cancels it and returns its exit status.
func startDev(t *testing.T, args ...string) (base string, out, errOut *outBuffer, stop func() int) {
	t.Helper()
	out, errOut = &outBuffer{}, &outBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"dev", "--addr", "127.0.0.1:0", "--sandbox-dir", t.TempDir()}, args...),
			streams{out: out, err: errOut})
	}()
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("dev did not shut down within 30 s")
			}
		})
		return code
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		// The whole banner, not just its first line: a test reads the backend line
		// ("(created)") right away, and parallel tests let dev print it a moment later.
		if m := listeningRE.FindStringSubmatch(out.String()); m != nil && strings.Contains(out.String(), "\nbackend: ") {
			return m[1], out, errOut, stop
		}
		select {
		case c := <-done:
			t.Fatalf("dev exited with %d before listening:\n%s\n%s", c, out.String(), errOut.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("dev printed no listening line:\n%s\n%s", out.String(), errOut.String())
	return
}

func postJSON(t *testing.T, url, body string) (int, map[string]any, http.Header) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m, resp.Header
}

func TestDevSmoke(t *testing.T) {
	t.Parallel()
	base, out, errOut, stop := startDev(t, "--reap-every", "20ms")
	if !strings.Contains(out.String(), "curl -s -X POST "+base+"/v1/runs") {
		t.Fatalf("no copy-paste curl example for %s:\n%s", base, out.String())
	}
	status, body, hdr := postJSON(t, base+"/v1/runs",
		`{"runId":"run-1","threadId":"thread-1","sandbox":{"id":"default","provider":"local-process"}}`)
	if status != 200 || body["outcome"] != "created" || body["cursor"] == "" || hdr.Get("X-Request-Id") == "" {
		t.Fatalf("start: %d %v", status, body)
	}
	resp, err := http.Get(base + "/v1/runs/run-1")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Run struct{ RunID, Status string }
	}
	_ = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != 200 || got.Run.RunID != "run-1" || got.Run.Status != "running" {
		t.Fatalf("get: %d %+v", resp.StatusCode, got)
	}
	// Another tenant does not see it.
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/runs/run-1", nil)
	req.Header.Set("X-Sandkeep-Tenant", "someone-else")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("other tenant: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	// The printed example is copy-paste ready: run its first command through a shell.
	if _, err := exec.LookPath("curl"); err == nil {
		example := out.String()[strings.Index(out.String(), "curl -s -X POST"):]
		first := strings.SplitN(example, "\n  curl -s "+base+"/v1/runs/run-1", 2)[0]
		first = strings.Replace(first, `"runId":"run-1"`, `"runId":"run-from-example"`, 1)
		cmdOut, err := exec.Command("sh", "-c", first).Output()
		if err != nil {
			t.Fatalf("the printed curl example fails: %v\n%s", err, first)
		}
		var m map[string]any
		if json.Unmarshal(cmdOut, &m) != nil || m["outcome"] != "taken-over" && m["outcome"] != "resumed" && m["outcome"] != "created" {
			t.Fatalf("printed curl example answered %s", cmdOut)
		}
	} else {
		t.Log("curl not on PATH: the printed example was not executed")
	}

	// The reaper ticker runs real sweeps: each logs its one JSON report line.
	errOut.waitFor(t, regexp.MustCompile(`"msg":"reap","report":\{"considered":`), "reaper tick")
	// The request log is JSON with the route pattern, and never holds a cursor.
	errOut.waitFor(t, regexp.MustCompile(`"route":"POST /v1/runs".*"status":200`), "request log line")
	if c, _ := body["cursor"].(string); c == "" || strings.Contains(errOut.String(), c) {
		t.Fatalf("cursor missing from the response or present in the log")
	}

	if code := stop(); code != 0 {
		t.Fatalf("dev exit status %d after cancel:\n%s", code, errOut.String())
	}
	if _, err := http.Get(base + "/v1/runs/run-1"); err == nil {
		t.Fatal("the server still answers after shutdown")
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "no command"},
		{[]string{"serve"}, 2, "unknown command"},
		{[]string{"dev", "--addr", "0.0.0.0:8080"}, 2, "loopback only"},
		{[]string{"dev", "--addr", "192.0.2.1:0"}, 2, "loopback only"},
		{[]string{"dev", "--addr", "nonsense"}, 2, "--addr"},
		{[]string{"dev", "--reap-every", "0s"}, 2, "--reap-every"},
		{[]string{"dev", "--driver-lease", "1s"}, 2, "--driver-lease must be at least 3s"},
		{[]string{"dev", "--detached-ttl", "-1m"}, 2, "--detached-ttl"},
		{[]string{"dev", "--dynamodb-endpoint", "http://127.0.0.1:1"}, 2, "needs --table"},
		{[]string{"dev", "extra"}, 2, "unexpected argument"},
		{[]string{"dev", "--bogus"}, 2, "bogus"},
		{[]string{"table", "create"}, 2, "--table is required"},
		{[]string{"runs", "get", "--tenant", "t", "--table", "x"}, 2, "exactly one RUN_ID"},
		{[]string{"runs", "get", "r1", "--table", "x"}, 2, "--tenant is required"},
		{[]string{"runs", "get", "r1", "--tenant", "t", "--dynamodb-endpoint", "http://x"}, 2, "--table is required"},
		{[]string{"dev", "-h"}, 0, "usage:"},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := run(context.Background(), c.args, streams{out: &out, err: &errOut})
		if code != c.code || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("sandkeep %v: exit %d, stderr %q; want exit %d mentioning %q", c.args, code, errOut.String(), c.code, c.want)
		}
	}
}

func TestParseRunsGetFlagsAfterID(t *testing.T) {
	t.Parallel()
	cfg, err := parseRunsGet([]string{"run-7", "--tenant", "acme", "--table", "tb", "--dynamodb-endpoint", "http://x"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.runID != "run-7" || !cfg.direct || cfg.api.tenant != "acme" || cfg.dynamo.table != "tb" || cfg.dynamo.endpoint != "http://x" {
		t.Fatalf("parsed %+v", cfg)
	}
	if got := storeTenant("user@example.com"); !strings.HasPrefix(got, "t_") || storeTenant(got) != got {
		t.Fatalf("storeTenant maps %q, and a stored tenant must be kept as is", got)
	}
}

// TestReapLoopTicks runs the ticker on synctest's fake clock: one sweep per period, none
// after the context ends, and a failing sweep does not stop the loop.
func TestReapLoopTicks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		reap := func(ctx context.Context) error {
			if calls.Add(1) == 2 {
				return errors.New("sweep failed")
			}
			return nil
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		var logs bytes.Buffer
		go func() {
			reapLoop(ctx, 30*time.Second, reap, slog.New(slog.NewJSONHandler(&logs, nil)))
			close(done)
		}()
		time.Sleep(95 * time.Second)
		synctest.Wait()
		if n := calls.Load(); n != 3 {
			t.Fatalf("%d sweeps in 95 s at a 30 s period, want 3", n)
		}
		if !strings.Contains(logs.String(), "sweep failed") {
			t.Fatalf("failed sweep not logged: %s", logs.String())
		}
		cancel()
		<-done
		time.Sleep(time.Minute)
		if n := calls.Load(); n != 3 {
			t.Fatalf("%d sweeps after the loop ended, want 3", n)
		}
	})
}

// TestDevOnDynamoDB runs dev against the local DynamoDB: it creates the missing table,
// serves a start, and `runs get` reads the run back from the table.
func TestDevOnDynamoDB(t *testing.T) {
	t.Parallel()
	endpoint := dynamotest.Endpoint(t)
	client := dynamotest.NewClient(endpoint)
	table := dynamotest.TableName()
	dynamotest.DropAtEnd(t, client, table)
	base, out, _, stop := startDev(t, "--dynamodb-endpoint", endpoint, "--table", table)
	if !strings.Contains(out.String(), "(created)") {
		t.Fatalf("dev did not report creating the table:\n%s", out.String())
	}
	status, body, _ := postJSON(t, base+"/v1/runs",
		`{"runId":"run-d","threadId":"thread-d","sandbox":{"id":"default","provider":"local-process"}}`)
	if status != 200 || body["outcome"] != "created" {
		t.Fatalf("start on DynamoDB: %d %v", status, body)
	}
	if code := stop(); code != 0 {
		t.Fatalf("dev exit %d", code)
	}

	var o, e bytes.Buffer
	if code := run(context.Background(), []string{"runs", "get", "run-d", "--tenant", "local",
		"--dynamodb-endpoint", endpoint, "--table", table}, streams{out: &o, err: &e}); code != 0 {
		t.Fatalf("runs get: exit %d: %s", code, e.String())
	}
	var got runGetOutput
	if err := json.Unmarshal(o.Bytes(), &got); err != nil || got.Tenant != "local" || got.Run.RunID != "run-d" ||
		got.Run.Epoch() != 1 || got.Run.LeaseUntil == 0 {
		t.Fatalf("runs get printed %s (%v)", o.String(), err)
	}
	o.Reset()
	e.Reset()
	if code := run(context.Background(), []string{"runs", "get", "run-d", "--tenant", "other",
		"--dynamodb-endpoint", endpoint, "--table", table}, streams{out: &o, err: &e}); code != 1 || !strings.Contains(e.String(), "not found") {
		t.Fatalf("runs get of another tenant: exit %d, %s", code, e.String())
	}

	// table create on an existing table leaves it alone.
	o.Reset()
	if code := run(context.Background(), []string{"table", "create", "--dynamodb-endpoint", endpoint, "--table", table},
		streams{out: &o, err: &e}); code != 0 || !strings.Contains(o.String(), "already exists") {
		t.Fatalf("table create on an existing table: exit %d, %s %s", code, o.String(), e.String())
	}
}

func TestTableCreate(t *testing.T) {
	t.Parallel()
	endpoint := dynamotest.Endpoint(t)
	client := dynamotest.NewClient(endpoint)
	table := dynamotest.TableName()
	dynamotest.DropAtEnd(t, client, table)
	var o, e bytes.Buffer
	if code := run(context.Background(), []string{"table", "create", "--dynamodb-endpoint", endpoint, "--table", table},
		streams{out: &o, err: &e}); code != 0 || !strings.Contains(o.String(), "created table") {
		t.Fatalf("table create: exit %d, %s %s", code, o.String(), e.String())
	}
	d, err := client.DescribeTable(context.Background(), &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil || string(d.Table.TableStatus) != "ACTIVE" || len(d.Table.GlobalSecondaryIndexes) == 0 {
		t.Fatalf("table after create: %+v %v", d, err)
	}

	// A table of that name with another schema is refused, naming the difference.
	other := dynamotest.TableName()
	dynamotest.DropAtEnd(t, client, other)
	in := dynamostore.CreateTableInput(other)
	in.GlobalSecondaryIndexes = in.GlobalSecondaryIndexes[1:]
	if _, err := client.CreateTable(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	o.Reset()
	e.Reset()
	missing := *dynamostore.CreateTableInput(other).GlobalSecondaryIndexes[0].IndexName
	if code := run(context.Background(), []string{"table", "create", "--dynamodb-endpoint", endpoint, "--table", other},
		streams{out: &o, err: &e}); code != 1 || !strings.Contains(e.String(), "index "+missing+" is missing") {
		t.Fatalf("table create over a table with another schema: exit %d, %s %s", code, o.String(), e.String())
	}
}
