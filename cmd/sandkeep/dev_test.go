package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/providers"
)

// envOf is a fixed environment.
func envOf(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestParseDevProviders(t *testing.T) {
	t.Parallel()
	cfg, err := parseDev(nil, nil, io.Discard)
	if err != nil || cfg.provider.Name != providers.LocalProcess || cfg.provider.APIKey != "" || cfg.provider.SandboxDir == "" {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	env := envOf(map[string]string{envDaytonaAPIKey: " dtn_secret ", envE2BAPIKey: "e2b_secret"})
	cfg, err = parseDev([]string{"--provider", "daytona", "--base-url", "https://daytona.example/api", "--target", "eu"}, env, io.Discard)
	if err != nil || cfg.provider.Name != providers.Daytona || cfg.provider.APIKey != "dtn_secret" || cfg.provider.Daytona.BaseURL != "https://daytona.example/api" || cfg.provider.Daytona.Target != "eu" {
		t.Fatalf("daytona: %+v, %v", cfg, err)
	}
	cfg, err = parseDev([]string{"--provider", "e2b", "--template", "agent", "--reap-every", "1m", "--detached-ttl", "20m"}, env, io.Discard)
	if err != nil || cfg.provider.Name != providers.E2B || cfg.provider.APIKey != "e2b_secret" || cfg.provider.E2B.Template != "agent" {
		t.Fatalf("e2b: %+v, %v", cfg, err)
	}
	// The hosted provider gets the reaper's timing: E2B keeps sandboxes past TTL + period.
	p, err := providers.New(cfg.provider)
	where := cfg.provider.Where()
	if err != nil || p.Name() != providers.E2B || !strings.Contains(where, "https://api.e2b.app") {
		t.Fatalf("e2b provider %v %q %v", p, where, err)
	}
	if lt := p.(interface{ Lifetime() time.Duration }).Lifetime(); lt < 21*time.Minute {
		t.Fatalf("e2b lifetime %v, want past the 20m TTL + 1m period", lt)
	}
	cfg, err = parseDev([]string{"--provider", "daytona"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := providers.New(cfg.provider); err != nil || p.Name() != providers.Daytona || !strings.Contains(cfg.provider.Where(), "app.daytona.io") {
		t.Fatalf("daytona provider %v %q %v", p, cfg.provider.Where(), err)
	}
}

// TestDevProviderRefusals: each wrong provider configuration exits 2 naming what to fix,
// and never echoes an API key.
func TestDevProviderRefusals(t *testing.T) {
	t.Parallel()
	const key = "dtn_do_not_print"
	withKeys := envOf(map[string]string{envDaytonaAPIKey: key, envE2BAPIKey: key})
	type refusal struct {
		args []string
		env  func(string) string
		want string
	}
	cases := []refusal{
		{[]string{"dev", "--provider", "daytona"}, nil, envDaytonaAPIKey},
		{[]string{"dev", "--provider", "e2b"}, envOf(map[string]string{envDaytonaAPIKey: key}), envE2BAPIKey},
		{[]string{"dev", "--provider", "docker"}, withKeys, "want local-process, daytona or e2b"},
		{[]string{"dev", "--provider", "e2b", "--target", "eu"}, withKeys, "--target applies to --provider daytona"},
		{[]string{"dev", "--provider", "daytona", "--template", "x"}, withKeys, "--template applies to --provider e2b"},
		{[]string{"dev", "--provider", "daytona", "--sandbox-dir", "/tmp/x"}, withKeys, "--sandbox-dir applies to --provider local-process"},
		{[]string{"dev", "--base-url", "https://x.example"}, withKeys, "--base-url applies to --provider daytona or e2b"},
		{[]string{"dev", "--provider", "daytona", "--base-url", "https://u:pw@x.example"}, withKeys, "--base-url: want"},
		{[]string{"dev", "--provider", "e2b", "--base-url", "api.e2b.app"}, withKeys, "--base-url: want"},
		{[]string{"dev", "--provider", "e2b", "--snapshot", "s"}, withKeys, "--snapshot applies to --provider daytona"},
		{[]string{"dev", "--provider", "daytona", "--domain", "x.example"}, withKeys, "--domain applies to --provider e2b"},
		{[]string{"dev", "--provider", "e2b", "--domain", "https://e2b.app"}, withKeys, "--domain: want a bare domain"},
	}
	// The operator commands take the same provider flags (providerFlags) and refuse alike.
	for _, c := range cases {
		for _, cmd := range [][]string{{"reap", "--once", "--detached-ttl", "1m"}, {"runs", "finish", "--force", "r1", "--tenant", "t"}} {
			cases = append(cases, refusal{append(cmd, c.args[1:]...), c.env, c.want})
		}
	}
	cases = append(cases, refusal{[]string{"dev", "--provider", "daytona", "--api-key", key}, withKeys, "flag provided but not defined: -api-key"})
	for _, c := range cases {
		var out, errOut bytes.Buffer
		code := run(context.Background(), c.args, streams{out: &out, err: &errOut, env: c.env})
		if code != 2 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("sandkeep %v: exit %d, stderr %q; want exit 2 mentioning %q", c.args, code, errOut.String(), c.want)
		}
		if strings.Contains(errOut.String(), "pw@") || strings.Contains(errOut.String()+out.String(), key) {
			t.Errorf("sandkeep %v echoed a credential: %s", c.args, errOut.String())
		}
	}
}

// TestDevServesHostedProvider: dev starts with a hosted provider whose key comes from the
// environment, names it, prints a curl example for it and never prints the key.
func TestDevServesHostedProvider(t *testing.T) {
	t.Parallel()
	const key = "dtn_never_printed"
	out, errOut := &outBuffer{}, &outBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--addr", "127.0.0.1:0", "--provider", "daytona", "--base-url", "http://127.0.0.1:9/api", "--reap-every", "1h"},
			streams{out: out, err: errOut, env: envOf(map[string]string{envDaytonaAPIKey: key})})
	}()
	out.waitFor(t, listeningRE, "listening line")
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("dev exit %d:\n%s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dev did not shut down")
	}
	if !strings.Contains(out.String(), "provider: daytona at http://127.0.0.1:9/api") || !strings.Contains(out.String(), `"provider":"daytona"`) {
		t.Fatalf("dev output does not name the provider:\n%s", out.String())
	}
	if strings.Contains(out.String()+errOut.String(), key) {
		t.Fatalf("dev printed the API key:\n%s\n%s", out.String(), errOut.String())
	}
}

// TestParseDevShipping: --public-url must be an absolute http(s) URL (its trailing slash
// dropped); SANDKEEP_CURSOR_KEY, when set, is the key and must be long enough.
func TestParseDevShipping(t *testing.T) {
	t.Parallel()
	cfg, err := parseDev([]string{"--public-url", "http://127.0.0.1:9000/"}, envOf(map[string]string{envCursorKey: "0123456789abcdef0123"}), io.Discard)
	if err != nil || cfg.publicURL != "http://127.0.0.1:9000" || string(cfg.cursorKey) != "0123456789abcdef0123" {
		t.Fatalf("%+v, %v", cfg, err)
	}
	if cfg, err := parseDev(nil, envOf(nil), io.Discard); err != nil || cfg.publicURL != "" || cfg.cursorKey != nil {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	for _, bad := range []string{"127.0.0.1:9000", "ftp://x", "http://", "http://x/?q=1"} {
		if _, err := parseDev([]string{"--public-url", bad}, nil, io.Discard); err == nil {
			t.Errorf("--public-url %q accepted", bad)
		}
	}
	if _, err := parseDev(nil, envOf(map[string]string{envCursorKey: "short"}), io.Discard); err == nil || !strings.Contains(err.Error(), envCursorKey) {
		t.Fatalf("a short key: %v", err)
	}
}

// TestParseDevIdleStop: --idle-stop is the dev server's idle grace (docs/design.md §5),
// keeper.DefaultIdleStop when absent; a non-positive one is a usage error naming it.
func TestParseDevIdleStop(t *testing.T) {
	t.Parallel()
	for args, want := range map[string]time.Duration{"": 10 * time.Minute, "--idle-stop 90s": 90 * time.Second} {
		cfg, err := parseDev(strings.Fields(args), nil, io.Discard)
		if err != nil || cfg.idleStop != want {
			t.Errorf("%q: idle stop %s, %v; want %s", args, cfg.idleStop, err, want)
		}
	}
	for _, bad := range []string{"0s", "-1m"} {
		if _, err := parseDev([]string{"--idle-stop", bad}, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "--idle-stop") {
			t.Errorf("--idle-stop %s: %v, want a usage error naming it", bad, err)
		}
	}
}
