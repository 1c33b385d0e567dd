// Package envtest is the check every provider's StartEnv passes (contract.EnvStarter),
// written once for the providers' tests.
package envtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Secret is the value of the started command's own variable, AGENT_TOKEN.
const Secret = "agent-only-s3cret"

// Provider is a provider whose commands take variables of their own and of the sandbox.
type Provider interface {
	contract.Executor
	contract.EnvStarter
	contract.EnvSetter
}

// StartEnv proves on sandbox id that a command started with variables of its own sees
// them beside the sandbox's (SetEnv), that a later command does not see them, and that a
// bad variable name is ErrInvalid. started, when not nil, runs once the command has
// started (the caller's fake may look at the request).
func StartEnv(ctx context.Context, t *testing.T, p Provider, id string, started func()) {
	t.Helper()
	if err := p.SetEnv(ctx, id, map[string]string{"SANDBOX_VAR": "from-the-sandbox"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.StartEnv(ctx, id, `printf '%s %s' "$AGENT_TOKEN" "$SANDBOX_VAR" > seen`, map[string]string{"AGENT_TOKEN": Secret}); err != nil {
		t.Fatal(err)
	}
	if started != nil {
		started()
	}
	// The command runs in the background: poll for its file, bounded.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := p.Exec(ctx, id, "cat seen 2>/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Stdout) == Secret+" from-the-sandbox" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command saw %q", res.Stdout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if res, err := p.Exec(ctx, id, `printf %s "$AGENT_TOKEN"`); err != nil || len(res.Stdout) != 0 {
		t.Fatalf("a later command sees the started command's variable: %q %v", res.Stdout, err)
	}
	for _, bad := range []string{"1BAD", "A=B"} {
		if _, err := p.StartEnv(ctx, id, "true", map[string]string{bad: "x"}); !errors.Is(err, contract.ErrInvalid) {
			t.Fatalf("bad name %q: %v, want ErrInvalid", bad, err)
		}
	}
}
