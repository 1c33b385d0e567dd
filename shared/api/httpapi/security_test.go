package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// Security proofs of docs/design.md §8/§12: the JWT tenant path, cross-tenant 404 on every route, cursor
// refusals, and a canary secret that must never leave the provider.

// everyRoute is every route of the docs/design.md §8 table addressing run runID / thread threadID, with
// the cursor where a body needs one, and what tenant B must get when it does not own them.
func everyRoute(runID, threadID, cursor string, after int64) []struct {
	r    req
	want int // 404, or 200 for the thread's (empty) active run
} {
	type rt = struct {
		r    req
		want int
	}
	out := []rt{}
	for _, r := range runRoutes(runID, cursor) {
		out = append(out, rt{r, http.StatusNotFound})
	}
	return append(out,
		rt{req{method: get, path: fmt.Sprintf("/v1/runs/%s/events?after=%d&limit=1000&waitMs=0", runID, after)}, http.StatusNotFound},
		rt{req{method: get, path: fmt.Sprintf("/v1/runs/%s/events?after=%d&waitMs=50", runID, after)}, http.StatusNotFound},
		rt{req{method: post, path: "/v1/runs/" + runID + "/snapshot", body: map[string]any{"cursor": cursor, "label": "steal"}}, http.StatusNotFound},
		rt{req{method: post, path: "/v1/runs/" + runID + "/finish", body: map[string]any{"cursor": cursor, "status": "failed", "error": map[string]any{"message": "x"}}}, http.StatusNotFound},
		rt{req{method: post, path: "/v1/runs/" + runID + "/finish", body: map[string]any{"cursor": cursor, "status": "interrupted"}}, http.StatusNotFound},
		rt{req{method: get, path: "/v1/threads/" + threadID + "/active-run"}, http.StatusOK},
		rt{req{method: post, path: "/v1/threads/" + threadID + "/cancel", body: map[string]any{}}, http.StatusNotFound},
	)
}

// withTenant returns r sent as tenant: the header in dev mode, the claim in JWT mode.
func withTenant(r req, auth Authenticator, tenant string) req {
	if _, ok := auth.(JWTAuth); ok {
		r.claims = map[string]string{DefaultTenantClaim: tenant}
		return r
	}
	r.tenant = tenant
	return r
}

// TestSecurityCrossTenantEveryRoute: tenant B probing tenant A's run on every route of docs/design.md §8
// (with A's valid cursor and a valid `next` of A's log) gets a plain 404 (an idle thread
// on active-run), and A's run, log and sandbox are exactly as they were.
func TestSecurityCrossTenantEveryRoute(t *testing.T) {
	for _, auth := range []Authenticator{DevAuth{}, JWTAuth{}} {
		forEachBackend(t, func(t *testing.T, nb backendFactory) {
			t.Run(fmt.Sprintf("%T", auth), func(t *testing.T) {
				e := newEnv(t, auth, nb(t))
				const tenantA, tenantB = "auth0|alice", "auth0|bob"
				r := e.do(withTenant(req{method: post, path: "/v1/runs", body: startBody("run-x", "thread-x")}, auth, tenantA))
				a := decode[startResponse](t, r.wantStatusRaw(t, 200))
				ap := decode[appendResponse](t, e.do(withTenant(req{method: post, path: "/v1/runs/run-x/events",
					body: map[string]any{"cursor": a.Cursor, "events": []any{map[string]any{"data": "a1", "src": 10}, map[string]any{"data": "a2", "src": 20}}}},
					auth, tenantA)).wantStatusRaw(t, 200))
				rd := decode[readResponse](t, e.do(withTenant(req{method: get, path: "/v1/runs/run-x/events?limit=1"}, auth, tenantA)).wantStatusRaw(t, 200))
				if len(rd.Events) == 0 || rd.Next <= 0 {
					t.Fatalf("tenant A's own read: %+v", rd)
				}
				ctxA := tctx(t, MapTenant(tenantA))
				before, err := e.backend.Runs().State(ctxA, "run-x")
				if err != nil || before == nil {
					t.Fatal(err)
				}

				probes := 0
				for _, c := range everyRoute("run-x", "thread-x", ap.Cursor, rd.Next) {
					res := e.do(withTenant(c.r, auth, tenantB))
					probes++
					if c.want == http.StatusOK {
						if got := res.wantStatus(t, 200); got["run"] != nil {
							t.Fatalf("%s %s: tenant B sees tenant A's run: %v", c.r.method, c.r.path, got)
						}
						continue
					}
					p := res.wantProblem(t, http.StatusNotFound, CodeUnknownRun)
					if strings.Contains(string(res.Body), MapTenant(tenantA)) || strings.Contains(p.Detail, "cursor") {
						t.Fatalf("%s %s: the 404 reveals something of tenant A: %s", c.r.method, c.r.path, res.Body)
					}
				}
				if probes != 17 {
					t.Fatalf("%d routes probed, want 17 (every run and thread route)", probes)
				}
				// The run is resolved before the cursor is looked at: whatever cursor B sends
				// (garbage, forged, its own of another run) the answer is the same 404.
				forged := cursorCodec{key: []byte("an attacker's guess at the key..")}.sign(MapTenant(tenantB), "run-x", contract.Cursor{Epoch: 9, Next: 1}, false)
				for _, cur := range []string{"garbage", forged, ap.Cursor + "x"} {
					for _, c := range everyRoute("run-x", "thread-x", cur, 0) {
						if c.want != http.StatusNotFound {
							continue
						}
						e.do(withTenant(c.r, auth, tenantB)).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
						probes++
					}
				}

				// A's run is untouched: same epoch, lease, not detached or cancelled, running.
				after, err := e.backend.Runs().State(ctxA, "run-x")
				if err != nil || after == nil || after.Epoch() != before.Epoch() || after.LeaseUntil != before.LeaseUntil ||
					after.DetachedSince != nil || after.Cancelled() || after.Status != contract.StatusRunning {
					t.Fatalf("tenant A's run after tenant B's probes: before %+v after %+v (%v)", before, after, err)
				}
				evs, _, closed, err := e.backend.Log().Read(ctxA, "run-x", 0, 100)
				if err != nil || len(evs) != 2 || closed {
					t.Fatalf("tenant A's log after the probes: %v closed=%v %v", evs, closed, err)
				}
				// B's own start of the same run and thread ids is B's own run, in its own sandbox.
				b := decode[startResponse](t, e.do(withTenant(req{method: post, path: "/v1/runs", body: startBody("run-x", "thread-x")},
					auth, tenantB)).wantStatusRaw(t, 200))
				if b.Outcome != wire.OutcomeCreated || b.DriverEpoch != 1 || b.Sandbox.Key == a.Sandbox.Key ||
					b.Sandbox.ProviderSandboxID == a.Sandbox.ProviderSandboxID {
					t.Fatalf("tenant B's start of the same ids: %+v (A: %+v)", b, a.Sandbox)
				}
				// Now that B has a run-x, A's cursor on it is another tenant's: 409, not a write.
				e.do(withTenant(req{method: post, path: "/v1/runs/run-x/heartbeat", body: map[string]any{"cursor": ap.Cursor}},
					auth, tenantB)).wantProblem(t, http.StatusConflict, CodeConflict)
				// And A's driver continues with its cursor.
				e.do(withTenant(req{method: post, path: "/v1/runs/run-x/heartbeat", body: map[string]any{"cursor": ap.Cursor}},
					auth, tenantA)).wantStatus(t, 200)
			})
		})
	}
}

// TestSecurityJWTClaimPath: in JWT mode the tenant is the configured claim of the verified
// token and nothing else. A missing or empty claim is 401 on every route; a value outside
// the docs/design.md §2.0 charset is hashed to t_ + 32 hex (computed here independently); a raw claim that
// spells another caller's mapped tenant is hashed again; the header never chooses.
func TestSecurityJWTClaimPath(t *testing.T) {
	e := newEnv(t, JWTAuth{}, nil)
	sum := sha256.Sum256([]byte("auth0|x"))
	want := "t_" + hex.EncodeToString(sum[:])[:32]
	if got := MapTenant("auth0|x"); got != want {
		t.Fatalf("MapTenant(auth0|x) = %q, want %q", got, want)
	}
	claims := map[string]string{"tenant": "auth0|x", "sub": "auth0|x", "iss": "https://issuer.example"}
	s := decode[startResponse](t, e.do(req{method: post, path: "/v1/runs", claims: claims, tenant: "victim",
		body: startBody("run-j", "thread-j")}).wantStatusRaw(t, 200))
	if got, err := refstore.Runs(e.backend.Runs()).Get(tctx(t, want), "run-j"); err != nil || got == nil {
		t.Fatalf("run not stored under %s: %v", want, err)
	}
	for _, other := range []string{"victim", "auth0|x", "", DefaultDevTenant} {
		if got, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, other), "run-j"); got != nil {
			t.Fatalf("run also visible under tenant %q", other)
		}
	}
	lines := e.logs.lines(t)
	if lines[0]["tenant"] != want || strings.Contains(e.logs.String(), "auth0|x") {
		t.Fatalf("the log line names tenant %v, or the raw claim:\n%s", lines[0]["tenant"], e.logs.String())
	}

	// Missing, empty or blank claim: 401 on every route, even with a tenant header.
	all := append([]req{{method: post, path: "/v1/runs", body: startBody("run-k", "thread-k")}},
		func() []req {
			var rs []req
			for _, c := range everyRoute("run-j", "thread-j", s.Cursor, 0) {
				rs = append(rs, c.r)
			}
			return rs
		}()...)
	unauth := 0
	for _, cl := range []map[string]string{nil, {}, {"sub": "auth0|x"}, {"tenant": ""}, {"tenant": "  "}, {"Tenant": "auth0|x"}} {
		for _, r := range all {
			r.claims, r.tenant = cl, "auth0|x"
			if r.claims == nil {
				r.claims = nil // no claims in the context at all
			}
			e.do(r).wantProblem(t, http.StatusUnauthorized, CodeUnauthenticated)
			unauth++
		}
	}
	if unauth != 6*18 {
		t.Fatalf("%d unauthenticated probes", unauth)
	}
	if got, _ := refstore.Runs(e.backend.Runs()).Get(tctx(t, want), "run-k"); got != nil {
		t.Fatal("an unauthenticated start wrote a run")
	}
	// A caller whose raw claim spells the mapped tenant is hashed again: it cannot act as
	// auth0|x.
	e.do(req{method: get, path: "/v1/runs/run-j", claims: map[string]string{"tenant": want}}).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
	e.do(req{method: post, path: "/v1/runs/run-j/heartbeat", claims: map[string]string{"tenant": want},
		body: map[string]any{"cursor": s.Cursor}}).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
	// A near miss of the claim value is another tenant.
	e.do(req{method: get, path: "/v1/runs/run-j", claims: map[string]string{"tenant": "auth0|X"}}).wantProblem(t, http.StatusNotFound, CodeUnknownRun)
	// The owner works: get, heartbeat with its cursor.
	e.do(req{method: get, path: "/v1/runs/run-j", claims: claims}).wantStatus(t, 200)
	e.do(req{method: post, path: "/v1/runs/run-j/heartbeat", claims: claims, body: map[string]any{"cursor": s.Cursor}}).wantStatus(t, 200)
	// A custom claim is the only one read.
	e2 := newEnv(t, JWTAuth{Claim: "https://sandkeep/org"}, nil)
	e2.do(req{method: get, path: "/v1/runs/run-j", claims: map[string]string{"tenant": "acme"}}).wantProblem(t, http.StatusUnauthorized, CodeUnauthenticated)
	e2.do(req{method: post, path: "/v1/runs", claims: map[string]string{"https://sandkeep/org": "org|7"}, body: startBody("run-o", "thread-o")}).wantStatus(t, 200)
	if got, _ := refstore.Runs(e2.backend.Runs()).Get(tctx(t, MapTenant("org|7")), "run-o"); got == nil {
		t.Fatal("run not stored under the custom claim's mapped tenant")
	}
}

// TestSecurityCursorRefusals: on every cursor-taking route, a forged cursor (another key),
// a tampered one (payload or signature, including the signature's last character), a
// truncated one, a cursor of another run of the tenant and a cursor of the same run id in
// another tenant are all refused with 409 (stale-cursor for a token this key cannot verify,
// conflict for a verified one of another run or tenant), and none of them writes anything.
func TestSecurityCursorRefusals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		e := newEnv(t, DevAuth{}, nb(t))
		a := e.start("acme", "run-a", "thread-a")
		b := e.start("acme", "run-b", "thread-b")
		other := e.start("globex", "run-a", "thread-a")
		key := []byte("test cursor key, 32 bytes long!!")
		cl, err := cursorCodec{key: key}.open(a.Cursor)
		if err != nil {
			t.Fatal(err)
		}
		attacker := cursorCodec{key: []byte("an attacker's guess at the key..")}
		payload, sig, _ := strings.Cut(a.Cursor, ".")
		flipLast := func(s string) string {
			// Changing only the unused low bits of the last base64 character.
			c := s[len(s)-1]
			alt := map[byte]byte{'A': 'B', 'E': 'F', 'I': 'J', 'M': 'N', 'Q': 'R', 'U': 'V', 'Y': 'Z', 'c': 'd',
				'g': 'h', 'k': 'l', 'o': 'p', 's': 't', 'w': 'x', '0': '1', '4': '5', '8': '9'}
			if n, ok := alt[c]; ok {
				return s[:len(s)-1] + string(n)
			}
			for k, v := range alt {
				if v == c {
					return s[:len(s)-1] + string(k)
				}
			}
			return s[:len(s)-1] + "A"
		}
		mid := len(payload) / 2
		cases := map[string]string{
			"forged (other key)":            attacker.sign("acme", "run-a", cl.cursor(), false),
			"forged higher epoch":           attacker.sign("acme", "run-a", contract.Cursor{Epoch: 99, Next: 1}, false),
			"payload tampered":              payload[:mid] + string(payload[mid]^1) + payload[mid+1:] + "." + sig,
			"signature's last char changed": payload + "." + flipLast(sig),
			"signature truncated":           payload + "." + sig[:len(sig)-1],
			"signature padded":              a.Cursor + "=",
			"signature dropped":             payload + ".",
			"claims of run-b, sig of run-a": strings.SplitN(b.Cursor, ".", 2)[0] + "." + sig,
			"another run's cursor":          b.Cursor,
			"another tenant's cursor":       other.Cursor,
			"not a cursor":                  "x",
		}
		refused := 0
		for name, cur := range cases {
			t.Run(name, func(t *testing.T) {
				if cur == a.Cursor {
					t.Fatal("the case is the valid cursor itself")
				}
				for _, r := range []req{
					{method: post, path: "/v1/runs/run-a/events", body: map[string]any{"cursor": cur, "events": []any{map[string]any{"data": 1}}}},
					{method: post, path: "/v1/runs/run-a/heartbeat", body: map[string]any{"cursor": cur}},
					{method: post, path: "/v1/runs/run-a/detach", body: map[string]any{"cursor": cur}},
					{method: post, path: "/v1/runs/run-a/snapshot", body: map[string]any{"cursor": cur}},
					{method: post, path: "/v1/runs/run-a/finish", body: map[string]any{"cursor": cur, "status": "completed"}},
				} {
					r.tenant = "acme"
					// A token that verifies (another run's, another tenant's) is conflict;
					// one this key cannot verify is stale-cursor.
					want := CodeStaleCursor
					if cur == b.Cursor || cur == other.Cursor {
						want = CodeConflict
					}
					e.do(r).wantProblem(t, http.StatusConflict, want)
					refused++
				}
			})
		}
		if refused != 5*len(cases) {
			t.Fatalf("%d refusals, want %d", refused, 5*len(cases))
		}
		st, err := e.backend.Runs().State(tctx(t, "acme"), "run-a")
		if err != nil || st == nil || st.Epoch() != 1 || st.DetachedSince != nil || st.Status != contract.StatusRunning {
			t.Fatalf("run-a after refused cursors: %+v, %v", st, err)
		}
		if evs, _, _, err := e.backend.Log().Read(tctx(t, "acme"), "run-a", 0, 100); err != nil || len(evs) != 0 {
			t.Fatalf("run-a's log after refused cursors: %v, %v", evs, err)
		}
		// The genuine cursor still works.
		e.appendEvents("acme", "run-a", a.Cursor, "ok").wantStatus(t, 200)
	})
}

// capture records every DynamoDB request and response body a client exchanges.
type capture struct {
	inner *awshttp.BuildableClient
	mu    sync.Mutex
	buf   bytes.Buffer
	n     int
}

// Do records the request body, sends it, and records the response body.
func (c *capture) Do(r *http.Request) (*http.Response, error) {
	var in []byte
	if r.Body != nil {
		var err error
		if in, err = io.ReadAll(r.Body); err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(in))
	}
	resp, err := c.inner.Do(r)
	var out []byte
	if err == nil && resp.Body != nil {
		out, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(out))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	c.buf.WriteString(r.Header.Get("X-Amz-Target") + " " + string(in) + "\n" + string(out) + "\n")
	for k, v := range r.Header {
		c.buf.WriteString(k + ": " + strings.Join(v, ",") + "\n")
	}
	return resp, err
}

func (c *capture) text() (string, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String(), c.n
}

// findSecret reports where s appears in text: plainly, or base64-encoded at any byte
// alignment (DynamoDB's JSON carries binary attributes — event data, usage — as base64).
func findSecret(text, s string) int {
	if i := strings.Index(text, s); i >= 0 {
		return i
	}
	for pad, skip := range []int{0, 2, 3} {
		enc := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("x", pad) + s))
		if i := strings.Index(text, enc[skip:len(enc)-3]); i >= 0 {
			return i
		}
	}
	return -1
}

// failingCreate is a provider whose Create fails (its error names the sandbox, as a real
// provider's would): the start-failed path must not carry the secrets either.
type failingCreate struct{ *counting.Provider }

func (failingCreate) Name() string { return "broken" }

func (failingCreate) Create(_ context.Context, in contract.CreateInput) (string, error) {
	return "", fmt.Errorf("broken: create %s refused by the provider", in.Name)
}

// TestSecuritySecretCanary: a canary placed in a workspace's secrets reaches the provider's
// env (positive control) and nowhere else: not in any DynamoDB request or response (on
// dynalite), any log line of the handler or the keeper (debug level), any HTTP response
// body or header, any stored run, or any error string — across every route, a resumed
// start that re-injects it, a malformed secrets member, and a failing create.
func TestSecuritySecretCanary(t *testing.T) {
	for _, name := range []string{"memstore", "dynamostore"} {
		t.Run(name, func(t *testing.T) {
			canary := "sk-canary-" + strings.ToLower(rand.Text())
			// marker travels as event data: the captures must find it (they can see content).
			marker := "event-marker-" + strings.ToLower(rand.Text())
			var (
				b    contract.Backend = memstore.New()
				capt *capture
			)
			if name == "dynamostore" {
				capt = &capture{inner: awshttp.NewBuildableClient()}
				client := dynamotest.Client(t, func(o *dynamodb.Options) { o.HTTPClient = capt })
				b = dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
			}
			logs := &syncBuffer{}
			logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			prov := counting.New("local-process")
			broken := failingCreate{counting.New("broken")}
			k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{prov, broken}, Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			loadSpec(t)
			e := &env{t: t, backend: b, logs: logs, auth: DevAuth{},
				h: New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: []byte("test cursor key, 32 bytes long!!"), Logger: logger})}

			var bodies bytes.Buffer
			record := func(r resp) resp {
				bodies.Write(r.Body)
				for k, v := range r.Header {
					bodies.WriteString(k + ": " + strings.Join(v, ",") + "\n")
				}
				return r
			}
			const tenant = "acme"
			withSecrets := func(runID, provider string, secrets any) map[string]any {
				m := startBody(runID, "thread-c")
				sb := m["sandbox"].(map[string]any)
				sb["provider"] = provider
				sb["workspace"] = map[string]any{"repo": "r", "secrets": secrets}
				return m
			}
			do := func(r req) resp { r.tenant = tenant; return record(e.do(r)) }

			s1 := decode[startResponse](t, do(req{method: post, path: "/v1/runs",
				body: withSecrets("run-c1", "local-process", map[string]any{"API_TOKEN": canary})}).wantStatusRaw(t, 200))
			cur := s1.Cursor
			ap := decode[appendResponse](t, do(req{method: post, path: "/v1/runs/run-c1/events",
				body: map[string]any{"cursor": cur, "events": []any{map[string]any{"data": marker}}}}).wantStatusRaw(t, 200))
			cur = ap.Cursor
			do(req{method: get, path: "/v1/runs/run-c1"}).wantStatus(t, 200)
			do(req{method: get, path: "/v1/runs/run-c1/events"}).wantStatus(t, 200)
			do(req{method: get, path: "/v1/threads/thread-c/active-run"}).wantStatus(t, 200)
			do(req{method: post, path: "/v1/runs/run-c1/heartbeat", body: map[string]any{"cursor": cur}}).wantStatus(t, 200)
			do(req{method: post, path: "/v1/runs/run-c1/snapshot", body: map[string]any{"cursor": cur, "label": "l"}}).wantStatus(t, 200)
			do(req{method: post, path: "/v1/runs/run-c1/detach", body: map[string]any{"cursor": cur}}).wantStatus(t, 200)
			att := decode[attachResponse](t, do(req{method: post, path: "/v1/runs/run-c1/attach"}).wantStatusRaw(t, 200))
			do(req{method: post, path: "/v1/runs/run-c1/finish", body: map[string]any{"cursor": att.Cursor, "status": "completed"}}).wantStatus(t, 200)
			// A second run on the thread resumes the sandbox and re-injects the (rotated) secret.
			s2 := decode[startResponse](t, do(req{method: post, path: "/v1/runs",
				body: withSecrets("run-c2", "local-process", map[string]any{"API_TOKEN": canary + "-2"})}).wantStatusRaw(t, 200))
			if s2.Outcome != wire.OutcomeResumed || s2.Sandbox.Key != s1.Sandbox.Key {
				t.Fatalf("second start: %+v (the secret must not change the key)", s2)
			}
			do(req{method: post, path: "/v1/runs/run-c2/cancel"}).wantStatusRaw(t, 202)
			do(req{method: post, path: "/v1/threads/thread-c/cancel"}).wantStatusRaw(t, 202)
			// Malformed secrets carrying the canary: 400 without echoing it.
			for i, bad := range []any{[]any{canary}, map[string]any{"K": []any{canary}}, canary, map[string]any{"K": map[string]any{"v": canary}}} {
				do(req{method: post, path: "/v1/runs", specSays: "silent",
					body: withSecrets(fmt.Sprintf("run-bad-%d", i), "local-process", bad)}).wantProblem(t, http.StatusBadRequest, CodeInvalid)
			}
			// A failing create: 503, and the run is marked failed with a message of its own.
			do(req{method: post, path: "/v1/runs", body: withSecrets("run-c3", "broken", map[string]any{"API_TOKEN": canary})}).
				wantProblem(t, http.StatusServiceUnavailable, CodeUnavailable)
			failed := decode[runResponse](t, do(req{method: get, path: "/v1/runs/run-c3"}).wantStatusRaw(t, 200))
			if failed.Run.Status != contract.StatusFailed || failed.Run.Error == nil || failed.Run.Error.Code != "start-failed" {
				t.Fatalf("the failed start's run: %+v", failed.Run)
			}
			// The keeper's own error strings.
			ctx := contract.WithTenant(t.Context(), tenant)
			var errs []string
			for _, in := range []keeper.StartInput{
				{RunID: "run-k1", ThreadID: "thread-k", Sandbox: keeper.Setup{ID: "default", Provider: "broken",
					Workspace: []byte(`{"secrets":{"T":"` + canary + `"}}`)}},
				{RunID: "run-k2", ThreadID: "thread-k", Sandbox: keeper.Setup{ID: "default", Provider: "local-process",
					Workspace: []byte(`{"secrets":["` + canary + `"]}`)}},
				{RunID: "run-k3", ThreadID: "thread-k", Sandbox: keeper.Setup{ID: "default", Provider: "local-process",
					Workspace: []byte(`{"secrets":{"T":"` + canary + `"}`)}},
			} {
				_, err := k.Start(ctx, in)
				if err == nil {
					t.Fatalf("start %s succeeded", in.RunID)
				}
				errs = append(errs, err.Error())
			}

			// Positive controls: the canary reached the provider, the captures saw traffic.
			got := false
			for _, in := range prov.Inputs() {
				got = got || in.Env["API_TOKEN"] == canary
				if strings.Contains(fmt.Sprint(in.Workspace), canary) {
					t.Fatalf("the workspace handed to the provider still holds the secret: %s", in.Workspace)
				}
			}
			if !got || prov.Env(s1.Sandbox.ProviderSandboxID)["API_TOKEN"] != canary+"-2" {
				t.Fatalf("the canary did not reach the provider's env (create %v, re-injected %q)", got, prov.Env(s1.Sandbox.ProviderSandboxID)["API_TOKEN"])
			}
			logText := logs.String()
			if !strings.Contains(logText, "run-c1") || findSecret(bodies.String(), marker) < 0 {
				t.Fatal("the log or response capture saw nothing: the check below would prove nothing")
			}
			where := map[string]string{"logs": logText, "HTTP responses": bodies.String(), "errors": strings.Join(errs, "\n")}
			if capt != nil {
				text, n := capt.text()
				if n < 20 || findSecret(text, marker) < 0 || !strings.Contains(text, "PutItem") && !strings.Contains(text, "UpdateItem") {
					t.Fatalf("the DynamoDB capture saw %d calls without the event marker: it proves nothing", n)
				}
				where["DynamoDB traffic"] = text
			}
			// Stored runs, read back.
			for _, id := range []string{"run-c1", "run-c2", "run-c3", "run-k1"} {
				st, err := b.Runs().State(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				where["run "+id] = fmt.Sprintf("%+v %s", st, st.Usage)
			}
			for what, text := range where {
				if i := findSecret(text, canary); i >= 0 {
					t.Errorf("the canary secret appears in %s: ...%s...", what, text[max(0, i-200):min(len(text), i+100)])
				}
			}
		})
	}
}

// TestFindSecretAlignments: the canary search finds a secret base64-encoded after any
// prefix and before any suffix, so a leak through a binary attribute cannot hide.
func TestFindSecretAlignments(t *testing.T) {
	s := "sk-canary-0123456789abcdef"
	for pre := range 6 {
		for post := range 3 {
			enc := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("p", pre) + s + strings.Repeat("q", post)))
			if findSecret(`{"B":"`+enc+`"}`, s) < 0 {
				t.Errorf("not found with %d bytes before and %d after: %s", pre, post, enc)
			}
		}
	}
	if findSecret(base64.StdEncoding.EncodeToString([]byte("sk-canary-01234X6789abcdef")), s) >= 0 {
		t.Error("found a secret differing in the middle")
	}
}
