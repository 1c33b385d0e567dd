package awsfn

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/emf"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/proctest"
)

// TestStageURL: the sandboxes' API address comes from API Gateway's request context alone
// (docs/design.md §9): the $default stage has no path prefix, any other stage is one; a
// domain name that is not a plain host name gives none.
func TestStageURL(t *testing.T) {
	rc := func(domain, stage string) events.APIGatewayV2HTTPRequestContext {
		return events.APIGatewayV2HTTPRequestContext{DomainName: domain, Stage: stage}
	}
	for _, c := range []struct {
		rc   events.APIGatewayV2HTTPRequestContext
		want string
	}{
		{rc("abc.execute-api.eu-west-1.amazonaws.com", "$default"), "https://abc.execute-api.eu-west-1.amazonaws.com"},
		{rc("abc.execute-api.eu-west-1.amazonaws.com", ""), "https://abc.execute-api.eu-west-1.amazonaws.com"},
		{rc("abc.execute-api.eu-west-1.amazonaws.com", "prod"), "https://abc.execute-api.eu-west-1.amazonaws.com/prod"},
		{rc("api.example.com:8443", "$default"), "https://api.example.com:8443"},
		{rc("", "$default"), ""},
		{rc("evil.example/x?", "$default"), ""},
		{rc("evil.example\r\nX-Injected: 1", "$default"), ""},
		{rc("@evil.example", "$default"), ""},
		{rc(".example", "$default"), ""},
		{rc("abc.example", "a/b"), ""},
	} {
		if got := StageURL(c.rc); got != c.want {
			t.Errorf("StageURL(%q, %q) = %q, want %q", c.rc.DomainName, c.rc.Stage, got, c.want)
		}
	}
}

// recordingProvider is local-process under another name (the functions refuse to launch
// on local-process itself) whose StartEnv records the shipper's URL and starts nothing.
type recordingProvider struct {
	*localprocess.Provider
	urls chan string
}

func (p recordingProvider) Name() string { return "recording" }

func (p recordingProvider) StartEnv(ctx context.Context, id, command string, env map[string]string) (int, error) {
	if u, ok := env[journal.EnvShipURL]; ok {
		p.urls <- u
		return 0, errors.New("recorded; the shipper is not started")
	}
	return p.Provider.StartEnv(ctx, id, command, env)
}

// TestAgentShipsToTheStageURL: through the Lambda adapter, an agent launched with no
// PublicUrl gets a shipper whose URL is the request's own stage URL from the request
// context, whatever Host header the caller sent; PublicUrl, when set, overrides it.
func TestAgentShipsToTheStageURL(t *testing.T) {
	for _, c := range []struct {
		name, public, stage, want string
	}{
		{"default stage", "", "$default", "https://abc.execute-api.us-east-1.amazonaws.com"},
		{"named stage", "", "prod", "https://abc.execute-api.us-east-1.amazonaws.com/prod"},
		{"PublicUrl overrides", "https://sandkeep.example.com", "$default", "https://sandkeep.example.com"},
	} {
		t.Run(c.name, func(t *testing.T) {
			prov := recordingProvider{localprocess.New(t.TempDir()), make(chan string, 1)}
			k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{prov}})
			if err != nil {
				t.Fatal(err)
			}
			logs := &syncBuffer{}
			h := httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.IAMAuth{}, CursorKey: []byte("adapter test key, long enough!!"),
				Logger: NewLogger(logs, ""), HostProviders: []string{ProviderLocalProcess}, PublicURL: c.public, RequestPublicURL: true})
			fn := NewAPIAdapter(Resolve, h, Auth{Mode: AuthIAM, Trusted: testTrusted(t)}, NewLogger(logs, ""), emf.New(&syncBuffer{}))
			send := func(ev events.APIGatewayV2HTTPRequest) map[string]any {
				t.Helper()
				ev.Headers["host"] = "evil.example" // a client's Host never names the address
				ev.RequestContext.DomainName = "abc.execute-api.us-east-1.amazonaws.com"
				ev.RequestContext.Stage = c.stage
				resp, m := call(t, fn, ev)
				if resp.StatusCode != 200 {
					t.Fatalf("%s: %d %v", ev.RouteKey, resp.StatusCode, m)
				}
				return m
			}
			tenant := map[string]string{"x-sandkeep-tenant": "acme"}
			st := send(event("POST", "POST /v1/runs", "/v1/runs", "",
				map[string]any{"runId": "run-u", "threadId": "thread-u", "sandbox": map[string]any{"id": "default", "provider": "recording"}}, tenant, nil))
			a := send(event("POST", "POST /v1/runs/{runId}/agent", "/v1/runs/run-u/agent", "",
				map[string]any{"cursor": st["cursor"], "command": "exit 0"}, tenant, nil))
			if a["shipping"] != "host" {
				t.Fatalf("agent: %v, want shipping host (the recorded shipper never started)", a)
			}
			// The agent's launcher writes its exit into the journal after the answer: wait
			// for its group to end before the sandbox's directory is removed.
			psid, _ := st["sandbox"].(map[string]any)["providerSandboxId"].(string)
			pg, found, err := journal.PID(contract.WithTenant(t.Context(), "acme"), prov.Provider, psid, "", "run-u")
			if err != nil || !found {
				t.Fatalf("the agent's pid file: found %v, %v", found, err)
			}
			proctest.WaitGroupGone(t, pg, 10*time.Second, "the agent's launcher")
			select {
			case got := <-prov.urls:
				if got != c.want {
					t.Fatalf("the shipper's URL %q, want %q", got, c.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no shipper was started")
			}
		})
	}
}
