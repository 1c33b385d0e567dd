package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestMain builds the sandkeep binary once (clitest.Binary) and removes it at the end.
//
// Every test of this package calls t.Parallel() first (TestEveryTestIsParallel checks it):
// most of them wait on real processes, not the CPU, so up to 8 run side by side (unless
// go test is given -parallel). A test is parallel-safe when it shares nothing
// with the others: each starts its own `sandkeep dev` (clitest.StartDev: a free port, its
// own sandbox directory; eachBackend does it per backend, its subtests parallel too), its
// own table (backends, dynamotest.FreshTable), and gives a child process its environment
// through clitest.Start's env — never t.Setenv or os.Setenv, which t.Parallel forbids.
func TestMain(m *testing.M) { clitest.MainParallel(m, 8) }

// TestEveryTestIsParallel fails for a test function of this package whose first statement
// is not t.Parallel(): one serial process test costs the whole package its wait.
func TestEveryTestIsParallel(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" ||
				fn.Type.Params == nil || len(fn.Type.Params.List) != 1 || len(fn.Type.Params.List[0].Names) != 1 {
				continue
			}
			checked++
			param := fn.Type.Params.List[0].Names[0].Name
			if !callsParallelFirst(fn.Body, param) {
				t.Errorf("%s: %s does not call %s.Parallel() first (see TestMain)", fset.Position(fn.Pos()), fn.Name.Name, param)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked only %d test functions", checked)
	}
}

// callsParallelFirst reports whether body's first statement is param.Parallel().
func callsParallelFirst(body *ast.BlockStmt, param string) bool {
	if body == nil || len(body.List) == 0 {
		return false
	}
	es, ok := body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Parallel" {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == param
}

// backend is one store `sandkeep dev` can serve from.
type backend struct {
	name string
	args func(t *testing.T) []string
}

// backends are the in-memory store and a fresh dynalite table (each proof runs on both).
var backends = []backend{
	{"memory", func(*testing.T) []string { return nil }},
	{"dynalite", func(t *testing.T) []string {
		endpoint := dynamotest.Endpoint(t)
		table := dynamotest.TableName()
		dynamotest.DropAtEnd(t, dynamotest.NewClient(endpoint), table)
		return []string{"--dynamodb-endpoint", endpoint, "--table", table}
	}},
}

// eachBackend runs fn against a `sandkeep dev` process on each backend, the backends in
// parallel subtests (the pattern for a new process test: call t.Parallel(), then this).
func eachBackend(t *testing.T, fn func(t *testing.T, dev *clitest.Dev), devArgs ...string) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			dev := clitest.StartDev(t, nil, append(b.args(t), devArgs...)...)
			fn(t, dev)
		})
	}
}

// sk runs the sandkeep binary against dev and returns its exit status and output.
func sk(t *testing.T, dev *clitest.Dev, args ...string) (int, string, string) {
	t.Helper()
	return clitest.Run(t, []string{envAPI + "=" + dev.URL}, clitest.Binary(t), args...)
}

// skStart starts the sandkeep binary against dev in the background.
func skStart(t *testing.T, dev *clitest.Dev, args ...string) *clitest.Proc {
	t.Helper()
	return clitest.Start(t, []string{envAPI + "=" + dev.URL}, clitest.Binary(t), args...)
}

// parseEvents reads the event lines of run, attach or tail.
func parseEvents(t *testing.T, out string) []eventLine {
	t.Helper()
	var evs []eventLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var e eventLine
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("not an event line: %q (%v)", l, err)
		}
		evs = append(evs, e)
	}
	return evs
}

// TestTailCancelRunsGet: tail prints stored events (read only), follows to the close and
// exits with the run's status; cancel and runs get work by run id and by thread.
func TestTailCancelRunsGet(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		ctx := clitest.Context(t)
		c, err := apiclient.New(apiclient.Config{BaseURL: dev.URL})
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Start(ctx, wire.StartRequest{RunID: "run-t", ThreadID: "thread-t", Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
		if err != nil {
			t.Fatal(err)
		}
		cursor := st.Cursor
		appendN := func(from, n int) {
			var evs []wire.EventIn
			for i := from; i < from+n; i++ {
				evs = append(evs, wire.EventIn{Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
			}
			res, err := c.Append(ctx, "run-t", wire.AppendRequest{Cursor: cursor, Events: evs})
			if err != nil {
				t.Fatal(err)
			}
			cursor = res.Cursor
		}
		appendN(1, 3)

		// Without --follow: what is stored, then exit 0; flags after the run id.
		code, out, errOut := sk(t, dev, "tail", "run-t", "--after", "1")
		evs := parseEvents(t, out)
		if code != 0 || len(evs) != 2 || string(evs[0].Data) != `{"n":2}` || evs[0].Offset != 2 || evs[1].Offset != 3 {
			t.Fatalf("tail --after 1: exit %d, %q, %s", code, out, errOut)
		}

		// --follow: flags before the id; prints new events as they come, ends at the close.
		f := skStart(t, dev, "tail", "--follow", "--after", "3", "run-t")
		appendN(4, 2)
		f.WaitLines(t, 2)
		if run, err := c.GetRun(ctx, "run-t"); err != nil || run.Epoch() != 1 {
			t.Fatalf("tail took an epoch: %+v %v", run, err)
		}

		// Cancel by thread from another process; the run shows it.
		code, _, errOut = sk(t, dev, "cancel", "--thread", "thread-t")
		if code != 0 || !strings.Contains(errOut, "cancel requested for run run-t") {
			t.Fatalf("cancel --thread: exit %d, %s", code, errOut)
		}
		code, out, errOut = sk(t, dev, "runs", "get", "run-t")
		var got wire.RunResponse
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Run.RunID != "run-t" || !got.Run.Cancelled() {
			t.Fatalf("runs get: exit %d, %s %s", code, out, errOut)
		}
		if _, err := c.Finish(ctx, "run-t", wire.FinishRequest{Cursor: cursor, Status: string(contract.StatusAborted)}); err != nil {
			t.Fatal(err)
		}
		if code := f.Wait(t); code != exitAborted {
			t.Fatalf("tail --follow of an aborted run: exit %d, want %d; stderr %s", code, exitAborted, f.Stderr)
		}
		evs = parseEvents(t, f.Stdout.String())
		if len(evs) != 2 || evs[0].Offset != 4 || string(evs[1].Data) != `{"n":5}` || !strings.Contains(f.Stderr.String(), "run run-t aborted") {
			t.Fatalf("tail --follow printed %q, stderr %q", f.Stdout, f.Stderr)
		}

		// Errors name the problem: an unknown run exits 1.
		code, _, errOut = sk(t, dev, "cancel", "no-such-run")
		if code != 1 || !regexp.MustCompile(`unknown-run \(404\)`).MatchString(errOut) {
			t.Fatalf("cancel of an unknown run: exit %d, %s", code, errOut)
		}
		code, _, errOut = sk(t, dev, "tail", "run-t", "--tenant", "someone-else")
		if code != 1 || !strings.Contains(errOut, "unknown-run") {
			t.Fatalf("tail as another tenant: exit %d, %s", code, errOut)
		}
	})
}

// TestParseAPICommands: flags before or after the run id, the command after --, the API's
// default from the environment, the token never from a flag.
func TestParseAPICommands(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{envAPI: "http://127.0.0.1:9999"})
	rc, err := parseRun([]string{"--thread", "th", "--run", "r1", "--", "python3", "agent.py", "--model", "x y"}, env, nil)
	if err != nil || rc.thread != "th" || rc.runID != "r1" || rc.sandboxID != "default" || rc.provider != "local-process" ||
		rc.api.api != "http://127.0.0.1:9999" || rc.command != `'python3' 'agent.py' '--model' 'x y'` {
		t.Fatalf("run: %+v %v", rc, err)
	}
	rc, err = parseRun([]string{"--thread", "th", "--", "for i in 1 2; do echo $i; done"}, nil, nil)
	if err != nil || rc.command != "for i in 1 2; do echo $i; done" || !strings.HasPrefix(rc.runID, "run-") || rc.api.api != defaultAPI {
		t.Fatalf("run with shell text: %+v %v", rc, err)
	}
	for _, args := range [][]string{
		{"attach", "r1", "--after", "7", "--api", "http://h:1"},
		{"attach", "--after", "7", "r1", "--api", "http://h:1"},
		{"attach", "--api=http://h:1", "r1", "--after=7"},
	} {
		ac, err := parseAttach(args[0], args[1:], nil, nil)
		if err != nil || ac.runID != "r1" || ac.after != 7 || ac.api.api != "http://h:1" || ac.follow {
			t.Fatalf("%v: %+v %v", args, ac, err)
		}
	}
	tc, err := parseAttach("tail", []string{"r1", "--follow"}, nil, nil)
	if err != nil || !tc.follow || tc.after != 0 {
		t.Fatalf("tail: %+v %v", tc, err)
	}
	tc, err = parseAttach("tail", []string{"r1", "--follow", "--auth", "iam"}, envOf(map[string]string{envPushURL: "wss://push.example/prod"}), nil)
	if err != nil || tc.api.pushURL != "wss://push.example/prod" {
		t.Fatalf("tail with $%s: %+v %v", envPushURL, tc, err)
	}
	jwt := envOf(map[string]string{envToken: " eyJ.tok "})
	cc, err := parseCancel([]string{"--auth", "jwt", "r1"}, jwt, nil)
	if err != nil || cc.runID != "r1" || cc.api.token != "eyJ.tok" {
		t.Fatalf("cancel: %+v %v", cc, err)
	}

	cases := []struct {
		args []string
		env  func(string) string
		want string
	}{
		{[]string{"run", "--thread", "t"}, nil, "command after --"},
		{[]string{"run", "--", "echo"}, nil, "--thread is required"},
		{[]string{"run", "--thread", "t", "extra", "--", "echo"}, nil, `unexpected argument "extra"`},
		{[]string{"run", "--thread", "bad/id", "--", "echo"}, nil, "--thread"},
		{[]string{"run", "--thread", "t", "--auth", "jwt", "--", "echo"}, nil, "$SANDKEEP_TOKEN"},
		{[]string{"run", "--thread", "t", "--auth", "basic", "--", "echo"}, nil, "want none, iam or jwt"},
		{[]string{"run", "--thread", "t", "--api", "127.0.0.1:8080", "--", "echo"}, nil, "--api"},
		{[]string{"attach"}, nil, "exactly one RUN"},
		{[]string{"attach", "r1", "r2"}, nil, "exactly one RUN"},
		{[]string{"attach", "r1", "--after", "-1"}, nil, "non-negative"},
		{[]string{"attach", "r1", "--follow"}, nil, "-follow"},
		{[]string{"tail", "r1", "--auth", "jwt", "--tenant", "x"}, jwt, "--tenant does not apply"},
		{[]string{"tail", "r1", "--push-url", "https://h/prod"}, nil, "--push-url"},
		{[]string{"tail", "r1", "--push-url", "wss://u:p@h/prod"}, nil, "--push-url"},
		{[]string{"cancel"}, nil, "RUN id or --thread"},
		{[]string{"cancel", "r1", "--thread", "t"}, nil, "not both"},
	}
	for _, c := range cases {
		var err error
		switch c.args[0] {
		case "run":
			_, err = parseRun(c.args[1:], c.env, io.Discard)
		case "attach", "tail":
			_, err = parseAttach(c.args[0], c.args[1:], c.env, io.Discard)
		case "cancel":
			_, err = parseCancel(c.args[1:], c.env, io.Discard)
		}
		if !errors.As(err, new(*usageError)) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("sandkeep %v: %v; want a usage error mentioning %q", c.args, err, c.want)
		}
	}
	// A usage error exits 2 with the usage.
	var errOut strings.Builder
	if code := run(context.Background(), []string{"cancel"}, streams{out: io.Discard, err: &errOut}); code != 2 || !strings.Contains(errOut.String(), "usage:") {
		t.Fatalf("cancel without a run: exit %d, %q", code, errOut.String())
	}
}

// TestRunAgentRefused: an API that refuses to launch the agent (the Lambdas refuse the
// local-process provider, 501) makes `run` exit 1 naming the problem, and the run is
// failed at once instead of staying running with nothing to drive it.
func TestRunAgentRefused(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.DiscardHandler)
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{localprocess.New(t.TempDir())}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{}, Logger: quiet,
		CursorKey: []byte("refused-cursor-key-0123456789abcdef"), HostProviders: []string{"local-process"}}))
	t.Cleanup(srv.Close)
	code, _, errOut := clitest.Run(t, clitest.HostEnv(srv.URL), clitest.Binary(t), "run", "--thread", "th", "--run", "run-refused", "--", "echo hi")
	if code != 1 || !strings.Contains(errOut, "unsupported (501)") || !strings.Contains(errOut, "run run-refused failed") {
		t.Fatalf("run with the agent refused: exit %d\n%s", code, errOut)
	}
	c, err := apiclient.New(apiclient.Config{BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.GetRun(clitest.Context(t), "run-refused")
	if err != nil || run.Status != contract.StatusFailed || run.Error == nil || run.Error.Code != "launch-failed" {
		t.Fatalf("the refused run: %+v %v", run, err)
	}
}
