package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// errNotFound: the run does not exist (exit status 1 with a clear message).
var errNotFound = errors.New("not found")

// runsGetConfig is `runs get`: over the API, or (with --table) straight from the table,
// for operators.
type runsGetConfig struct {
	api    apiFlags // api.tenant is the run's tenant in both modes
	dynamo dynamoFlags
	direct bool // --table or --dynamodb-endpoint given
	runID  string
}

func parseRunsGet(args []string, getenv func(string) string, w io.Writer) (runsGetConfig, error) {
	var cfg runsGetConfig
	fs := newFlags("sandkeep runs get", w)
	cfg.api.register(fs, getenv)
	cfg.dynamo.register(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return cfg, err
	}
	if len(pos) != 1 {
		return cfg, usageErr("runs get takes exactly one RUN_ID")
	}
	cfg.runID = pos[0]
	if err := contract.CheckStoreID("RUN_ID", cfg.runID); err != nil {
		return cfg, usageErr("%v", err)
	}
	cfg.direct = cfg.dynamo.table != "" || cfg.dynamo.endpoint != ""
	if !cfg.direct {
		return cfg, cfg.api.check(getenv)
	}
	// The table mode: the tenant is stored as is, or mapped like the HTTP API maps it.
	if cfg.api.tenant == "" {
		return cfg, usageErr("--tenant is required with --table")
	}
	return cfg, cfg.dynamo.check(true)
}

// storeTenant is the tenant an operator means: a value already within the docs/design.md §2.0 charset is
// taken as stored (so a mapped "t_…" tenant can be named directly), anything else is
// mapped exactly as the HTTP API maps it (an e-mail address, "auth0|x").
func storeTenant(t string) string {
	if contract.CheckTenant(t) == nil {
		return t
	}
	return httpapi.MapTenant(t)
}

// runGetOutput is what `runs get` prints.
type runGetOutput struct {
	Tenant string            `json:"tenant"`
	Run    contract.RunState `json:"run"`
}

// runRunsGet prints the run as JSON: its record over the API, or the table's row with its
// driver attributes.
func runRunsGet(ctx context.Context, cfg runsGetConfig, out io.Writer) error {
	if !cfg.direct {
		return runRunsGetAPI(ctx, cfg.api, cfg.runID, out)
	}
	client, err := cfg.dynamo.client(ctx)
	if err != nil {
		return err
	}
	b, err := newDynamoBackend(client, cfg.dynamo)
	if err != nil {
		return err
	}
	tenant := storeTenant(cfg.api.tenant)
	st, err := b.Runs().State(contract.WithTenant(ctx, tenant), cfg.runID)
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
