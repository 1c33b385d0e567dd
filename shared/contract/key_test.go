package contract

import (
	"encoding/json"
	"testing"
)

// Golden vectors (three cross-checked with an independent Python json.dumps(sort_keys)
// + hashlib implementation): a silent change of the key would orphan every sandbox. Never edit these.
func TestSandboxKeyGolden(t *testing.T) {
	ws := json.RawMessage(`{"repo":"github.com/a/b","ref":"main","n":1.50,"secrets":{"TOKEN":"x"}}`)
	cases := []struct {
		name string
		in   KeyInput
		want string
	}{
		{"no workspace", KeyInput{ThreadID: "t1", SetupID: "dev", Provider: "local-process"}, "sk_a44665cfe642b59058daae5c0a5a6958"},
		{"workspace", KeyInput{ThreadID: "t1", SetupID: "dev", Provider: "local-process", Workspace: ws, Tenant: "acme"}, "sk_5546d1b41b570ebf12102441d53d6e18"},
		{"reuse none", KeyInput{ThreadID: "t1", SetupID: "dev", Provider: "local-process", Tenant: "acme", RunID: "r1"}, "sk_57b1312d7c7bd16bee12ab9fb7e9f84a"},
		{"unicode", KeyInput{ThreadID: "thr-é-🙂", SetupID: "s", Provider: "daytona", Tenant: "t_0"}, "sk_15c4a29d2c80e987c5c898c5050aaee8"},
	}
	for _, c := range cases {
		got, err := SandboxKey(c.in)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", c.name, got)
		if got != c.want {
			t.Errorf("%s: key %s, want %s", c.name, got, c.want)
		}
	}
}

func TestWorkspaceHashIgnoresSecrets(t *testing.T) {
	a, _ := WorkspaceHash(map[string]any{"repo": "x", "secrets": map[string]string{"K": "1"}})
	b, _ := WorkspaceHash(map[string]any{"repo": "x", "secrets": map[string]string{"K": "2"}})
	c, _ := WorkspaceHash(map[string]any{"repo": "y"})
	if a != b || a == c {
		t.Fatalf("hashes %s %s %s: secrets must not count, content must", a, b, c)
	}
}

func TestReuseNoneDiffersPerRun(t *testing.T) {
	in := KeyInput{ThreadID: "t", SetupID: "s", Provider: "p"}
	k0, _ := SandboxKey(in)
	in.RunID = "r1"
	k1, _ := SandboxKey(in)
	in.RunID = "r2"
	k2, _ := SandboxKey(in)
	if k0 == k1 || k1 == k2 {
		t.Fatalf("keys %s %s %s must differ", k0, k1, k2)
	}
}
