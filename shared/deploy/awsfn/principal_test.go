package awsfn

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// TestTrustedRolesMatchSessions: a role ARN (with or without a path) trusts exactly the
// assumed-role sessions of that role: same partition, account and name, any session name.
func TestTrustedRolesMatchSessions(t *testing.T) {
	roles, err := ParseTrustedRoles("arn:aws:iam::123456789012:role/service/sandkeep-caller,arn:aws:iam::123456789012:role/Ops")
	if err != nil {
		t.Fatal(err)
	}
	for arn, want := range map[string]bool{
		"arn:aws:sts::123456789012:assumed-role/sandkeep-caller/i-0abc":         true, // the role's path is not in the session ARN
		"arn:aws:sts::123456789012:assumed-role/sandkeep-caller/botocore-12345": true,
		"arn:aws:sts::123456789012:assumed-role/Ops/alice@example.com":          true,
		"arn:aws:sts::123456789012:assumed-role/AdministratorAccess/alice":      false, // an admin may invoke, not name tenants
		"arn:aws:sts::123456789012:assumed-role/PowerUser/ci":                   false,
		"arn:aws:sts::123456789012:assumed-role/ops/alice":                      false, // role names match exactly
		"arn:aws:sts::123456789012:assumed-role/sandkeep-caller-2/x":            false,
		"arn:aws:sts::999999999999:assumed-role/sandkeep-caller/x":              false, // same name, another account
		"arn:aws-us-gov:sts::123456789012:assumed-role/sandkeep-caller/x":       false, // another partition
		"arn:aws:iam::123456789012:user/sandkeep-caller":                        false, // an IAM user of the same name
		"arn:aws:iam::123456789012:root":                                        false,
		"arn:aws:sts::123456789012:federated-user/sandkeep-caller":              false,
		"arn:aws:iam::123456789012:role/service/sandkeep-caller":                false, // a role is never the caller itself
		"arn:aws:sts::123456789012:assumed-role/sandkeep-caller":                false, // no session
		"arn:aws:sts::123456789012:assumed-role/sandkeep-caller/x/y":            false,
		"arn:aws:sts::123456789012:assumed-role/service/sandkeep-caller/x":      false,
		" arn:aws:sts::123456789012:assumed-role/sandkeep-caller/x":             false,
		"arn:aws:sts::123456789012:assumed-role/sandkeep-caller/x\n":            false,
		"": false,
	} {
		if got := roles.Trusts(arn); got != want {
			t.Errorf("Trusts(%q) = %v, want %v", arn, got, want)
		}
	}
	if (TrustedRoles{}).Trusts("arn:aws:sts::123456789012:assumed-role/Ops/x") {
		t.Error("an empty list trusts someone")
	}
	for _, bad := range []string{"", " , ", "none", "*", "arn:aws:iam::123456789012:role/*", "arn:aws:iam::123456789012:user/ops",
		"arn:aws:iam::12345:role/ops", "arn:aws:iam::123456789012:role/", "arn:aws:iam::123456789012:role//ops",
		"arn:aws:sts::123456789012:assumed-role/ops/s", "arn:aws:iam::123456789012:role/ops,arn:aws:iam::123456789012:root"} {
		if _, err := ParseTrustedRoles(bad); err == nil {
			t.Errorf("ParseTrustedRoles(%q) accepted", bad)
		}
	}
}

// TestIAMUntrustedPrincipalRefused: under IAM, a principal the authorizer let through that
// is not a session of a trusted role gets 403 untrusted-principal on every route of every
// API function, with or without a tenant header, and nothing is written; the trusted role's
// session is served. Before the fix any principal named any tenant.
func TestIAMUntrustedPrincipalRefused(t *testing.T) {
	s := newStack(t, AuthIAM)
	untrusted := []string{
		"arn:aws:sts::123456789012:assumed-role/AdministratorAccess/alice",
		"arn:aws:iam::123456789012:user/app", // the trusted role's name, as a user
		"arn:aws:iam::123456789012:root",
		"arn:aws:sts::999999999999:assumed-role/app/i-0abc123",
		"",
	}
	n := 0
	for _, caller := range untrusted {
		for _, header := range []map[string]string{{httpapi.TenantHeader: "victim"}, nil} {
			for _, f := range Functions() {
				for _, rt := range Routes(f) {
					p := strings.NewReplacer("{runId}", "run-v", "{threadId}", "thread-v").Replace(rt.Path)
					ev := event(rt.Method, rt.Pattern(), p, "", routeBody(rt, ""), header, nil)
					ev.RequestContext.Authorizer.IAM.UserARN = caller
					resp, m := call(t, s.fns[f], ev)
					if resp.StatusCode != http.StatusForbidden || m["code"] != httpapi.CodeUntrustedPrincipal ||
						resp.Headers["Content-Type"] != httpapi.ProblemContentType {
						t.Fatalf("%q on %s: %d %v, want 403 %s", caller, rt.Pattern(), resp.StatusCode, m, httpapi.CodeUntrustedPrincipal)
					}
					if caller != "" && !strings.Contains(m["detail"].(string), caller) {
						t.Errorf("detail %q does not name the principal", m["detail"])
					}
					n++
				}
			}
		}
	}
	if st, _ := refstore.Runs(s.backend.Runs()).Get(contract.WithTenant(t.Context(), "victim"), "run-j"); st != nil {
		t.Fatal("an untrusted principal's start created a run")
	}
	if !strings.Contains(s.logs.String(), `"code":"untrusted-principal"`) || !strings.Contains(s.logs.String(), "AdministratorAccess") {
		t.Errorf("the refusals are not logged with the principal:\n%s", s.logs.String())
	}
	// The trusted role's session names its tenant.
	rt := Routes(Resolve)[0]
	resp, m := call(t, s.fns[Resolve], event(rt.Method, rt.Pattern(), rt.Path, "", routeBody(rt, ""), map[string]string{httpapi.TenantHeader: "victim"}, nil))
	if resp.StatusCode != 200 {
		t.Fatalf("trusted session's start: %d %v", resp.StatusCode, m)
	}
	t.Logf("%d untrusted requests refused", n)
}
