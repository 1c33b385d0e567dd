package samtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
	"github.com/sandkeep/sandkeep/shared/deploy/lambdaevent"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/pushtest"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

// The Runtime Interface Emulator is built from its Go module at this pseudo-version (never
// a downloaded release binary).
const (
	riePackage = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie"
	rieVersion = "v0.0.0-20261030222936-bef5c4ba774d"
)

// buildRIE installs aws-lambda-rie into a temporary GOBIN from the module proxy/cache.
func buildRIE(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("go", "install", riePackage+"@"+rieVersion)
	cmd.Dir = t.TempDir() // outside our module: `go install pkg@version` ignores go.mod anyway
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s@%s: %v\n%s", riePackage, rieVersion, err, out)
	}
	return filepath.Join(bin, "aws-lambda-rie")
}

// bootstraps holds the functions built for this machine, once per test binary: two tests
// run them, and one `go build` of all seven shares loading and links them in parallel.
var bootstraps struct {
	once sync.Once
	dir  string
	bins map[awsfn.Function]string
	err  error
}

// TestMain removes the bootstraps' directory once every test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	if bootstraps.dir != "" {
		_ = os.RemoveAll(bootstraps.dir)
	}
	os.Exit(code)
}

// buildBootstraps builds every function for this machine (the emulator runs them
// natively), with the Makefile's flags.
func buildBootstraps(t *testing.T) map[awsfn.Function]string {
	t.Helper()
	bootstraps.once.Do(func() {
		bootstraps.dir, bootstraps.err = os.MkdirTemp("", "sandkeep-bootstraps-")
		if bootstraps.err != nil {
			return
		}
		args := []string{"build", "-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w", "-o", bootstraps.dir + string(filepath.Separator)}
		bins := map[awsfn.Function]string{}
		for _, fn := range awsfn.Functions() {
			args = append(args, "./functions/"+string(fn))
			// go build -o DIR/ names each main package's binary after its directory.
			bins[fn] = filepath.Join(bootstraps.dir, string(fn))
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=-buildvcs=false")
		if b, err := cmd.CombinedOutput(); err != nil {
			bootstraps.err = fmt.Errorf("build the functions: %w\n%s", err, b)
			return
		}
		bootstraps.bins = bins
	})
	if bootstraps.err != nil {
		t.Fatal(bootstraps.err)
	}
	return bootstraps.bins
}

// freePort returns a loopback port nobody listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// emulated is one function running under its own emulator process.
type emulated struct {
	fn       awsfn.Function
	url      string
	started  time.Time
	firstRTT time.Duration // from process start to the first answer
	log      *lockedBuffer
	client   *http.Client
}

// startRIE starts the emulator for bootstrap with env, both addresses on 127.0.0.1, in
// its own process group (stopped, with the bootstrap it spawns, when the test ends).
func startRIE(t *testing.T, rie, bootstrap string, fn awsfn.Function, env []string) *emulated {
	t.Helper()
	api, rt := freePort(t), freePort(t)
	logs := &lockedBuffer{}
	cmd := exec.Command(rie,
		"--runtime-interface-emulator-address", fmt.Sprintf("127.0.0.1:%d", api),
		"--runtime-api-address", fmt.Sprintf("127.0.0.1:%d", rt),
		bootstrap)
	cmd.Dir = filepath.Dir(bootstrap)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	e := &emulated{fn: fn, url: fmt.Sprintf("http://127.0.0.1:%d/2015-03-31/functions/function/invocations", api),
		log: logs, client: &http.Client{Timeout: 40 * time.Second}}
	e.started = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(-pgid, syscall.SIGKILL) // the group we started: emulator and bootstrap
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s emulator output:\n%s", fn, logs.String())
		}
	})
	return e
}

// lockedBuffer collects a process's output; safe to read while the process writes.
type lockedBuffer = syncbuf.Buffer

// invoke sends one event and returns the raw result; the emulator must never see two
// invocations at once (it crashes), and the callers here are strictly sequential.
func (e *emulated) invoke(t *testing.T, payload any) []byte {
	t.Helper()
	b, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	first := e.firstRTT == 0
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := e.client.Post(e.url, "application/json", bytes.NewReader(b))
		if err != nil {
			// Only "not listening yet" is retried, and only before the first answer.
			var op *net.OpError
			if first && errors.As(err, &op) && time.Now().Before(deadline) {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			t.Fatalf("%s invoke: %v", e.fn, err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if first {
			e.firstRTT = time.Since(e.started)
		}
		if resp.StatusCode != http.StatusOK || bytes.Contains(out, []byte(`"errorType"`)) {
			t.Fatalf("%s invoke: HTTP %d %s", e.fn, resp.StatusCode, out)
		}
		return out
	}
}

// api sends an API Gateway event and returns the function's HTTP answer.
func (e *emulated) api(t *testing.T, method, target string, body any) (int, map[string]any) {
	t.Helper()
	p, query, _ := strings.Cut(target, "?")
	key, fn := routeOf(method, p)
	if fn != e.fn {
		t.Fatalf("%s %s belongs to %s, sent to %s", method, p, fn, e.fn)
	}
	return e.answer(t, method+" "+target, apiGatewayEvent(method, key, p, query, "acme", body, 1))
}

// answer invokes an API Gateway event and decodes the function's HTTP answer.
func (e *emulated) answer(t *testing.T, what string, ev events.APIGatewayV2HTTPRequest) (int, map[string]any) {
	t.Helper()
	out := e.invoke(t, ev)
	var resp events.APIGatewayV2HTTPResponse
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("%s: not an API Gateway response: %s", e.fn, out)
	}
	raw := []byte(resp.Body)
	if resp.IsBase64Encoded {
		var err error
		if raw, err = base64.StdEncoding.DecodeString(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %d body %q", what, resp.StatusCode, raw)
	}
	if resp.Headers["X-Request-Id"] != strings.TrimSuffix(ev.RequestContext.RequestID, "=") {
		t.Fatalf("%s: request id header %q", e.fn, resp.Headers["X-Request-Id"])
	}
	return resp.StatusCode, m
}

// ship sends a ship route's event as the Ship function's URL does (docs/design.md §9):
// routeKey $default, no identity, the token in Authorization, a raw body base64-encoded.
// It returns the status, the headers and the JSON body (nil for none).
func (e *emulated) ship(t *testing.T, method, target, token, body string) (int, map[string]string, map[string]any) {
	t.Helper()
	p, query, _ := strings.Cut(target, "?")
	key, fn := routeOf(method, p)
	if fn != e.fn {
		t.Fatalf("%s %s belongs to %s, sent to %s", method, p, fn, e.fn)
	}
	if key == "" {
		t.Fatalf("%s %s is no route", method, p)
	}
	req := lambdaevent.Request{Method: method, Path: p, Query: query, DomainName: "shipid.lambda-url.us-east-1.on.aws",
		Header: map[string]string{"host": "shipid.lambda-url.us-east-1.on.aws"}, RequestID: "req000009="}
	if token != "" {
		req.Header["authorization"] = "Bearer " + token
	}
	if body != "" {
		req.Body, req.Header["content-type"] = []byte(body), wire.ShipContentType
	}
	ev := req.FunctionURL()
	var resp events.APIGatewayV2HTTPResponse
	if out := e.invoke(t, ev); json.Unmarshal(out, &resp) != nil {
		t.Fatalf("%s: not an API Gateway response: %s", e.fn, out)
	}
	var m map[string]any
	if resp.Body != "" {
		if err := json.Unmarshal([]byte(resp.Body), &m); err != nil {
			t.Fatalf("%s %s: %d body %q", method, target, resp.StatusCode, resp.Body)
		}
	}
	return resp.StatusCode, resp.Headers, m
}

// TestFunctionsUnderRuntimeInterfaceEmulator runs each function's bootstrap under the AWS
// Lambda Runtime Interface Emulator against dynalite: real API Gateway v2 events through
// the four API functions (one request at a time), a scheduled event through the reaper,
// and the first-invoke latency after process start (reported, not judged).
func TestFunctionsUnderRuntimeInterfaceEmulator(t *testing.T) {
	t.Parallel() // builds, then waits on emulators: beside the other slow tests
	if testing.Short() {
		t.Skip("builds the emulator and five bootstraps")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the emulator runs on Linux only")
	}
	endpoint := dynamotest.Endpoint(t)
	table := dynamotest.FreshTable(t, dynamotest.Client(t))
	rie := buildRIE(t)
	boots := buildBootstraps(t)
	standin := pushtest.Start(t)
	sandboxes, err := os.MkdirTemp("/tmp", "sandkeep-rie-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sandboxes) })

	base := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(),
		// The stand-in of the push's management endpoint verifies signatures made with these.
		"AWS_REGION=" + pushtest.Region, "AWS_ACCESS_KEY_ID=" + pushtest.AccessKey, "AWS_SECRET_ACCESS_KEY=" + pushtest.SecretKey,
		"AWS_LAMBDA_FUNCTION_TIMEOUT=30", "LOG_LEVEL=error",
		awsfn.EnvTable + "=" + table, awsfn.EnvDynamoDBEndpoint + "=" + endpoint,
		awsfn.EnvProvider + "=" + awsfn.ProviderLocalProcess, awsfn.EnvSandboxDir + "=" + sandboxes,
		awsfn.EnvCursorKey + "=" + testCursorKey, awsfn.EnvAuthMode + "=" + awsfn.AuthIAM,
		awsfn.EnvTrustedRoleARNs + "=" + callerRole, awsfn.EnvDetachedTTLSeconds + "=60",
		awsfn.EnvPushEndpoint + "=" + standin.Endpoint(),
	}
	// Each emulator starts right before its first invocation, so its first-invoke latency
	// is process start + init + one request.
	started := map[awsfn.Function]*emulated{}
	fns := lazy(func(fn awsfn.Function) *emulated {
		if started[fn] == nil {
			env := base
			switch fn {
			case awsfn.Reaper:
				// As template.yaml tells it (it replaces dead shippers, docs/design.md §8.3):
				// it starts on that environment, reading the cursor key.
				env = append(slices.Clone(base), awsfn.EnvPublicURL+"=https://shipid.lambda-url.us-east-1.on.aws/")
			case awsfn.Ship:
				// As template.yaml tells it: no authentication setting at all.
				env = slices.DeleteFunc(slices.Clone(base), func(kv string) bool {
					return strings.HasPrefix(kv, awsfn.EnvAuthMode+"=") || strings.HasPrefix(kv, awsfn.EnvTrustedRoleARNs+"=")
				})
			}
			started[fn] = startRIE(t, rie, boots[fn], fn, env)
		}
		return started[fn]
	})

	// One flow across the functions, strictly sequential.
	st, s := fns.get(awsfn.Resolve).api(t, "POST", "/v1/runs", startBody("run-r", "thread-r", nil))
	if st != 200 || s["outcome"] != "created" {
		t.Fatalf("start: %d %v", st, s)
	}
	// A watcher connects to the push function (an IAM-signed $connect naming the tenant)
	// and subscribes to run-r: the log function's append below and the reaper's
	// finalization reach it through the management endpoint's stand-in, signed.
	for _, ev := range []events.APIGatewayWebsocketProxyRequest{wsEvent("$connect", "wsR=", ""), wsEvent("subscribe", "wsR=", `{"type":"subscribe","runId":"run-r"}`)} {
		if out := fns.get(awsfn.Push).invoke(t, ev); !bytes.Contains(out, []byte(`"statusCode":200`)) {
			t.Fatalf("push %s: %s", ev.RequestContext.RouteKey, out)
		}
	}
	// A second watcher subscribes and unsubscribes before the append: it is sent nothing of it.
	for _, ev := range []events.APIGatewayWebsocketProxyRequest{wsEvent("$connect", "wsU=", ""), wsEvent("subscribe", "wsU=", `{"type":"subscribe","runId":"run-r"}`),
		wsEvent("unsubscribe", "wsU=", `{"type":"unsubscribe","runId":"run-r"}`)} {
		if out := fns.get(awsfn.Push).invoke(t, ev); !bytes.Contains(out, []byte(`"statusCode":200`)) {
			t.Fatalf("push %s of wsU=: %s", ev.RequestContext.RouteKey, out)
		}
	}
	// Offsets 1–3 are the watch markers of the two subscribes and the unsubscribe
	// (docs/design.md §8.1): the append steps over them.
	st, a := fns.get(awsfn.Log).api(t, "POST", "/v1/runs/run-r/events", map[string]any{"cursor": s["cursor"], "events": []any{map[string]any{"data": "hi"}}})
	if st != 200 || a["lastOffset"] != float64(4) {
		t.Fatalf("append: %d %v", st, a)
	}
	st, r := fns.get(awsfn.Wait).api(t, "GET", "/v1/runs/run-r/events?after=0&limit=10", nil)
	if evs, _ := r["events"].([]any); st != 200 || len(evs) != 1 {
		t.Fatalf("read: %d %v", st, r)
	}
	st, h := fns.get(awsfn.Detach).api(t, "POST", "/v1/runs/run-r/heartbeat", map[string]any{"cursor": a["cursor"]})
	if st != 200 || h["cancelRequested"] != false {
		t.Fatalf("heartbeat: %d %v", st, h)
	}
	st, c := fns.get(awsfn.Cancel).api(t, "POST", "/v1/runs/run-r/cancel", map[string]any{})
	if st != 202 {
		t.Fatalf("cancel: %d %v", st, c)
	}
	st, d := fns.get(awsfn.Detach).api(t, "POST", "/v1/runs/run-r/detach", map[string]any{"cursor": a["cursor"]})
	if st != 200 {
		t.Fatalf("detach: %d %v", st, d)
	}
	// An IAM principal that is not a session of the trusted role is refused, whatever
	// tenant it names.
	admin := apiGatewayEvent("GET", "GET /v1/runs/{runId}", "/v1/runs/run-r", "", "acme", nil, 3)
	admin.RequestContext.Authorizer.IAM.UserARN = "arn:aws:sts::123456789012:assumed-role/AdministratorAccess/alice"
	if out := fns.get(awsfn.Resolve).invoke(t, admin); !bytes.Contains(out, []byte(`"statusCode":403`)) || !bytes.Contains(out, []byte(`untrusted-principal`)) {
		t.Fatalf("an administrator's session named a tenant: %s", out)
	}
	// The agent route refuses local-process (it would run on the function's own host); the
	// log function pumps a journal launched as a provider sandbox would run it, to its exit,
	// and ends the run.
	st, ag := fns.get(awsfn.Resolve).api(t, "POST", "/v1/runs/run-r/agent", map[string]any{"cursor": a["cursor"], "command": "true"})
	if st != 501 || ag["code"] != "unsupported" {
		t.Fatalf("agent on local-process: %d %v", st, ag)
	}
	st, sp := fns.get(awsfn.Resolve).api(t, "POST", "/v1/runs", startBody("run-p", "thread-p", nil))
	if st != 200 {
		t.Fatalf("start run-p: %d %v", st, sp)
	}
	psid, _ := path(sp, "sandbox", "providerSandboxId").(string)
	if _, err := journal.Launch(contract.WithTenant(t.Context(), "acme"), localprocess.New(sandboxes), psid, "", "run-p",
		`printf '{"n":1}\n{"n":2}\n'`); err != nil {
		t.Fatal(err)
	}
	cur, appended, deadline := sp["cursor"], 0.0, time.Now().Add(30*time.Second)
	for {
		st, pm := fns.get(awsfn.Wait).api(t, "POST", "/v1/runs/run-p/pump", map[string]any{"cursor": cur, "waitMs": 1000})
		if st != 200 {
			t.Fatalf("pump: %d %v", st, pm)
		}
		cur, appended = pm["cursor"], appended+pm["appended"].(float64)
		if pm["exited"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run-p never exited: %v", pm)
		}
	}
	if appended != 2 {
		t.Fatalf("pumped %v events, want 2", appended)
	}
	if st, f := fns.get(awsfn.Log).api(t, "POST", "/v1/runs/run-p/finish", map[string]any{"cursor": cur, "status": "completed"}); st != 200 {
		t.Fatalf("finish run-p: %d %v", st, f)
	}
	// A run that reports itself: its shipper reaches the Ship function's URL with no
	// authorizer (a function URL with AuthType NONE passes no identity), its ship token the
	// only credential, the journal's raw bytes base64-encoded as the URL sends a binary body.
	st, ss := fns.get(awsfn.Resolve).api(t, "POST", "/v1/runs", startBody("run-s", "thread-s", nil))
	if st != 200 {
		t.Fatalf("start run-s: %d %v", st, ss)
	}
	tok := shiptoken.Mint([]byte(testCursorKey), shiptoken.Claims{Tenant: "acme", RunID: "run-s", Epoch: int64(ss["driverEpoch"].(float64)),
		Expires: time.Now().Add(time.Hour)})
	if code, _, _ := fns.get(awsfn.Ship).ship(t, "GET", wire.ShipProbePath, "", ""); code != 204 {
		t.Fatalf("probe: %d", code)
	}
	journalText := "{\"n\":1}\n{\"n\":2}\n" + journal.SentinelLine("run-s", 3) + "\n"
	code, hd, sb := fns.get(awsfn.Ship).ship(t, "POST", "/v1/runs/run-s/ship?src=0", tok, journalText)
	if code != 200 || sb["state"] != wire.ShipExited || hd[wire.ShipStateHeader] != wire.ShipExited || hd[wire.ShipNextHeader] == "" {
		t.Fatalf("ship: %d %v %v", code, hd, sb)
	}
	if code, _, eb := fns.get(awsfn.Ship).ship(t, "POST", "/v1/runs/run-s/ship/end?code=3", sb["token"].(string), "it broke"); code != 200 || eb["status"] != "failed" {
		t.Fatalf("ship end: %d %v", code, eb)
	}
	if code, _, fb := fns.get(awsfn.Ship).ship(t, "POST", "/v1/runs/run-s/ship?src=0", "skship1.forged.x", journalText); code != 401 || fb["code"] != "invalid-token" {
		t.Fatalf("a forged token: %d %v", code, fb)
	}
	st, rs := fns.get(awsfn.Wait).api(t, "GET", "/v1/runs/run-s/events?after=0&limit=10", nil)
	if evs, _ := rs["events"].([]any); st != 200 || len(evs) != 2 || rs["closed"] != true {
		t.Fatalf("the shipped run's log: %d %v", st, rs)
	}
	st, gs := fns.get(awsfn.Resolve).api(t, "GET", "/v1/runs/run-s", nil)
	if st != 200 || path(gs, "run", "status") != "failed" || path(gs, "run", "error", "code") != "exit-3" ||
		!strings.Contains(path(gs, "run", "error", "message").(string), "it broke") {
		t.Fatalf("the shipped run: %d %v", st, gs)
	}
	// The stage URL (docs/design.md §9): a shipper the Resolve function starts in a sandbox
	// is pointed at the API as the request reached it, from API Gateway's request context
	// (domainName), never the client's Host header. An attach takes over a shipped run whose
	// shipper died and starts a new one; its probe dials the stage's address, here a TLS
	// listener that notes the name the shipper asked for (its certificate is not one curl
	// trusts, so the probe fails there and the run falls back to its host: shipping host).
	stageSNI := make(chan string, 8)
	stage := httptest.NewUnstartedServer(http.NotFoundHandler())
	stage.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes curl abandons
	stage.TLS = &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		stageSNI <- h.ServerName
		return nil, nil
	}}
	stage.StartTLS()
	t.Cleanup(stage.Close)
	st, su := fns.get(awsfn.Resolve).api(t, "POST", "/v1/runs", startBody("run-u", "thread-u", nil))
	if st != 200 {
		t.Fatalf("start run-u: %d %v", st, su)
	}
	lp := localprocess.New(sandboxes)
	launchShipperless(t, lp, path(su, "sandbox", "providerSandboxId").(string), "run-u", "sleep 30")
	domain := "localhost:" + strings.TrimPrefix(stage.URL, "https://127.0.0.1:")
	attach := apiGatewayEvent("POST", "POST /v1/runs/{runId}/attach", "/v1/runs/run-u/attach", "", "acme", nil, 1)
	attach.Headers["host"] = "evil.example" // a client's Host never names the address
	attach.RequestContext.DomainName = domain
	if st, at := fns.get(awsfn.Resolve).answer(t, "attach run-u", attach); st != 200 || at["shipping"] != "host" || at["driverEpoch"] != float64(2) {
		t.Fatalf("attach run-u: %d %v; want it taken over (epoch 2) and, the stage unreachable over TLS, shipping host", st, at)
	}
	select {
	case sni := <-stageSNI:
		if sni != "localhost" {
			t.Fatalf("the new shipper asked the stage's address for %q, want localhost (from %s)", sni, domain)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no shipper dialed the stage's address %s", domain)
	}
	// The deployed path end to end: a real shipper in the sandbox → the Ship function's URL
	// (a front that turns each request into the function URL's event for the Ship function
	// under its emulator) → dynalite → the push through the management endpoint's stand-in
	// → a subscribed watcher, every event once and in order, then closed. The launching
	// Resolve is told the URL's address as template.yaml tells it (!GetAtt
	// ShipFunctionUrl.FunctionUrl, with its trailing slash).
	var frontHosts sync.Map // the Host of every request the shipper sent the URL
	furl := shipURLFront(t, fns.get(awsfn.Ship))
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		frontHosts.Store(r.Host, true)
		furl.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	for drained := false; !drained; { // the run-u shipper's dial is noted; what follows must add none
		select {
		case <-stageSNI:
		default:
			drained = true
		}
	}
	launcher := startRIE(t, rie, boots[awsfn.Resolve], awsfn.Resolve, append(slices.Clone(base), awsfn.EnvPublicURL+"="+front.URL+"/"))
	st, se := launcher.api(t, "POST", "/v1/runs", startBody("run-e", "thread-e", nil))
	if st != 200 {
		t.Fatalf("start run-e: %d %v", st, se)
	}
	for _, ev := range []events.APIGatewayWebsocketProxyRequest{wsEvent("$connect", "wsE=", ""), wsEvent("subscribe", "wsE=", `{"type":"subscribe","runId":"run-e"}`)} {
		if out := fns.get(awsfn.Push).invoke(t, ev); !bytes.Contains(out, []byte(`"statusCode":200`)) {
			t.Fatalf("push %s of wsE=: %s", ev.RequestContext.RouteKey, out)
		}
	}
	// Its agent was launched and its shipper died; an attach through the launcher takes the
	// run over and starts a shipper that reaches the function URL (shipping sandbox) — not
	// the client's Host, nor the domain the attach request came in by.
	const shipped = 12
	launchShipperless(t, lp, path(se, "sandbox", "providerSandboxId").(string), "run-e",
		fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "{\"n\":$i}"; i=$((i+1)); sleep 0.02; done`, shipped))
	attachE := apiGatewayEvent("POST", "POST /v1/runs/{runId}/attach", "/v1/runs/run-e/attach", "", "acme", nil, 4)
	attachE.Headers["host"] = "evil.example"
	attachE.RequestContext.DomainName = domain
	if st, ae := launcher.answer(t, "attach run-e", attachE); st != 200 || ae["shipping"] != "sandbox" {
		t.Fatalf("attach run-e: %d %v; want its new shipper shipping from the sandbox", st, ae)
	}
	var got []wire.PushMessage
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got = standin.Messages(t, "wsE="); len(got) > 0 && got[len(got)-1].Type == "closed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run-e's watcher was never sent closed: %+v", got)
		}
	}
	// Every event once and in order; the agent's lines 1..12 among them.
	var offsets []int64
	var lines []string
	for _, m := range got[1 : len(got)-1] {
		for _, e := range m.Events {
			offsets = append(offsets, e.Offset)
			var v struct{ N int }
			if json.Unmarshal(e.Data, &v) == nil && v.N > 0 {
				lines = append(lines, strconv.Itoa(v.N))
			}
		}
	}
	want := make([]string, shipped)
	for i := range want {
		want[i] = strconv.Itoa(i + 1)
	}
	// The log as the Wait function reads it: the same offsets (the attach's fence holds one).
	_, re := fns.get(awsfn.Wait).api(t, "GET", "/v1/runs/run-e/events?after=0&limit=100", nil)
	var stored []int64
	for _, e := range re["events"].([]any) {
		stored = append(stored, int64(e.(map[string]any)["offset"].(float64)))
	}
	if got[0].Type != "subscribed" || !slices.Equal(offsets, stored) || !slices.Equal(lines, want) {
		t.Fatalf("run-e's watcher received offsets %v (stored %v) and lines %v in %+v; want subscribed, every stored event once, lines 1..%d, closed",
			offsets, stored, lines, got, shipped)
	}
	if st, ge := launcher.api(t, "GET", "/v1/runs/run-e", nil); st != 200 || path(ge, "run", "status") != "completed" {
		t.Fatalf("run-e after its close: %d %v", st, ge)
	}
	t.Logf("run-e: %d events pushed in %d messages through the emulated Ship function's URL", shipped, len(got)-2)
	// The shipper's last request (its end) may still be inside the Ship function's emulator,
	// which serves one invocation at a time, when the watcher has been sent closed: the
	// front's Close waits for it, so the invocations below never meet it there.
	front.Close()
	var hosts []string
	frontHosts.Range(func(k, _ any) bool { hosts = append(hosts, k.(string)); return true })
	select {
	case sni := <-stageSNI:
		t.Fatalf("run-e's shipper dialed the attach request's domain (%q): want the function URL's address alone", sni)
	default:
	}
	if want := strings.TrimPrefix(front.URL, "http://"); len(hosts) != 1 || hosts[0] != want {
		t.Fatalf("run-e's shipper reached the URL as %v, want %s alone", hosts, want)
	}
	// A route of another function is a 404 here; so is every route but the ship routes on
	// the Ship function, sent as its URL sends it or as a trusted caller's request.
	out := fns.get(awsfn.Log).invoke(t, apiGatewayEvent("POST", "POST /v1/runs", "/v1/runs", "", "acme", startBody("x", "y", nil), 2))
	if !bytes.Contains(out, []byte(`"statusCode":404`)) {
		t.Fatalf("log function served a resolve route: %s", out)
	}
	for _, ev := range []events.APIGatewayV2HTTPRequest{
		lambdaevent.Request{Method: "POST", Path: "/v1/runs", Header: map[string]string{"x-sandkeep-tenant": "acme"}, RequestID: "req000011="}.
			JSON(startBody("run-x", "thread-x", nil)).FunctionURL(),
		lambdaevent.Request{Method: "POST", Path: "/v1/runs/run-e/cancel", RequestID: "req000012="}.JSON(map[string]any{}).FunctionURL(),
		apiGatewayEvent("POST", "POST /v1/runs", "/v1/runs", "", "acme", startBody("run-x", "thread-x", nil), 13),
	} {
		if out := fns.get(awsfn.Ship).invoke(t, ev); !bytes.Contains(out, []byte(`"statusCode":404`)) || !bytes.Contains(out, []byte(`no such route on the ship function`)) {
			t.Fatalf("the Ship function served %s %s: %s", ev.RequestContext.HTTP.Method, ev.RawPath, out)
		}
	}
	if st, gx := fns.get(awsfn.Resolve).api(t, "GET", "/v1/runs/run-x", nil); st != 404 {
		t.Fatalf("a start sent to the Ship function stored run-x: %d %v", st, gx)
	}
	// The reaper expires the cancelled, detached run at once.
	rep := fns.get(awsfn.Reaper).invoke(t, map[string]any{}) // EventBridge Scheduler sends "{}" without Input
	// (Its sandbox was touched within the driver lease, so the reclaim keeps it: in-use.)
	var report struct {
		Runs []struct{ RunID, Outcome, Status string } `json:"runs"`
	}
	if err := json.Unmarshal(rep, &report); err != nil || len(report.Runs) != 1 || report.Runs[0].RunID != "run-r" ||
		report.Runs[0].Status != "aborted" || (report.Runs[0].Outcome != "expired" && report.Runs[0].Outcome != "in-use") {
		t.Fatalf("reaper report: %s (%v)", rep, err)
	}
	// The watcher received subscribed, the append (once, right after it returned) and,
	// from the reaper, the close; every post verified as SigV4 for execute-api.
	msgs := standin.Messages(t, "wsR=")
	if len(msgs) != 3 || msgs[0].Type != "subscribed" || msgs[1].Type != "events" || len(msgs[1].Events) != 1 ||
		msgs[1].Events[0].Offset != 4 || string(msgs[1].Events[0].Data) != `"hi"` || msgs[2].Type != "closed" || len(standin.Refused()) != 0 {
		t.Fatalf("the watcher of run-r received %+v (refused %v)", msgs, standin.Refused())
	}
	// The unsubscribed watcher got its subscribed and nothing after. Once $disconnect removed
	// its connection, a message on it is answered that the connection is not open.
	for _, ev := range []events.APIGatewayWebsocketProxyRequest{wsEvent("$disconnect", "wsU=", ""), wsEvent("subscribe", "wsU=", `{"type":"subscribe","runId":"run-r"}`)} {
		if out := fns.get(awsfn.Push).invoke(t, ev); !bytes.Contains(out, []byte(`"statusCode":200`)) {
			t.Fatalf("push %s of wsU=: %s", ev.RequestContext.RouteKey, out)
		}
	}
	if u := standin.Messages(t, "wsU="); len(u) != 2 || u[0].Type != "subscribed" || u[1].Type != "error" || u[1].Problem == nil || u[1].Problem.Code != wire.CodeUnavailable {
		t.Fatalf("the watcher that unsubscribed, then disconnected, received %+v", u)
	}
	st, g := fns.get(awsfn.Resolve).api(t, "GET", "/v1/runs/run-r", nil)
	if st != 200 || path(g, "run", "status") != "aborted" {
		t.Fatalf("after the sweep: %d %v", st, g)
	}
	// The functions log JSON lines carrying both request ids, and EMF metric lines.
	out = []byte(started[awsfn.Resolve].log.String())
	if !bytes.Contains(out, []byte(`"requestId":"req000001"`)) || !bytes.Contains(out, []byte(`"awsRequestId":"`)) ||
		!bytes.Contains(out, []byte(`"Requests":1,"Route":"POST /v1/runs","Status":"200"`)) {
		t.Errorf("resolve's output lacks its JSON request line or its Requests metric:\n%s", out)
	}
	// The same deployment's push as a JWT deployment serves it (docs/design.md §8.1).
	t.Run("JWT push ticket", func(t *testing.T) { jwtPushUnderEmulator(t, rie, boots, base, standin, table) })
	for _, fn := range awsfn.Functions() {
		if started[fn] != nil {
			t.Logf("%s: first invoke answered %s after the emulator process started", fn.LogicalID(), started[fn].firstRTT.Round(100*time.Microsecond))
		}
	}
}

// launchShipperless launches runID's agent in its sandbox as a launch whose shipper then
// died leaves it: the agent running, the shipper's pid file naming no process. The agent
// is killed when the test ends.
func launchShipperless(t *testing.T, lp *localprocess.Provider, psid, runID, agent string) {
	t.Helper()
	ctx := contract.WithTenant(t.Context(), "acme")
	if _, err := journal.Launch(ctx, lp, psid, "", runID, agent); err != nil {
		t.Fatal(err)
	}
	jp, err := journal.PathsIn(ctx, lp, "", runID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the agent must not outlive the test (one that ended is no error)
		_, _ = lp.Exec(context.WithoutCancel(ctx), psid, "g=$(cat "+journal.Quote(jp.PID)+") && [ \"$g\" -gt 1 ] && kill -9 -\"$g\" 2>/dev/null")
	})
	// Launch only starts the launcher, which makes the journal's directory and then writes
	// its pid file: wait for that file, as the agent route confirms a launch, before
	// writing into the directory.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, found, err := journal.PID(ctx, lp, psid, "", runID)
		if err != nil {
			t.Fatal(err)
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's launcher wrote no pid file within 10 s", runID)
		}
	}
	// A shipper ran and died: its pid file names no process (beyond any pid_max).
	if res, err := lp.Exec(ctx, psid, "echo 999999999 >"+journal.Quote(jp.ShipPID)); err != nil || res.ExitCode != 0 {
		t.Fatalf("%s's dead shipper's pid file: %v %+v", runID, err, res)
	}
}

// shipURLFront is the Ship function's URL as a shipper reaches it (docs/design.md §9):
// each HTTP request becomes the function URL's event (no route, no authorizer), invoked on
// e one at a time as a function container serves it.
func shipURLFront(t *testing.T, e *emulated) http.Handler {
	var mu sync.Mutex
	// An invoke runs to its end, as Lambda's does when the caller goes away.
	invoke := func(_ context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		var out events.APIGatewayV2HTTPResponse
		payload, err := json.Marshal(ev)
		if err != nil {
			return out, err
		}
		mu.Lock()
		resp, err := e.client.Post(e.url, "application/json", bytes.NewReader(payload))
		mu.Unlock()
		if err != nil {
			return out, err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Errorf("the %s function's answer is not an HTTP response event: %v", e.fn, err)
			return out, err
		}
		return out, nil
	}
	return &lambdaevent.Gateway{Handler: invoke} // no Route: a function URL takes every request to its function
}

// wsEvent is the event API Gateway's WebSocket API sends the push function: $connect
// IAM-authorized for a session of the trusted role naming tenant acme, or a message or
// $disconnect (which carry none of the upgrade's headers: lambdaevent.WebSocket).
func wsEvent(route, conn, body string) events.APIGatewayWebsocketProxyRequest {
	return lambdaevent.WebSocket{Route: route, ConnID: conn, Body: body,
		Header: map[string]string{"Host": "push.example", "X-Sandkeep-Tenant": "acme"}, RequestID: "ws000001=", Stage: "dev",
		UserARN: callerSession}.Event()
}

// lazy hands out emulators by function, starting each on first use.
type lazy func(fn awsfn.Function) *emulated

func (l lazy) get(fn awsfn.Function) *emulated { return l(fn) }

// TestFunctionsRefuseToStartWithoutSettings runs each bootstrap without a required setting
// and checks it exits non-zero naming the setting (Lambda shows it as Runtime.ExitError).
func TestFunctionsRefuseToStartWithoutSettings(t *testing.T) {
	t.Parallel() // runs the bootstraps: beside the other slow tests
	if testing.Short() {
		t.Skip("builds five bootstraps")
	}
	boots := buildBootstraps(t)
	good := []string{
		"AWS_REGION=us-east-1", awsfn.EnvTable + "=t", awsfn.EnvProvider + "=" + awsfn.ProviderLocalProcess,
		awsfn.EnvCursorKey + "=" + testCursorKey, awsfn.EnvDetachedTTLSeconds + "=900",
		awsfn.EnvSandboxDir + "=/tmp/sandkeep-refuse-test", awsfn.EnvTrustedRoleARNs + "=" + callerRole,
	}
	without := func(key string, extra ...string) []string {
		var env []string
		for _, kv := range good {
			if !strings.HasPrefix(kv, key+"=") {
				env = append(env, kv)
			}
		}
		return append(env, extra...)
	}
	cases := []struct {
		fn   awsfn.Function
		env  []string
		want string
	}{
		{awsfn.Resolve, without(awsfn.EnvTable), awsfn.EnvTable},
		{awsfn.Detach, without(awsfn.EnvCursorKey), awsfn.EnvCursorKeyARN},
		{awsfn.Resolve, without(awsfn.EnvProvider, awsfn.EnvProvider+"=daytona", awsfn.EnvReapSchedule+"=rate(1 minute)"), awsfn.EnvProviderSecretARN},
		{awsfn.Reaper, without(awsfn.EnvProvider, awsfn.EnvProvider+"=e2b", awsfn.EnvReapSchedule+"=rate(1 minute)"), awsfn.EnvProviderSecretARN},
		{awsfn.Log, without(awsfn.EnvProvider, awsfn.EnvProvider+"=daytona", awsfn.EnvReapSchedule+"=rate(1 minute)"), awsfn.EnvProviderSecretARN},
		{awsfn.Resolve, without(awsfn.EnvProvider, awsfn.EnvProvider+"=e2b", awsfn.EnvProviderAPIKey+"=e2b_test"), awsfn.EnvReapSchedule},
		{awsfn.Resolve, without(awsfn.EnvProvider), awsfn.EnvProvider},
		{awsfn.Reaper, without(awsfn.EnvDetachedTTLSeconds), awsfn.EnvDetachedTTLSeconds},
		// IAM mode (the default) without the roles trusted to name tenants, or with none.
		{awsfn.Log, without(awsfn.EnvTrustedRoleARNs), awsfn.EnvTrustedRoleARNs},
		// The Ship function verifies ship tokens with the cursor key, and calls the provider
		// (a ship end settles a one-run sandbox).
		{awsfn.Ship, without(awsfn.EnvCursorKey), awsfn.EnvCursorKeyARN},
		{awsfn.Ship, without(awsfn.EnvProvider, awsfn.EnvProvider+"=e2b", awsfn.EnvReapSchedule+"=rate(1 minute)"), awsfn.EnvProviderSecretARN},
		{awsfn.Wait, without(awsfn.EnvMaxWaitingPerTenant, awsfn.EnvMaxWaitingPerTenant+"=0"), awsfn.EnvMaxWaitingPerTenant},
		{awsfn.Cancel, without(awsfn.EnvTrustedRoleARNs, awsfn.EnvAuthMode+"="+awsfn.AuthIAM, awsfn.EnvTrustedRoleARNs+"=none"), awsfn.EnvTrustedRoleARNs},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, boots[c.fn])
		cmd.Env = c.env
		out, err := cmd.CombinedOutput()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != awsfn.ExitConfig {
			t.Errorf("%s: %v (want exit %d): %s", c.fn, err, awsfn.ExitConfig, out)
			continue
		}
		if !strings.Contains(string(out), c.want) || !strings.Contains(string(out), "refusing to start") {
			t.Errorf("%s: message %q does not name %q", c.fn, out, c.want)
		}
	}
	// Control: with every setting the process gets past configuration (and then fails only
	// for want of a Lambda runtime API, which a real Lambda provides) — local-process, and
	// each hosted provider with its key and the reaper's schedule.
	hosted := func(p string) []string {
		return without(awsfn.EnvProvider, awsfn.EnvProvider+"="+p, awsfn.EnvProviderAPIKey+"="+p+"_test",
			awsfn.EnvReapSchedule+"=rate(1 minute)")
	}
	reaches := func(name string, fn awsfn.Function, env []string) {
		t.Helper()
		cmd := exec.Command(boots[fn])
		cmd.Env = env
		out, _ := cmd.CombinedOutput()
		if strings.Contains(string(out), "refusing to start") || !strings.Contains(string(out), "AWS_LAMBDA_RUNTIME_API") {
			t.Errorf("%s: %s: a complete configuration did not reach the runtime API: %s", name, fn, out)
		}
	}
	for name, env := range map[string][]string{"local-process": good, "daytona": hosted("daytona"), "e2b": hosted("e2b")} {
		reaches(name, awsfn.Resolve, env)
		reaches(name, awsfn.Log, env)    // finish calls the provider too
		reaches(name, awsfn.Wait, env)   // and pump
		reaches(name, awsfn.Cancel, env) // and a shipped run's cancel
	}
	// JWT mode needs no trusted roles; the reaper and the Ship function never read them.
	reaches("ship", awsfn.Ship, without(awsfn.EnvTrustedRoleARNs))
	reaches("JWT", awsfn.Detach, without(awsfn.EnvTrustedRoleARNs, awsfn.EnvAuthMode+"="+awsfn.AuthJWT))
	reaches("reaper", awsfn.Reaper, without(awsfn.EnvTrustedRoleARNs))
	// The functions that never call the provider start without its key or any provider
	// setting, even in a daytona deployment whose key they could not read.
	for _, fn := range []awsfn.Function{awsfn.Detach} {
		reaches("no provider settings", fn, without(awsfn.EnvProvider))
		reaches("daytona, secret unreadable", fn, without(awsfn.EnvProvider, awsfn.EnvProvider+"=daytona",
			awsfn.EnvProviderSecretARN+"=arn:aws:secretsmanager:us-east-1:123456789012:secret:unreadable"))
	}
}
