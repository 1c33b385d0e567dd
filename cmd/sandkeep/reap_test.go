package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestReaperCommands drives reap --once --dry-run, runs list --stuck and runs finish
// --force against one table holding a detached run.
func TestReaperCommands(t *testing.T) {
	t.Parallel()
	ep := dynamotest.Endpoint(t)
	client := dynamotest.NewClient(ep)
	table := dynamotest.FreshTable(t, client)
	b, err := newDynamoBackend(client, dynamoFlags{table: table})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prov := localprocess.New(dir)
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{prov}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := contract.WithTenant(t.Context(), "acme")
	res, err := k.Start(ctx, keeper.StartInput{RunID: "r1", ThreadID: "t1", Sandbox: keeper.Setup{ID: "a", Provider: prov.Name()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.DetachWithKey(ctx, "r1", 1, res.Sandbox.Key); err != nil {
		t.Fatal(err)
	}
	common := []string{"--dynamodb-endpoint", ep, "--table", table}
	call := func(args ...string) (string, int) {
		var out, errw bytes.Buffer
		code := run(t.Context(), append(args, common...), streams{out: &out, err: &errw})
		return out.String() + errw.String(), code
	}

	out, code := call("reap", "--once", "--dry-run", "--detached-ttl", "1ms", "--sandbox-dir", dir)
	var rep reaper.Report
	if code != 0 || json.Unmarshal([]byte(strings.SplitN(out, "\n", 2)[0]), &rep) != nil || rep.Outcomes.Expired != 1 || !rep.Runs[0].DryRun {
		t.Fatalf("reap --dry-run: %d %s", code, out)
	}
	if st, _ := b.Runs().State(ctx, "r1"); st.Status != contract.StatusRunning || st.Epoch() != 1 {
		t.Fatalf("a dry run wrote: %+v", st)
	}
	if out, code := call("runs", "list", "--stuck"); code != 0 || !strings.Contains(out, `"runId":"r1"`) {
		t.Fatalf("runs list --stuck: %d %s", code, out)
	}
	if out, code := call("runs", "finish", "--force", "r1", "--tenant", "acme", "--sandbox-dir", dir); code != 0 || !strings.Contains(out, `"status":"aborted"`) {
		t.Fatalf("runs finish --force: %d %s", code, out)
	}
	if st, _ := b.Runs().State(ctx, "r1"); st.Status != contract.StatusAborted || st.Error == nil || st.Error.Code != "forced" {
		t.Fatalf("after force finish: %+v", st)
	}
	if _, code := call("reap", "--detached-ttl", "1m"); code != 2 {
		t.Fatalf("reap without --once exited %d", code)
	}
}

// TestRunsListStuckJudgesByTheDeploymentsLease: a run never leased is stuck a driver lease
// after it started, by the deployment's lease (here 1 s, as its table was indexed with),
// so `runs list --stuck` must judge by --driver-lease, not by the default minute.
func TestRunsListStuckJudgesByTheDeploymentsLease(t *testing.T) {
	t.Parallel()
	ep := dynamotest.Endpoint(t)
	client := dynamotest.NewClient(ep)
	table := dynamotest.FreshTable(t, client)
	b, err := newDynamoBackend(client, dynamoFlags{table: table, driverLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := contract.WithTenant(t.Context(), "acme")
	started := time.Now().Add(-3 * time.Second).UnixMilli()
	if _, err := b.Runs().(contract.RunWriter).CreateOrResume(ctx, contract.NewRun{RunID: "r1", ThreadID: "t1", StartedAt: started}); err != nil {
		t.Fatal(err)
	}
	list := func(extra ...string) string {
		var out, errw bytes.Buffer
		args := append([]string{"runs", "list", "--stuck", "--dynamodb-endpoint", ep, "--table", table}, extra...)
		if code := run(t.Context(), args, streams{out: &out, err: &errw}); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errw.String())
		}
		return out.String()
	}
	if out := list("--driver-lease", "1s"); !strings.Contains(out, `"runId":"r1"`) {
		t.Fatalf("with the deployment's 1 s lease, r1 (started 3 s ago, never leased) is stuck; listed: %q", out)
	}
	if out := list(); strings.Contains(out, `"runId":"r1"`) {
		t.Fatalf("by the default minute r1 is not stuck yet; listed: %q", out)
	}
}
