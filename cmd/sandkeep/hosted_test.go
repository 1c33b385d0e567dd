package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// hostedAPI stands in for a hosted provider's management API: it records every request
// and answers as the provider does for a sandbox it no longer has — a read finds it gone
// (so the reaper's journal reads end at once), a delete succeeds.
type hostedAPI struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string // "METHOD path key=<credential header>"
}

func newHostedAPI(t *testing.T, name string) *hostedAPI {
	h := &hostedAPI{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") // daytona
		if name == providers.E2B {
			key = r.Header.Get("X-API-Key")
		}
		h.mu.Lock()
		h.got = append(h.got, r.Method+" "+r.URL.Path+" key="+key)
		h.mu.Unlock()
		switch r.Method {
		case http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"message":"not found","code":404}`))
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hostedAPI) requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

// namedProvider creates sandboxes under a hosted provider's name in this process, so the
// table holds what a Daytona or E2B deployment writes; the command under test builds the
// real provider.
type namedProvider struct{ name, psid string }

func (p namedProvider) Name() string { return p.name }
func (p namedProvider) Create(context.Context, contract.CreateInput) (string, error) {
	return p.psid, nil
}
func (p namedProvider) Resume(context.Context, string) error  { return nil }
func (p namedProvider) Destroy(context.Context, string) error { return nil }

// TestOperatorCommandsReachHostedProviders: `sandkeep reap --once` and `sandkeep runs
// finish --force`, run as real processes with --provider daytona or e2b (the key from the
// environment), end a detached run of that deployment through the provider: its requests
// arrive with the key. The thread's sandbox is kept for the idle stop (docs/design.md §5):
// no delete reaches the provider and the instance row stays. Before
// shared/providers both commands built a local-process provider whatever the deployment
// (no --provider flag), so nothing reached the provider and the reclaim failed.
func TestOperatorCommandsReachHostedProviders(t *testing.T) {
	t.Parallel()
	ep := dynamotest.Endpoint(t)
	bin := clitest.Binary(t)
	for _, name := range []string{providers.Daytona, providers.E2B} {
		for _, command := range []string{"reap", "finish"} {
			t.Run(name+"/"+command, func(t *testing.T) {
				t.Parallel()
				const key, psid = "hosted_test_key_0123456789", "sbx-hosted-1"
				api := newHostedAPI(t, name)
				client := dynamotest.NewClient(ep)
				table := dynamotest.FreshTable(t, client)
				// The run started and detached an hour ago, so the reaper may expire it and
				// the instance row is old enough to reclaim at once.
				past := func() time.Time { return time.Now().Add(-time.Hour) }
				b := dynamostore.New(dynamostore.Config{Client: client, Table: table, Now: past})
				k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{namedProvider{name, psid}}, Now: past})
				if err != nil {
					t.Fatal(err)
				}
				ctx := contract.WithTenant(t.Context(), "acme")
				res, err := k.Start(ctx, keeper.StartInput{RunID: "r1", ThreadID: "t1", Sandbox: keeper.Setup{ID: "a", Provider: name}})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := k.DetachWithKey(ctx, "r1", 1, res.Sandbox.Key); err != nil {
					t.Fatal(err)
				}

				args := []string{"reap", "--once", "--detached-ttl", "1m"}
				if command == "finish" {
					args = []string{"runs", "finish", "--force", "r1", "--tenant", "acme"}
				}
				baseURL := api.srv.URL
				if name == providers.Daytona {
					baseURL += "/api"
				}
				args = append(args, "--provider", name, "--base-url", baseURL, "--dynamodb-endpoint", ep, "--table", table)
				env := []string{envDaytonaAPIKey + "=" + key, envE2BAPIKey + "=" + key}
				code, out, errOut := clitest.Run(t, env, bin, args...)
				if code != 0 {
					t.Fatalf("sandkeep %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errOut)
				}
				if strings.Contains(out+errOut, key) {
					t.Fatalf("sandkeep %v printed the API key:\n%s\n%s", args, out, errOut)
				}
				var e reaper.RunEntry
				if command == "reap" {
					var rep reaper.Report
					if err := json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &rep); err != nil || len(rep.Runs) != 1 {
						t.Fatalf("reap report %q: %v", out, err)
					}
					e = rep.Runs[0]
				} else if err := json.Unmarshal([]byte(out), &e); err != nil {
					t.Fatalf("runs finish output %q: %v", out, err)
				}
				if e.RunID != "r1" || e.Outcome != reaper.Expired || e.Error != "" {
					t.Fatalf("entry %+v, want r1 expired without an error\nstderr:\n%s", e, errOut)
				}
				wantRead := "GET /sandboxes/" + psid + " key=" + key
				if name == providers.Daytona {
					wantRead = "GET /api/sandbox/" + psid + " key=" + key
				}
				got := api.requests()
				read := false
				for _, r := range got {
					read = read || r == wantRead
					if !strings.HasSuffix(r, " key="+key) {
						t.Errorf("request without the API key: %s", r)
					}
					if strings.HasPrefix(r, http.MethodDelete+" ") {
						t.Errorf("the thread's sandbox was deleted (it is kept for the idle stop): %s", r)
					}
				}
				if !read {
					t.Fatalf("the %s API never got %q; it got %q\nstderr:\n%s", name, wantRead, got, errOut)
				}
				st, err := b.Runs().State(ctx, "r1")
				if err != nil || st.Status != contract.StatusAborted || st.Error == nil {
					t.Fatalf("run after the command: %+v %v", st, err)
				}
				if row, err := b.Instances().GetRow(ctx, res.Sandbox.Key); err != nil || row == nil || row.ProviderSandboxID != psid {
					t.Fatalf("instance row after the command: %+v %v, want kept with %s", row, err, psid)
				}
			})
		}
	}
}
