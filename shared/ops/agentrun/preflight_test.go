package agentrun_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

func TestAwaitJournalReasons(t *testing.T) {
	e := newEnv(t, 0)
	res := e.Start("r-pre", `printf '{}\n'`)
	get := func(ctx context.Context) (*contract.RunRecord, error) {
		rec, err := e.K.Get(ctx, "r-pre")
		return &rec, err
	}
	if err := agentrun.AwaitJournal(e.Ctx, e.Prov, res.Sandbox.ProviderSandboxID, dir, "r-pre", get, time.Second, 0); err != nil {
		t.Fatalf("existing journal: %v", err)
	}
	var u *agentrun.Unavailable
	err := agentrun.AwaitJournal(e.Ctx, e.Prov, res.Sandbox.ProviderSandboxID, dir, "other", func(context.Context) (*contract.RunRecord, error) { return nil, nil }, time.Second, 0)
	if b, _ := json.Marshal(err); err == nil || !strings.Contains(err.Error(), agentrun.ReasonUnknownRun) || b == nil {
		t.Fatalf("unknown run: %v %v", err, u)
	}
}
