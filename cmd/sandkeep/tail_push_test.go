package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// Routes as the dev server's request log names them.
const (
	routeEvents    = "GET /v1/runs/{runId}/events"
	routeSubscribe = "GET " + wire.SubscribePath
)

// requestLog is one request line of the dev server's log (stderr, JSON).
type requestLog struct {
	Msg     string `json:"msg"`
	Route   string `json:"route"`
	Status  int    `json:"status"`
	Outcome string `json:"outcome"`
}

// devRequests returns the request lines of dev's log so far.
func devRequests(dev *clitest.Dev) []requestLog {
	var out []requestLog
	for _, l := range dev.Stderr.Lines() {
		var r requestLog
		if json.Unmarshal([]byte(l), &r) == nil && r.Msg == "request" {
			out = append(out, r)
		}
	}
	return out
}

// countRoute counts dev's logged requests of route (with status, when non-zero).
func countRoute(dev *clitest.Dev, route string, status int) int {
	n := 0
	for _, r := range devRequests(dev) {
		if r.Route == route && (status == 0 || r.Status == status) {
			n++
		}
	}
	return n
}

// TestTailFollowsOverPush: `sandkeep tail --follow` on a real `sandkeep dev` prints the
// stored events, then each one appended while it waits, then the run's end (exit 0) — over
// push: the server logs its subscription and not one read of the log. With `--no-push` the
// upgrade is answered 404 and the same command long-polls to the same output. Both backends;
// on memory also as a deployment's client: `--auth iam` long-polls, and subscribes once
// $SANDKEEP_PUSH_URL names the push endpoint (a deployment's is an API of its own). Over
// push, `run` and `attach` then read the same way: one subscription each, no read.
func TestTailFollowsOverPush(t *testing.T) {
	t.Parallel()
	type mode struct {
		push    bool // the server serves push
		iam     bool // --auth iam
		pushURL bool // with $SANDKEEP_PUSH_URL naming the push endpoint
	}
	for _, b := range backends {
		modes := []mode{{push: true}, {push: false}}
		if b.name == "memory" {
			modes = append(modes, mode{push: true, iam: true}, mode{push: true, iam: true, pushURL: true})
		}
		for _, m := range modes {
			push := m.push && (!m.iam || m.pushURL) // whether tail should receive over push
			t.Run(fmt.Sprintf("%s/push=%v/iam=%v/url=%v", b.name, m.push, m.iam, m.pushURL), func(t *testing.T) {
				t.Parallel()
				args := b.args(t)
				if !m.push {
					args = append(args, "--no-push")
				}
				dev := clitest.StartDev(t, nil, args...)
				c := devClient(t, dev)
				ctx := clitest.Context(t)
				st, err := c.Start(ctx, wire.StartRequest{RunID: "run-t", ThreadID: "th-t", Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}})
				if err != nil {
					t.Fatal(err)
				}
				cursor := st.Cursor
				n := 0
				appendN := func(k int) {
					t.Helper()
					evs := make([]wire.EventIn, k)
					for i := range evs {
						n++
						evs[i] = wire.EventIn{Data: json.RawMessage(fmt.Sprintf(`{"n":%d,"s":"\u001b[31m"}`, n))}
					}
					res, err := c.Append(ctx, "run-t", wire.AppendRequest{Cursor: cursor, Events: evs})
					if err != nil {
						t.Fatal(err)
					}
					cursor = res.Cursor
				}
				appendN(3)
				var tail *clitest.Proc
				if m.iam {
					// Signed with made-up keys the dev server ignores; the push endpoint is
					// named as a deployment names its own: a URL of its own, from the env.
					env := []string{envAPI + "=" + dev.URL,
						"AWS_ACCESS_KEY_ID=AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY=example-secret", "AWS_REGION=us-east-1",
						"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
					if m.pushURL {
						env = append(env, envPushURL+"=ws"+strings.TrimPrefix(dev.URL, "http")+wire.SubscribePath)
					}
					tail = clitest.Start(t, env, clitest.Binary(t), "tail", "run-t", "--after", "1", "--follow", "--auth", "iam")
				} else {
					tail = skStart(t, dev, "tail", "run-t", "--after", "1", "--follow")
				}
				tail.WaitLines(t, 2)
				for range 3 {
					appendN(2) // pushed while tail waits
					tail.WaitLines(t, n-1)
				}
				if _, err := c.Finish(ctx, "run-t", wire.FinishRequest{Cursor: cursor, Status: string(contract.StatusCompleted)}); err != nil {
					t.Fatal(err)
				}
				if code := tail.Wait(t); code != 0 || !strings.Contains(tail.Stderr.String(), "run run-t completed") {
					t.Fatalf("tail --follow: exit %d\n%s", code, tail.Stderr)
				}
				got := parseEvents(t, tail.Stdout.String())
				for i, e := range got {
					var v struct{ N int }
					if json.Unmarshal(e.Data, &v) != nil || v.N != i+2 || e.Offset != int64(i+2) {
						t.Fatalf("line %d: %+v\n%s", i, e, tail.Stdout)
					}
				}
				if len(got) != n-1 || !strings.Contains(tail.Stdout.String(), `\u001b[31m`) || strings.Contains(tail.Stdout.String(), "\x1b") {
					t.Fatalf("printed %d events (want %d), escapes kept:\n%s", len(got), n-1, tail.Stdout)
				}
				// The server's log says how: a subscription's line is written when it ends.
				subs := 0
				for deadline := time.Now().Add(clitest.Deadline); ; time.Sleep(20 * time.Millisecond) {
					if subs = countRoute(dev, routeSubscribe, 0); !push || subs >= 1 || time.Now().After(deadline) {
						break
					}
				}
				reads := countRoute(dev, routeEvents, 0)
				if push && (subs != 1 || reads != 0) {
					t.Fatalf("over push: %d subscriptions and %d reads of the log logged, want 1 and 0\n%s", subs, reads, dev.Stderr)
				}
				if push && !m.iam {
					// run and attach read through the same subscription: one each, no read.
					code, out, errOut := sk(t, dev, "run", "--thread", "th-r", "--run", "run-r", "--", "echo a; echo b")
					if code != 0 || len(parseEvents(t, out)) != 2 {
						t.Fatalf("run: exit %d, %q\n%s", code, out, errOut)
					}
					if code, out, errOut = sk(t, dev, "attach", "run-r"); code != 0 || len(parseEvents(t, out)) != 2 {
						t.Fatalf("attach of the ended run: exit %d, %q\n%s", code, out, errOut)
					}
					for deadline := time.Now().Add(clitest.Deadline); countRoute(dev, routeSubscribe, 0) < 3 && time.Now().Before(deadline); {
						time.Sleep(20 * time.Millisecond)
					}
					if subs, reads := countRoute(dev, routeSubscribe, 0), countRoute(dev, routeEvents, 0); subs != 3 || reads != 0 {
						t.Fatalf("tail, run and attach over push: %d subscriptions and %d reads of the log logged, want 3 and 0\n%s", subs, reads, dev.Stderr)
					}
				}
				// Without push the upgrade matches no route: one 404, then long polls. SigV4
				// without a push endpoint never tries the upgrade: long polls only.
				refused := 1
				if m.iam {
					refused = 0
				}
				if !push && (countRoute(dev, "", 404) != refused || subs != 0 || reads == 0) {
					t.Fatalf("without push: %d refused upgrades, %d subscriptions and %d reads of the log logged, want %d, 0 and some\n%s",
						countRoute(dev, "", 404), subs, reads, refused, dev.Stderr)
				}
			})
		}
	}
}
