package samtest

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
)

// countingProvider is the local-process provider counting every call a function makes
// through it (the seam awsfn.Deps.Provider).
type countingProvider struct {
	*localprocess.Provider
	calls atomic.Int64
}

func (c *countingProvider) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	c.calls.Add(1)
	return c.Provider.Create(ctx, in)
}

func (c *countingProvider) Resume(ctx context.Context, id string) error {
	c.calls.Add(1)
	return c.Provider.Resume(ctx, id)
}

func (c *countingProvider) Destroy(ctx context.Context, id string) error {
	c.calls.Add(1)
	return c.Provider.Destroy(ctx, id)
}

func (c *countingProvider) Lookup(ctx context.Context, name string) (string, bool, error) {
	c.calls.Add(1)
	return c.Provider.Lookup(ctx, name)
}

func (c *countingProvider) Status(ctx context.Context, id string) (contract.SandboxStatus, error) {
	c.calls.Add(1)
	return c.Provider.Status(ctx, id)
}

func (c *countingProvider) Snapshot(ctx context.Context, id, label string) (string, error) {
	c.calls.Add(1)
	return c.Provider.Snapshot(ctx, id, label)
}

func (c *countingProvider) Restore(ctx context.Context, in contract.CreateInput) (string, error) {
	c.calls.Add(1)
	return c.Provider.Restore(ctx, in)
}

func (c *countingProvider) Exec(ctx context.Context, id, command string) (contract.ExecResult, error) {
	c.calls.Add(1)
	return c.Provider.Exec(ctx, id, command)
}

func (c *countingProvider) Start(ctx context.Context, id, command string) (int, error) {
	c.calls.Add(1)
	return c.Provider.Start(ctx, id, command)
}

func (c *countingProvider) Kill(ctx context.Context, id string, pgid int) error {
	c.calls.Add(1)
	return c.Provider.Kill(ctx, id, pgid)
}

func (c *countingProvider) SetEnv(ctx context.Context, id string, env map[string]string) error {
	c.calls.Add(1)
	return c.Provider.SetEnv(ctx, id, env)
}

func (c *countingProvider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	c.calls.Add(1)
	return c.Provider.DeleteSnapshot(ctx, snapshotID)
}

// recordingSecrets answers every secret read with a usable value and records the ARNs.
type recordingSecrets struct{ arns map[string]bool }

func (r *recordingSecrets) Secret(_ context.Context, arn string) (string, error) {
	r.arns[arn] = true
	return "a secret value at least 32 bytes long", nil
}

// functionEnv returns fn's environment in a resolved template: Globals, then its own.
func functionEnv(resolved map[string]any, id string) map[string]string {
	env := map[string]string{}
	for _, vars := range []any{path(resolved, "Globals", "Function", "Environment", "Variables"),
		path(resolved, "Resources", id, "Properties", "Environment", "Variables")} {
		for k, v := range mapOf(vars) {
			if f, ok := v.(float64); ok {
				env[k] = fmt.Sprint(int64(f))
			} else {
				env[k] = fmt.Sprint(v)
			}
		}
	}
	return env
}

// secretGrants returns the resources fn's resolved policies let it read as secrets.
func secretGrants(resolved map[string]any, id string) []string {
	var out []string
	for _, pol := range asList(path(resolved, "Resources", id, "Properties", "Policies")) {
		for _, st := range asList(path(pol, "Statement")) {
			acts := fmt.Sprint(path(st, "Action"))
			if strings.Contains(acts, "secretsmanager:") || strings.Contains(acts, "ssm:") {
				out = append(out, fmt.Sprint(path(st, "Resource")))
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestSecretGrantsEqualUse: for every function, the secrets template.yaml lets it read
// equal the secrets it reads at cold start (awsfn.Load over the environment the template
// gives it, for every parameter set), and it reads the provider's key exactly when it
// calls the provider: every route and the reaper driven through the Lambda adapters
// against dynalite, each function with its own counting provider.
func TestSecretGrantsEqualUse(t *testing.T) {
	d := newDeployment(t)
	d.drive()
	tree := loadTree(t)
	for set, params := range paramSets(t) {
		if newResolver(t, tree, params).params["Provider"] != awsfn.ProviderLocalProcess && params["ProviderSecretArn"] == "" {
			// A hosted provider needs its key (the template's defaults name none).
			params = maps.Clone(params)
			params["ProviderSecretArn"] = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sandkeep/provider-AbCdEf"
		}
		resolved := resolveTemplate(t, tree, params)
		for _, fn := range awsfn.Functions() {
			id := fn.LogicalID()
			sec := &recordingSecrets{arns: map[string]bool{}}
			if _, err := awsfn.Load(t.Context(), fn, func(k string) string { return functionEnv(resolved, id)[k] }, sec); err != nil {
				t.Fatalf("%s: %s refuses to start on the template's environment: %v", set, id, err)
			}
			var read []string
			for a := range sec.arns {
				read = append(read, a)
			}
			sort.Strings(read)
			if granted := secretGrants(resolved, id); fmt.Sprint(read) != fmt.Sprint(granted) {
				t.Errorf("%s: %s is granted the secrets %v, reads %v at cold start", set, id, granted, read)
			}
			arn := params["ProviderSecretArn"]
			calls := d.providers[fn].calls.Load()
			if arn != "" && sec.arns[arn] != (calls > 0) {
				t.Errorf("%s: %s reads the provider's key %v, made %d provider calls", set, id, sec.arns[arn], calls)
			}
		}
	}
	for _, fn := range awsfn.Functions() {
		t.Logf("%s: %d provider calls", fn.LogicalID(), d.providers[fn].calls.Load())
	}
}
