package awsfn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// fakeSecrets serves secrets from a map and counts reads.
type fakeSecrets struct {
	values map[string]string
	reads  int
}

func (f *fakeSecrets) Secret(_ context.Context, arn string) (string, error) {
	f.reads++
	v, ok := f.values[arn]
	if !ok {
		return "", errors.New("AccessDeniedException: not allowed")
	}
	return v, nil
}

func envOf(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

// baseEnv is a valid API function environment.
func baseEnv() map[string]string {
	return map[string]string{
		EnvTable:     "sandkeep",
		EnvProvider:  ProviderLocalProcess,
		EnvCursorKey: "0123456789abcdef0123",
		// IAM mode (the default) needs the roles trusted to name tenants.
		EnvTrustedRoleARNs: "arn:aws:iam::123456789012:role/app",
		// Every function of an IAM deployment is told the push's management endpoint.
		EnvPushEndpoint: "https://a1b2c3d4e5.execute-api.us-east-1.amazonaws.com/dev",
	}
}

func with(m map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func TestLoadRefusesNamingTheSetting(t *testing.T) {
	ctx := t.Context()
	reaperEnv := with(baseEnv(), EnvCursorKey, "", EnvDetachedTTLSeconds, "900")
	cases := []struct {
		name string
		fn   Function
		env  map[string]string
		want []string // substrings of the error
	}{
		{"no table", Resolve, with(baseEnv(), EnvTable, ""), []string{EnvTable}},
		{"no waiting place", Wait, with(baseEnv(), EnvMaxWaitingPerTenant, "0"), []string{EnvMaxWaitingPerTenant, "minimum 1"}},
		{"waiting bound not a number", Wait, with(baseEnv(), EnvMaxWaitingPerTenant, "many"), []string{EnvMaxWaitingPerTenant}},
		{"no cursor key", Detach, with(baseEnv(), EnvCursorKey, ""), []string{EnvCursorKeyARN, EnvCursorKey}},
		{"short cursor key", Log, with(baseEnv(), EnvCursorKey, "short"), []string{EnvCursorKey, "16"}},
		{"cursor key ARN not an ARN", Cancel, with(baseEnv(), EnvCursorKeyARN, "sandkeep/key"), []string{EnvCursorKeyARN}},
		{"cursor key ARN unreadable", Cancel, with(baseEnv(), EnvCursorKeyARN, "arn:aws:secretsmanager:us-east-1:1:secret:missing"), []string{EnvCursorKeyARN, "AccessDenied"}},
		{"no provider", Resolve, with(baseEnv(), EnvProvider, ""), []string{EnvProvider}},
		{"unknown provider", Resolve, with(baseEnv(), EnvProvider, "docker"), []string{EnvProvider, "docker"}},
		{"daytona without a key", Resolve, with(hosted(ProviderDaytona), EnvProviderAPIKey, ""), []string{EnvProviderSecretARN, EnvProviderAPIKey, "daytona API key"}},
		{"e2b without a key", Reaper, with(hosted(ProviderE2B), EnvCursorKey, "", EnvProviderAPIKey, ""), []string{EnvProviderSecretARN, "e2b API key"}},
		{"daytona key unreadable", Resolve, with(hosted(ProviderDaytona), EnvProviderSecretARN, "arn:aws:secretsmanager:us-east-1:1:secret:nope"), []string{EnvProviderSecretARN, "AccessDenied"}},
		{"daytona without a TTL", Resolve, with(hosted(ProviderDaytona), EnvDetachedTTLSeconds, ""), []string{EnvDetachedTTLSeconds, "sweep period"}},
		{"e2b without a schedule", Resolve, with(hosted(ProviderE2B), EnvReapSchedule, ""), []string{EnvReapSchedule}},
		{"e2b with a cron schedule", Reaper, with(hosted(ProviderE2B), EnvCursorKey, "", EnvReapSchedule, "cron(* * * * ? *)"), []string{EnvReapSchedule, "rate"}},
		{"daytona base URL with credentials", Resolve, with(hosted(ProviderDaytona), EnvDaytonaBaseURL, "https://u:pw@daytona.example/api"), []string{EnvDaytonaBaseURL}},
		{"e2b base URL relative", Resolve, with(hosted(ProviderE2B), EnvE2BBaseURL, "api.e2b.app"), []string{EnvE2BBaseURL}},
		{"e2b domain with a scheme", Resolve, with(hosted(ProviderE2B), EnvE2BDomain, "https://e2b.app"), []string{EnvE2BDomain}},
		{"sandbox dir outside /tmp", Resolve, with(baseEnv(), EnvSandboxDir, "/var/task/sb"), []string{EnvSandboxDir}},
		{"bad auth mode", Resolve, with(baseEnv(), EnvAuthMode, "OIDC"), []string{EnvAuthMode}},
		{"IAM without trusted roles", Resolve, with(baseEnv(), EnvTrustedRoleARNs, ""), []string{EnvTrustedRoleARNs, "names no role"}},
		{"IAM with trusted roles none", Log, with(baseEnv(), EnvAuthMode, AuthIAM, EnvTrustedRoleARNs, "none"), []string{EnvTrustedRoleARNs}},
		{"IAM trusting a user", Detach, with(baseEnv(), EnvTrustedRoleARNs, "arn:aws:iam::123456789012:user/admin"), []string{EnvTrustedRoleARNs, "user/admin"}},
		{"IAM trusting a session", Cancel, with(baseEnv(), EnvTrustedRoleARNs, "arn:aws:sts::123456789012:assumed-role/app/s1"), []string{EnvTrustedRoleARNs}},
		{"IAM trusting a wildcard", Resolve, with(baseEnv(), EnvTrustedRoleARNs, "arn:aws:iam::123456789012:role/*"), []string{EnvTrustedRoleARNs}},
		{"bad lock lease", Resolve, with(baseEnv(), EnvLockLeaseMs, "15s"), []string{EnvLockLeaseMs}},
		{"lock lease too short", Resolve, with(baseEnv(), EnvLockLeaseMs, "100"), []string{EnvLockLeaseMs, "minimum"}},
		{"reaper without TTL", Reaper, with(reaperEnv, EnvDetachedTTLSeconds, ""), []string{EnvDetachedTTLSeconds}},
		{"reaper with zero TTL", Reaper, with(reaperEnv, EnvDetachedTTLSeconds, "0"), []string{EnvDetachedTTLSeconds}},
		{"reaper shipping without a cursor key", Reaper, with(reaperEnv, EnvPublicURL, "https://api.example"), []string{EnvCursorKeyARN, EnvPublicURL}},
		{"unknown function", Function("billing"), baseEnv(), []string{"billing"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sec := &fakeSecrets{}
			_, err := Load(ctx, c.fn, envOf(c.env), sec)
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("Load: %v, want ErrConfig", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "pw@") || strings.Contains(err.Error(), hostedKey) {
				t.Errorf("error %q echoes a credential", err)
			}
		})
	}
}

// TestLoadReadsTheProviderKeyOnlyWhereUsed: the functions whose routes never call the
// provider (detach, cancel) start without its key or settings and never read its secret,
// even where the environment names one; resolve, log and the reaper read it.
func TestLoadReadsTheProviderKeyOnlyWhereUsed(t *testing.T) {
	const arn = "arn:aws:secretsmanager:us-east-1:1:secret:sandkeep/daytona"
	for _, fn := range Functions() {
		env := with(hosted(ProviderDaytona), EnvProviderAPIKey, "", EnvProviderSecretARN, arn)
		if fn == Reaper {
			env = with(env, EnvCursorKey, "")
		}
		sec := &fakeSecrets{values: map[string]string{arn: "dtn_secret"}}
		cfg, err := Load(t.Context(), fn, envOf(env), sec)
		if err != nil {
			t.Fatalf("%s: %v", fn, err)
		}
		if got := sec.reads == 1 && cfg.ProviderSecret == "dtn_secret"; got != fn.UsesProvider() {
			t.Errorf("%s: read the provider secret %v (%d reads), uses the provider %v", fn, got, sec.reads, fn.UsesProvider())
		}
		if !fn.UsesProvider() {
			if cfg.ProviderSecret != "" || cfg.Provider != "" || sec.reads != 0 {
				t.Errorf("%s: provider %q, key %q, %d secret reads; want none", fn, cfg.Provider, cfg.ProviderSecret, sec.reads)
			}
			// Nor does it need any provider setting, or an unreadable key, to start.
			bare := with(baseEnv(), EnvProvider, "", EnvProviderSecretARN, "arn:aws:secretsmanager:us-east-1:1:secret:denied")
			if _, err := Load(t.Context(), fn, envOf(bare), &fakeSecrets{}); err != nil {
				t.Errorf("%s without provider settings: %v", fn, err)
			}
		}
	}
	if !Resolve.UsesProvider() || !Reaper.UsesProvider() || !Log.UsesProvider() || Detach.UsesProvider() || !Cancel.UsesProvider() ||
		!Ship.UsesProvider() || Push.UsesProvider() {
		t.Error("UsesProvider: want resolve, log (finish), cancel (a shipped agent), ship (an end settles a one-run sandbox) and reaper only")
	}
}

// TestLoadShip: the Ship function's one credential is a run's ship token
// (docs/design.md §9): it loads the key that verifies tokens and no authentication setting — it starts
// without trusted roles in an IAM deployment, and neither a tenant claim nor an auth mode
// reaches its configuration — and refuses to start without the key.
func TestLoadShip(t *testing.T) {
	env := with(baseEnv(), EnvTrustedRoleARNs, "", EnvAuthMode, AuthIAM)
	cfg, err := Load(t.Context(), Ship, envOf(env), nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(cfg.CursorKey) == 0 || cfg.AuthMode != "" || cfg.TenantClaim != "" || cfg.TrustedRoles.Len() != 0 {
		t.Errorf("ship config: key %d bytes, auth %q, claim %q, %d trusted roles", len(cfg.CursorKey), cfg.AuthMode, cfg.TenantClaim, cfg.TrustedRoles.Len())
	}
	if _, err := Load(t.Context(), Ship, envOf(with(env, EnvCursorKey, "")), nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), EnvCursorKeyARN) {
		t.Errorf("Load without the cursor key: %v, want a refusal naming %s", err, EnvCursorKeyARN)
	}
}

// hostedKey is the plain provider API key of hosted(); no error may echo it.
const hostedKey = "prov-key-0123456789"

// hosted is a valid API function environment with a hosted provider.
func hosted(provider string) map[string]string {
	return with(baseEnv(), EnvProvider, provider, EnvProviderAPIKey, hostedKey,
		EnvDetachedTTLSeconds, "1800", EnvReapSchedule, "rate(5 minutes)")
}

func TestLoadHostedProviders(t *testing.T) {
	ctx := t.Context()
	sec := &fakeSecrets{values: map[string]string{"arn:aws:ssm:us-east-1:1:parameter/sandkeep/daytona": "dtn_from_ssm"}}
	// The key by ARN wins over a plain value; settings and the reaper's timing are read.
	cfg, err := Load(ctx, Resolve, envOf(with(hosted(ProviderDaytona),
		EnvProviderSecretARN, "arn:aws:ssm:us-east-1:1:parameter/sandkeep/daytona",
		EnvDaytonaBaseURL, "https://daytona.example/api", EnvDaytonaTarget, "eu", EnvDaytonaSnapshot, "snap-1")), sec)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ProviderSecret != "dtn_from_ssm" || sec.reads != 1 || cfg.DetachedTTL != 30*time.Minute || cfg.SweepPeriod != 5*time.Minute ||
		cfg.Daytona != (DaytonaSettings{BaseURL: "https://daytona.example/api", Target: "eu", Snapshot: "snap-1"}) || cfg.SandboxDir != "" {
		t.Fatalf("daytona config %+v after %d reads", cfg, sec.reads)
	}
	p, err := NewProvider(cfg)
	if err != nil || p.Name() != ProviderDaytona {
		t.Fatalf("daytona provider %v, %v", p, err)
	}

	// E2B from the plain key (no ARN), in the reaper.
	cfg, err = Load(ctx, Reaper, envOf(with(hosted(ProviderE2B), EnvCursorKey, "",
		EnvE2BTemplate, "agent", EnvE2BDomain, "e2b.example", EnvReapSchedule, "rate(1 minute)")), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ProviderSecret != hostedKey || cfg.SweepPeriod != time.Minute || cfg.E2B != (E2BSettings{Template: "agent", Domain: "e2b.example"}) {
		t.Fatalf("e2b config %+v", cfg)
	}
	p, err = NewProvider(cfg)
	if err != nil || p.Name() != ProviderE2B {
		t.Fatalf("e2b provider %v, %v", p, err)
	}
	// E2B's sandboxes live at least the detached TTL plus the sweep period.
	if lt := p.(interface{ Lifetime() time.Duration }).Lifetime(); lt < cfg.DetachedTTL+cfg.SweepPeriod {
		t.Fatalf("e2b lifetime %v below TTL %v + period %v", lt, cfg.DetachedTTL, cfg.SweepPeriod)
	}

	// local-process needs neither key nor timing, and reads the timing when given.
	cfg, err = Load(ctx, Resolve, envOf(with(baseEnv(), EnvReapSchedule, "rate(2 hours)")), nil)
	if err != nil || cfg.SweepPeriod != 2*time.Hour || cfg.ProviderSecret != "" || cfg.DetachedTTL != 0 {
		t.Fatalf("local-process config %+v, %v", cfg, err)
	}
}

func TestSchedulePeriod(t *testing.T) {
	for expr, want := range map[string]time.Duration{
		"rate(1 minute)": time.Minute, "rate(5 minutes)": 5 * time.Minute, "rate(1 hour)": time.Hour,
		"rate(3 hours)": 3 * time.Hour, "rate(1 day)": 24 * time.Hour,
		"rate(5 minute)": 0, "rate(1 minutes)": 0, "rate(0 minutes)": 0, "rate(05 minutes)": 0, "rate(-1 minute)": 0,
		"rate(1 second)": 0, "cron(0 * * * ? *)": 0, "rate(1 minute": 0, "": 0, "rate( minute)": 0,
	} {
		got, err := SchedulePeriod(expr)
		if got != want || (err == nil) != (want != 0) {
			t.Errorf("SchedulePeriod(%q) = %v, %v; want %v", expr, got, err, want)
		}
	}
}

func TestLoadAccepts(t *testing.T) {
	ctx := t.Context()
	sec := &fakeSecrets{values: map[string]string{
		"arn:aws:ssm:us-east-1:1:parameter/sandkeep/key": "a key from SSM, long enough",
	}}
	cfg, err := Load(ctx, Resolve, envOf(with(baseEnv(),
		EnvCursorKey, "", EnvCursorKeyARN, "arn:aws:ssm:us-east-1:1:parameter/sandkeep/key",
		EnvAuthMode, AuthJWT, EnvTenantClaim, "org", EnvLockLeaseMs, "9000", EnvLogRetentionDays, "7")), sec)
	if err != nil {
		t.Fatal(err)
	}
	if string(cfg.CursorKey) != "a key from SSM, long enough" || sec.reads != 1 {
		t.Fatalf("cursor key %q after %d reads", cfg.CursorKey, sec.reads)
	}
	if cfg.AuthMode != AuthJWT || cfg.TenantClaim != "org" || cfg.LockLease != 9*time.Second ||
		cfg.LogRetention != 7*24*time.Hour || cfg.DriverLease != time.Minute || cfg.SandboxDir != DefaultSandboxDir {
		t.Fatalf("config %+v", cfg)
	}

	// JWT mode names no trusted roles (the tenant comes from the token).
	if cfg, err := Load(ctx, Log, envOf(with(baseEnv(), EnvAuthMode, AuthJWT, EnvTrustedRoleARNs, "")), nil); err != nil || cfg.TrustedRoles.Len() != 0 {
		t.Fatalf("JWT without trusted roles: %+v, %v", cfg, err)
	}
	// IAM: a list of roles, with paths, partitions and spaces after commas.
	cfg, err = Load(ctx, Cancel, envOf(with(baseEnv(), EnvTrustedRoleARNs,
		"arn:aws:iam::123456789012:role/app, arn:aws-cn:iam::210987654321:role/ops/deploy/agent-runner")), nil)
	if err != nil || cfg.TrustedRoles.Len() != 2 || !cfg.TrustedRoles.Trusts("arn:aws-cn:sts::210987654321:assumed-role/agent-runner/build-7") {
		t.Fatalf("IAM trusted roles: %+v, %v", cfg, err)
	}

	// The ARN wins over a plain value; defaults fill the rest.
	cfg, err = Load(ctx, Detach, envOf(with(baseEnv(), EnvCursorKeyARN, "arn:aws:ssm:us-east-1:1:parameter/sandkeep/key")), sec)
	if err != nil || string(cfg.CursorKey) != "a key from SSM, long enough" || cfg.AuthMode != AuthIAM || cfg.TenantClaim != "tenant" {
		t.Fatalf("config %+v, %v", cfg, err)
	}

	// The reaper needs no cursor key but a TTL.
	cfg, err = Load(ctx, Reaper, envOf(map[string]string{
		EnvTable: "t", EnvProvider: ProviderLocalProcess, EnvDetachedTTLSeconds: "900", EnvSandboxDir: "/tmp/x/../sb",
	}), nil)
	if err != nil || cfg.DetachedTTL != 15*time.Minute || cfg.InstanceRetention != 7*24*time.Hour || cfg.CursorKey != nil || cfg.SandboxDir != "/tmp/sb" {
		t.Fatalf("reaper config %+v, %v", cfg, err)
	}
	// Told the API's address, it reads the cursor key: it starts shippers (docs/design.md §8.3).
	cfg, err = Load(ctx, Reaper, envOf(map[string]string{
		EnvTable: "t", EnvProvider: ProviderLocalProcess, EnvDetachedTTLSeconds: "900",
		EnvPublicURL: "https://abc.execute-api.us-east-1.amazonaws.com/", EnvCursorKeyARN: "arn:aws:ssm:us-east-1:1:parameter/sandkeep/key",
	}), sec)
	if err != nil || string(cfg.CursorKey) != "a key from SSM, long enough" || cfg.PublicURL != "https://abc.execute-api.us-east-1.amazonaws.com" {
		t.Fatalf("shipping reaper config %+v, %v", cfg, err)
	}
}

func TestSecretSettingForProviders(t *testing.T) {
	// The path every hosted provider's key takes: by ARN, else plain, else refused.
	ctx := t.Context()
	sec := &fakeSecrets{values: map[string]string{"arn:aws:secretsmanager:us-east-1:1:secret:daytona": "dtn_key"}}
	get := func(kv map[string]string) func(string) string { return envOf(kv) }
	v, err := secretSetting(ctx, get(map[string]string{EnvProviderSecretARN: "arn:aws:secretsmanager:us-east-1:1:secret:daytona"}), sec, EnvProviderSecretARN, EnvProviderAPIKey, "the daytona API key")
	if err != nil || v != "dtn_key" {
		t.Fatalf("secret %q, %v", v, err)
	}
	v, err = secretSetting(ctx, get(map[string]string{EnvProviderAPIKey: "plain"}), sec, EnvProviderSecretARN, EnvProviderAPIKey, "the daytona API key")
	if err != nil || v != "plain" {
		t.Fatalf("plain secret %q, %v", v, err)
	}
	_, err = secretSetting(ctx, get(nil), sec, EnvProviderSecretARN, EnvProviderAPIKey, "the daytona API key")
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), EnvProviderSecretARN) || !strings.Contains(err.Error(), "daytona API key") {
		t.Fatalf("missing secret: %v", err)
	}
}

func TestLogicalIDsAndRoutes(t *testing.T) {
	want := map[Function]string{Resolve: "ResolveFunction", Detach: "DetachFunction", Cancel: "CancelFunction", Log: "LogFunction", Wait: "WaitFunction", Reaper: "ReaperFunction", Push: "PushFunction", Ship: "ShipFunction"}
	seen := map[string]Function{}
	for _, f := range Functions() {
		if f.LogicalID() != want[f] {
			t.Errorf("%s: LogicalID %q, want %q", f, f.LogicalID(), want[f])
		}
		for _, r := range Routes(f) {
			if prev, dup := seen[r.Pattern()]; dup {
				t.Errorf("route %s on %s and %s", r.Pattern(), prev, f)
			}
			seen[r.Pattern()] = f
		}
	}
	if len(seen) != 32 || len(Routes(Reaper)) != 0 {
		t.Fatalf("%d routes, want the 32 of the API; reaper routes %v", len(seen), Routes(Reaper))
	}
}

func TestSandboxCommandsNeverSeeTheFunctionsCredentials(t *testing.T) {
	t.Setenv("AWS_SECRET_ACCESS_KEY", "the-role-secret")
	t.Setenv("AWS_SESSION_TOKEN", "the-role-token")
	dir := t.TempDir()
	prov, err := NewProvider(Config{Provider: ProviderLocalProcess, SandboxDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	id, err := prov.Create(t.Context(), contract.CreateInput{Name: "sk_env", Env: map[string]string{"MINE": "ok"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := prov.(contract.Executor).Exec(t.Context(), id, "env")
	if err != nil {
		t.Fatal(err)
	}
	env := string(res.Stdout)
	if strings.Contains(env, "the-role-secret") || strings.Contains(env, "the-role-token") || !strings.Contains(env, "MINE=ok") {
		t.Fatalf("sandbox environment:\n%s", env)
	}
}

// TestLoadMaxWaiting: SANDKEEP_MAX_WAITING_PER_TENANT is read once into Config (default
// httpapi.DefaultMaxWaiting) for every API function.
func TestLoadMaxWaiting(t *testing.T) {
	for env, want := range map[string]int{"": httpapi.DefaultMaxWaiting, "3": 3} {
		cfg, err := Load(t.Context(), Wait, envOf(with(baseEnv(), EnvMaxWaitingPerTenant, env)), nil)
		if err != nil || cfg.MaxWaiting != want {
			t.Errorf("%s=%q: MaxWaiting %d, %v; want %d", EnvMaxWaitingPerTenant, env, cfg.MaxWaiting, err, want)
		}
	}
}

// TestLoadPublicURL: SANDKEEP_PUBLIC_URL, when set, is an absolute http(s) URL (its
// trailing slash dropped); anything else refuses to start, naming the setting.
func TestLoadPublicURL(t *testing.T) {
	env := baseEnv()
	env[EnvPublicURL] = "https://abc.execute-api.eu-west-1.amazonaws.com/"
	cfg, err := Load(context.Background(), Resolve, envOf(env), &fakeSecrets{})
	if err != nil || cfg.PublicURL != "https://abc.execute-api.eu-west-1.amazonaws.com" {
		t.Fatalf("%q, %v", cfg.PublicURL, err)
	}
	env[EnvPublicURL] = "abc.execute-api.eu-west-1.amazonaws.com"
	if _, err := Load(context.Background(), Resolve, envOf(env), &fakeSecrets{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), EnvPublicURL) {
		t.Fatalf("a relative URL: %v", err)
	}
}

// TestLoadPushSettings: the push function needs the management endpoint (https, or http on
// loopback only) and takes its bounds; the others accept no bad endpoint either.
func TestLoadPushSettings(t *testing.T) {
	ctx := t.Context()
	cfg, err := Load(ctx, Push, envOf(with(baseEnv(), EnvCursorKey, "", EnvPushMaxConnections, "3", EnvPushMaxSubscriptions, "2")), nil)
	if err != nil || cfg.PushMaxConnections != 3 || cfg.PushMaxSubscriptions != 2 || cfg.PushEndpoint == "" || cfg.CursorKey != nil {
		t.Fatalf("push: %+v %v", cfg, err)
	}
	for _, c := range []struct {
		fn  Function
		env map[string]string
	}{
		{Push, with(baseEnv(), EnvPushEndpoint, "")},
		{Push, with(baseEnv(), EnvPushMaxConnections, "0")},
		{Log, with(baseEnv(), EnvPushEndpoint, "http://a1b2c3.execute-api.us-east-1.amazonaws.com/dev")},
		{Wait, with(baseEnv(), EnvPushEndpoint, "https://user:pw@a1b2c3.execute-api.us-east-1.amazonaws.com/dev")},
	} {
		if _, err := Load(ctx, c.fn, envOf(c.env), nil); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "SANDKEEP_PUSH_") {
			t.Errorf("%s %v: %v, want a refusal naming the push setting", c.fn, c.env, err)
		}
	}
}

// TestLoadIdleStop: SANDKEEP_IDLE_STOP_SECONDS (the template's IdleStopSeconds) is the
// deployment's idle grace (docs/design.md §5), 10 minutes when unset; 0 or a non-number
// refuses to start, naming the setting.
func TestLoadIdleStop(t *testing.T) {
	for env, want := range map[string]time.Duration{"": 10 * time.Minute, "120": 2 * time.Minute} {
		cfg, err := Load(t.Context(), Resolve, envOf(with(baseEnv(), EnvIdleStop, env)), &fakeSecrets{})
		if err != nil || cfg.IdleStop != want {
			t.Errorf("%s=%q: IdleStop %s, %v; want %s", EnvIdleStop, env, cfg.IdleStop, err, want)
		}
	}
	for _, bad := range []string{"0", "10m"} {
		if _, err := Load(t.Context(), Reaper, envOf(with(baseEnv(), EnvCursorKey, "", EnvDetachedTTLSeconds, "900", EnvIdleStop, bad)), &fakeSecrets{}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), EnvIdleStop) {
			t.Errorf("%s=%q: %v, want ErrConfig naming it", EnvIdleStop, bad, err)
		}
	}
}
