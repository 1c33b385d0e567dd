package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/sandkeep/sandkeep/shared/httpapi"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// errNotFound: the run does not exist (exit status 1 with a clear message).
var errNotFound = errors.New("not found")

type runsGetConfig struct {
	dynamo dynamoFlags
	tenant string
	runID  string
}

func parseRunsGet(args []string, w io.Writer) (runsGetConfig, error) {
	var cfg runsGetConfig
	fs := newFlags("sandkeep runs get", w)
	cfg.dynamo.register(fs)
	fs.StringVar(&cfg.tenant, "tenant", "", "the run's tenant: a stored tenant as is, any other value mapped like the HTTP API maps it")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return cfg, err
	}
	switch {
	case len(pos) != 1:
		return cfg, usageErr("runs get takes exactly one RUN_ID")
	case cfg.tenant == "":
		return cfg, usageErr("--tenant is required")
	}
	cfg.runID = pos[0]
	if err := sandbox.CheckStoreID("RUN_ID", cfg.runID); err != nil {
		return cfg, usageErr("%v", err)
	}
	return cfg, cfg.dynamo.check(true)
}

// storeTenant is the tenant an operator means: a value already within the §2.0 charset is
// taken as stored (so a mapped "t_…" tenant can be named directly), anything else is
// mapped exactly as the HTTP API maps it (an e-mail address, "auth0|x").
func storeTenant(t string) string {
	if sandbox.CheckTenant(t) == nil {
		return t
	}
	return httpapi.MapTenant(t)
}

// runGetOutput is what `runs get` prints.
type runGetOutput struct {
	Tenant string           `json:"tenant"`
	Run    sandbox.RunState `json:"run"`
}

// runRunsGet prints the run (with its driver attributes) as JSON.
func runRunsGet(ctx context.Context, cfg runsGetConfig, out io.Writer) error {
	client, err := cfg.dynamo.client(ctx)
	if err != nil {
		return err
	}
	b, err := newDynamoBackend(client, cfg.dynamo.table)
	if err != nil {
		return err
	}
	tenant := storeTenant(cfg.tenant)
	st, err := b.Runs().State(sandbox.WithTenant(ctx, tenant), cfg.runID)
	if err != nil {
		return fmt.Errorf("read run %q: %w", cfg.runID, err)
	}
	if st == nil {
		return fmt.Errorf("run %q of tenant %q: %w", cfg.runID, tenant, errNotFound)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(runGetOutput{Tenant: tenant, Run: *st})
}
