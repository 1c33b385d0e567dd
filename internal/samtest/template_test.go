package samtest

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/awslabs/goformation/v7"
	"github.com/awslabs/goformation/v7/cloudformation"
	"github.com/awslabs/goformation/v7/intrinsics"

	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
)

// spec8Routes is the docs/design.md §8 table's route → function column, written out independently of
// awsfn.Routes (which TestRoutesMatchSpec compares against it).
var spec8Routes = map[string]string{
	"POST /v1/runs":                         "ResolveFunction",
	"POST /v1/runs/{runId}/attach":          "ResolveFunction",
	"GET /v1/runs/{runId}":                  "ResolveFunction",
	"POST /v1/runs/{runId}/snapshot":        "ResolveFunction",
	"GET /v1/threads/{threadId}/active-run": "ResolveFunction",
	"POST /v1/runs/{runId}/heartbeat":       "DetachFunction",
	"POST /v1/runs/{runId}/detach":          "DetachFunction",
	"POST /v1/runs/{runId}/cancel":          "CancelFunction",
	"POST /v1/threads/{threadId}/cancel":    "CancelFunction",
	"POST /v1/runs/{runId}/events":          "LogFunction",
	"GET /v1/runs/{runId}/events":           "WaitFunction",
	"POST /v1/runs/{runId}/finish":          "LogFunction",
	"POST /v1/runs/{runId}/agent":           "ResolveFunction",
	"POST /v1/runs/{runId}/pump":            "WaitFunction",
	"GET /v1/runs":                          "ResolveFunction",
	"GET /v1/runs/{runId}/view":             "ResolveFunction",
	// A JWT deployment's push tickets (docs/design.md §8.1); 501 in an IAM one.
	"POST /v1/push/ticket": "ResolveFunction",
	// The ship routes: no authorizer, the run's ship token their only credential; the Ship
	// function serves them alone (also from its own URL).
	"GET /v1/ship":                   "ShipFunction",
	"POST /v1/runs/{runId}/ship":     "ShipFunction",
	"POST /v1/runs/{runId}/ship/end": "ShipFunction",
	// The reference store surface (TanStack AI's stores).
	"GET /v1/store/instances/{key}":               "ResolveFunction",
	"PUT /v1/store/instances/{key}":               "ResolveFunction",
	"DELETE /v1/store/instances/{key}":            "ResolveFunction",
	"POST /v1/store/runs":                         "ResolveFunction",
	"GET /v1/store/runs/{runId}":                  "ResolveFunction",
	"PATCH /v1/store/runs/{runId}":                "ResolveFunction",
	"GET /v1/store/threads/{threadId}/active-run": "ResolveFunction",
	"GET /v1/store/threads/{threadId}/runs":       "ResolveFunction",
	"GET /v1/store/reclaimable":                   "ResolveFunction",
	"POST /v1/store/locks/{key}/acquire":          "ResolveFunction",
	"POST /v1/store/locks/{key}/renew":            "ResolveFunction",
	"POST /v1/store/locks/{key}/release":          "ResolveFunction",
}

// shipRoutes are the routes without an authorizer: a run's shipper's, its ship token the only
// credential (docs/design.md §8.2). Every other route requires the deployment's authorizer.
var shipRoutes = map[string]bool{"GET /v1/ship": true, "POST /v1/runs/{runId}/ship": true, "POST /v1/runs/{runId}/ship/end": true}

var functionIDs = []string{"ResolveFunction", "DetachFunction", "CancelFunction", "LogFunction", "WaitFunction", "ReaperFunction", "PushFunction", "ShipFunction"}

// parseGoformation parses template.yaml with goformation v7, Ref overridden: a resource
// becomes "ref:<LogicalId>", a parameter its default (numbers as numbers), so wiring is
// assertable and typed fields still unmarshal. One placeholder pass comes first: a Ref to
// a Number parameter inside Environment.Variables becomes its default as a string (a Ref
// yields a string there in CloudFormation; goformation's typed structs refuse a number).
func parseGoformation(t *testing.T) *cloudformation.Template {
	t.Helper()
	tree := loadTree(t)
	params := mapOf(tree["Parameters"])
	numberDefault := func(name string) (string, bool) {
		p := mapOf(params[name])
		if p == nil || p["Type"] != "Number" {
			return "", false
		}
		if d, ok := p["Default"]; ok {
			return fmt.Sprint(d), true
		}
		return "0", true // no default (DetachedRunTtlSeconds): a deploy must set it
	}
	envs := []any{path(tree, "Globals", "Function", "Environment", "Variables")}
	for _, id := range functionIDs {
		envs = append(envs, path(tree, "Resources", id, "Properties", "Environment", "Variables"))
	}
	for _, e := range envs {
		vars := mapOf(e)
		for k, v := range vars {
			if name, arg, ok := intrinsic(v); ok && name == "Ref" {
				if d, isNum := numberDefault(fmt.Sprint(arg)); isNum {
					vars[k] = d
				}
			}
		}
	}
	// goformation's Parameter struct wants MinValue/MaxValue as numbers, its schema as
	// strings (TestTemplateMatchesGoformationSAMSchema): the template follows the schema.
	for _, p := range params {
		for _, k := range []string{"MinValue", "MaxValue"} {
			if v, ok := mapOf(p)[k].(string); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("parameter bound %s=%q", k, v)
				}
				mapOf(p)[k] = f
			}
		}
	}
	b, err := json.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	ref := func(_ string, input any, _ any) any {
		name, _ := input.(string)
		if p, ok := params[name]; ok {
			if d, isNum := numberDefault(name); isNum {
				n, _ := strconv.Atoi(d)
				return n
			}
			return mapOf(p)["Default"]
		}
		return "ref:" + name
	}
	tmpl, err := goformation.ParseJSONWithOptions(b, &intrinsics.ProcessorOptions{
		IntrinsicHandlerOverrides: map[string]intrinsics.IntrinsicHandler{"Ref": ref},
	})
	if err != nil {
		t.Fatalf("goformation: %v", err)
	}
	return tmpl
}

// functionOf returns the function whose template LogicalId is id.
func functionOf(t *testing.T, id string) awsfn.Function {
	t.Helper()
	for _, f := range awsfn.Functions() {
		if f.LogicalID() == id {
			return f
		}
	}
	t.Fatalf("no function has LogicalId %s", id)
	return ""
}

func TestRoutesMatchSpec(t *testing.T) {
	got := map[string]string{}
	for _, f := range awsfn.Functions() {
		for _, r := range awsfn.Routes(f) {
			got[r.Pattern()] = f.LogicalID()
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(spec8Routes) {
		t.Fatalf("awsfn.Routes:\n%v\ndocs/design.md §8:\n%v", got, spec8Routes)
	}
}

func TestTemplateFunctions(t *testing.T) {
	tmpl := parseGoformation(t)
	tree := loadTree(t)
	globals := mapOf(path(tree, "Globals", "Function"))
	fns := tmpl.GetAllServerlessFunctionResources()
	if len(fns) != len(functionIDs) {
		t.Fatalf("%d functions, want %v", len(fns), functionIDs)
	}
	for _, id := range functionIDs {
		fn, ok := fns[id]
		if !ok {
			t.Fatalf("no function %s", id)
		}
		raw := mapOf(path(tree, "Resources", id, "Properties"))
		// goformation does not merge Globals: merge them ourselves (function wins).
		merged := func(k string) any {
			if v, ok := raw[k]; ok {
				return v
			}
			return globals[k]
		}
		if merged("Runtime") != "provided.al2023" || merged("Handler") != "bootstrap" ||
			fmt.Sprint(merged("Architectures")) != "[arm64]" {
			t.Errorf("%s: runtime %v handler %v architectures %v", id, merged("Runtime"), merged("Handler"), merged("Architectures"))
		}
		if fn.CodeUri == nil || fn.CodeUri.String == nil || *fn.CodeUri.String != "." {
			t.Errorf("%s: CodeUri must be the module root (the Makefile builds from it)", id)
		}
		if fmt.Sprint(fn.AWSCloudFormationMetadata["BuildMethod"]) != "makefile" {
			t.Errorf("%s: BuildMethod %v, want makefile", id, fn.AWSCloudFormationMetadata["BuildMethod"])
		}
		if path(merged("LoggingConfig"), "LogFormat") != "JSON" {
			t.Errorf("%s: logs are not JSON", id)
		}
		// Timeouts: API functions answer within 25 s (API Gateway cuts at 29-30 s).
		if id != "ReaperFunction" && (fn.Timeout != nil || globals["Timeout"] != 25) {
			t.Errorf("%s: timeout must be the global 25 s", id)
		}
		// Every setting awsfn.Load requires is wired.
		env := map[string]any{}
		for k, v := range mapOf(path(globals, "Environment", "Variables")) {
			env[k] = v
		}
		for k, v := range mapOf(path(raw, "Environment", "Variables")) {
			env[k] = v
		}
		// The provider's settings and the reaper's TTL and period reach every function
		// (hosted sandboxes must outlive a detached run until the reaper expired it); the
		// provider's key only those that call the provider.
		need := []string{awsfn.EnvTable, awsfn.EnvProvider, awsfn.EnvLockLeaseMs, awsfn.EnvDriverLeaseMs, awsfn.EnvLogRetentionDays,
			awsfn.EnvDetachedTTLSeconds, awsfn.EnvReapSchedule, awsfn.EnvDaytonaBaseURL, awsfn.EnvDaytonaTarget, awsfn.EnvDaytonaSnapshot,
			awsfn.EnvE2BTemplate, awsfn.EnvE2BDomain, awsfn.EnvE2BBaseURL}
		usesProvider := functionOf(t, id).UsesProvider()
		if usesProvider {
			need = append(need, awsfn.EnvProviderSecretARN)
		} else if _, ok := env[awsfn.EnvProviderSecretARN]; ok {
			t.Errorf("%s never calls the provider but is told its secret (%s)", id, awsfn.EnvProviderSecretARN)
		}
		need = append(need, awsfn.EnvPushEndpoint) // every function that stores events pushes them
		switch id {
		case "ReaperFunction":
			// It replaces dead shippers (docs/design.md §8.3): their tokens' key and the
			// API's address, which a scheduled event cannot carry.
			need = append(need, awsfn.EnvInstanceRetention, awsfn.EnvIdleStop, awsfn.EnvCursorKeyARN, awsfn.EnvPublicURL)
		case "PushFunction": // it authenticates $connect and signs no cursor (TestTemplatePush: a JWT deployment's verifies tickets)
			need = append(need, awsfn.EnvAuthMode, awsfn.EnvTrustedRoleARNs)
		case "ShipFunction":
			// The ship token is its only credential: the key that verifies it, and no
			// authentication setting at all (docs/design.md §9).
			need = append(need, awsfn.EnvCursorKeyARN)
			for _, k := range []string{awsfn.EnvAuthMode, awsfn.EnvTenantClaim, awsfn.EnvTrustedRoleARNs, awsfn.EnvPublicURL} {
				if _, ok := env[k]; ok {
					t.Errorf("%s is told %s: the ship routes take no caller's authentication and start no shipper", id, k)
				}
			}
		default:
			need = append(need, awsfn.EnvCursorKeyARN, awsfn.EnvAuthMode, awsfn.EnvTenantClaim, awsfn.EnvTrustedRoleARNs)
		}
		for _, k := range need {
			if _, ok := env[k]; !ok {
				t.Errorf("%s: environment lacks %s", id, k)
			}
		}
		if fmt.Sprint(env[awsfn.EnvTable]) != "map[Ref:Table]" {
			t.Errorf("%s: %s = %v, want !Ref Table", id, awsfn.EnvTable, env[awsfn.EnvTable])
		}
		if _, ok := env[awsfn.EnvCursorKey]; ok {
			t.Errorf("%s: a plain cursor key in the template", id)
		}
		if _, ok := env[awsfn.EnvProviderAPIKey]; ok {
			t.Errorf("%s: a plain provider API key in the template", id)
		}
		refs := map[string]string{
			awsfn.EnvProvider:     "Provider",
			awsfn.EnvReapSchedule: "ReapSchedule", awsfn.EnvDaytonaBaseURL: "DaytonaBaseUrl", awsfn.EnvDaytonaTarget: "DaytonaTarget",
			awsfn.EnvDaytonaSnapshot: "DaytonaSnapshot", awsfn.EnvE2BTemplate: "E2bTemplate", awsfn.EnvE2BDomain: "E2bDomain",
			awsfn.EnvE2BBaseURL: "E2bBaseUrl",
		}
		if usesProvider {
			refs[awsfn.EnvProviderSecretARN] = "ProviderSecretArn"
		}
		if id != "ReaperFunction" && id != "ShipFunction" {
			refs[awsfn.EnvTrustedRoleARNs] = "TrustedRoleArns"
		}
		for k, param := range refs {
			if fmt.Sprint(env[k]) != "map[Ref:"+param+"]" {
				t.Errorf("%s: %s = %v, want !Ref %s", id, k, env[k], param)
			}
		}
		// A Number parameter's Ref was replaced by its default above: check the raw tree.
		if fmt.Sprint(path(globals, "Environment", "Variables", awsfn.EnvDetachedTTLSeconds)) != "map[Ref:DetachedRunTtlSeconds]" {
			t.Errorf("%s is not the DetachedRunTtlSeconds parameter in Globals", awsfn.EnvDetachedTTLSeconds)
		}
	}

	// Routes: every docs/design.md §8 route on its function, on the one API, nothing else.
	seen := map[string]string{}
	for _, id := range functionIDs {
		for name, ev := range fns[id].Events {
			switch ev.Type {
			case "HttpApi":
				h := ev.Properties.HttpApiEvent
				if h == nil || h.ApiId == nil || *h.ApiId != "ref:Api" || h.Method == nil || h.Path == nil {
					t.Errorf("%s.%s: HttpApi event must name ApiId !Ref Api, a method and a path", id, name)
					continue
				}
				key := strings.ToUpper(*h.Method) + " " + *h.Path
				if prev, dup := seen[key]; dup {
					t.Errorf("route %s on %s and %s", key, prev, id)
				}
				seen[key] = id
			case "ScheduleV2":
				if id != "ReaperFunction" {
					t.Errorf("%s has a schedule", id)
				}
			default:
				t.Errorf("%s.%s: unexpected event type %s", id, name, ev.Type)
			}
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(spec8Routes) {
		t.Fatalf("template routes:\n%v\ndocs/design.md §8:\n%v", seen, spec8Routes)
	}
}

func TestTemplateAPIAuthAndThrottling(t *testing.T) {
	tree := loadTree(t)
	api := mapOf(path(tree, "Resources", "Api"))
	if api["Type"] != "AWS::Serverless::HttpApi" {
		t.Fatalf("Api is %v", api["Type"])
	}
	props := mapOf(api["Properties"])
	if _, ok := props["Auth"]; ok {
		// SAM requires Auth.DefaultAuthorizer to be a literal, so a SAM-level Auth cannot
		// switch between IAM and JWT per deployment; the body does it (below).
		t.Fatal("Api.Auth is set: authorization lives in the OpenAPI body")
	}
	rs := mapOf(props["DefaultRouteSettings"])
	if fmt.Sprint(rs["ThrottlingBurstLimit"]) != "map[Ref:ThrottlingBurstLimit]" || fmt.Sprint(rs["ThrottlingRateLimit"]) != "map[Ref:ThrottlingRateLimit]" {
		t.Fatalf("route throttling not wired to parameters: %v", rs)
	}
	// The body, as written, declares exactly the docs/design.md §8 routes.
	body := mapOf(props["DefinitionBody"])
	bodyRoutes := map[string]bool{}
	for p, item := range mapOf(body["paths"]) {
		for m := range mapOf(item) {
			bodyRoutes[strings.ToUpper(m)+" "+p] = true
		}
	}
	if len(bodyRoutes) != len(spec8Routes) {
		t.Fatalf("body routes %v, want the %d of docs/design.md §8", bodyRoutes, len(spec8Routes))
	}
	for r := range spec8Routes {
		if !bodyRoutes[r] {
			t.Errorf("the OpenAPI body lacks %s", r)
		}
	}
	// Resolved for an IAM and a JWT deployment: every route requires the mode's
	// authorizer, which is defined, and the other mode's is absent.
	for mode, params := range map[string]map[string]string{"IAM": paramSets(t)["defaults"], "JWT": paramSets(t)["jwt-ssm"]} {
		resolved := resolveTemplate(t, tree, params)
		rb := mapOf(path(resolved, "Resources", "Api", "Properties", "DefinitionBody"))
		schemes := mapOf(path(rb, "components", "securitySchemes"))
		want, other := "AWS_IAM", "JwtAuthorizer"
		if mode == "JWT" {
			want, other = other, want
		}
		if len(schemes) != 1 || schemes[want] == nil || schemes[other] != nil {
			t.Fatalf("%s: security schemes %v", mode, schemes)
		}
		if mode == "IAM" && path(schemes[want], "x-amazon-apigateway-authtype") != "awsSigv4" {
			t.Fatalf("IAM scheme %v", schemes[want])
		}
		if mode == "JWT" {
			jc := path(schemes[want], "x-amazon-apigateway-authorizer")
			if path(jc, "type") != "jwt" || path(jc, "jwtConfiguration", "issuer") != params["JwtIssuer"] ||
				fmt.Sprint(path(jc, "jwtConfiguration", "audience")) != "["+params["JwtAudience"]+"]" ||
				path(jc, "identitySource") != "$request.header.Authorization" {
				t.Fatalf("JWT authorizer %v", jc)
			}
		}
		open := 0
		for p, item := range mapOf(rb["paths"]) {
			for m, op := range mapOf(item) {
				sec, isList := path(op, "security").([]any)
				if shipRoutes[strings.ToUpper(m)+" "+p] {
					// The ship routes have no authorizer: an empty requirement (absent would
					// let a default authorizer apply).
					if !isList || len(sec) != 0 {
						t.Errorf("%s: ship route %s %s security %v, want []", mode, m, p, path(op, "security"))
					}
					open++
					continue
				}
				if len(sec) != 1 || len(mapOf(sec[0])) != 1 || mapOf(sec[0])[want] == nil {
					t.Errorf("%s: %s %s security %v, want [{%s: []}]", mode, m, p, path(op, "security"), want)
				}
			}
		}
		if open != len(shipRoutes) {
			t.Errorf("%s: %d routes without an authorizer, want the %d ship routes", mode, open, len(shipRoutes))
		}
	}
	// JWT-specific parameters have no effect on an IAM deployment and are documented.
	for _, p := range []string{"AuthMode", "JwtIssuer", "JwtAudience", "TenantClaim", "ThrottlingBurstLimit", "ThrottlingRateLimit"} {
		if path(tree, "Parameters", p, "Description") == nil {
			t.Errorf("parameter %s undocumented", p)
		}
	}
}

// TestTemplateWaitingIsolated: the routes that may wait — a read with waitMs, a pump —
// are served by functions that serve none of append, finish or cancel, and every function
// has a reserved concurrency of its own parameter, so waiting requests (however many, of
// however many tenants) can never take the capacity appends, finishes and cancels need;
// the Wait function is told the per-tenant bound of waiting requests (MaxWaitingPerTenant).
// Before, polls, pumps, appends and finishes shared the Log function's reservation.
func TestTemplateWaitingIsolated(t *testing.T) {
	tree := loadTree(t)
	waiting := []string{"GET /v1/runs/{runId}/events", "POST /v1/runs/{runId}/pump"}
	needed := []string{"POST /v1/runs/{runId}/events", "POST /v1/runs/{runId}/finish",
		"POST /v1/runs/{runId}/cancel", "POST /v1/threads/{threadId}/cancel"}
	served := map[string]string{} // route → function LogicalId, from the template's events
	for _, id := range functionIDs {
		for _, ev := range mapOf(path(tree, "Resources", id, "Properties", "Events")) {
			if path(ev, "Type") == "HttpApi" {
				served[strings.ToUpper(fmt.Sprint(path(ev, "Properties", "Method")))+" "+fmt.Sprint(path(ev, "Properties", "Path"))] = id
			}
		}
	}
	reserved := map[string]string{} // function → its concurrency parameter
	for _, id := range functionIDs {
		reserved[id] = fmt.Sprint(path(tree, "Resources", id, "Properties", "ReservedConcurrentExecutions"))
	}
	for _, w := range waiting {
		for _, n := range needed {
			fw, fn := served[w], served[n]
			if fw == "" || fn == "" {
				t.Fatalf("routes %s (%q) and %s (%q) must both be served", w, fw, n, fn)
			}
			if fw == fn {
				t.Errorf("%s and %s are both served by %s: waiting requests take the capacity %s needs", w, n, fw, n)
			}
			if reserved[fw] == reserved[fn] {
				t.Errorf("%s (%s) and %s (%s) share the reservation %s", fw, w, fn, n, reserved[fw])
			}
		}
	}
	if got := fmt.Sprint(path(tree, "Resources", "WaitFunction", "Properties", "Environment", "Variables", awsfn.EnvMaxWaitingPerTenant)); got != "map[Ref:MaxWaitingPerTenant]" {
		t.Errorf("WaitFunction: %s = %s, want !Ref MaxWaitingPerTenant", awsfn.EnvMaxWaitingPerTenant, got)
	}
}

// TestTemplateReservedConcurrency: every API function has a reserved concurrency from a
// parameter (the wait function, which holds the long polls and pumps, its own), so a
// flood of polls is throttled at that cap instead of taking the account's Lambda
// concurrency; every parameter set reserves less than a default account can give (1,000
// less the 100 Lambda keeps unreserved).
func TestTemplateReservedConcurrency(t *testing.T) {
	tree := loadTree(t)
	want := map[string]string{
		"ResolveFunction": "ApiFunctionConcurrency", "DetachFunction": "ApiFunctionConcurrency",
		"CancelFunction": "ApiFunctionConcurrency", "LogFunction": "LogFunctionConcurrency",
		"WaitFunction": "WaitFunctionConcurrency", "ReaperFunction": "ReaperConcurrency",
		"PushFunction": "ApiFunctionConcurrency", "ShipFunction": "ShipFunctionConcurrency",
	}
	if len(want) != len(functionIDs) {
		t.Fatalf("functions %v", functionIDs)
	}
	for _, id := range functionIDs {
		if got := fmt.Sprint(path(tree, "Resources", id, "Properties", "ReservedConcurrentExecutions")); got != "map[Ref:"+want[id]+"]" {
			t.Errorf("%s: ReservedConcurrentExecutions %s, want !Ref %s", id, got, want[id])
		}
	}
	if path(tree, "Globals", "Function", "ReservedConcurrentExecutions") != nil {
		t.Error("a global reserved concurrency would give every function the same cap")
	}
	for _, p := range []string{"ApiFunctionConcurrency", "LogFunctionConcurrency", "ShipFunctionConcurrency", "WaitFunctionConcurrency", "MaxWaitingPerTenant"} {
		pm := mapOf(path(tree, "Parameters", p))
		if pm["Type"] != "Number" || pm["MinValue"] != "1" || pm["Default"] == nil || pm["Description"] == nil {
			// 0 would throttle every request of the function.
			t.Errorf("parameter %s: %v; want a Number, at least 1, with a default and a description", p, pm)
		}
	}
	for name, params := range paramSets(t) {
		r := newResolver(t, tree, params)
		total := 0
		for _, id := range functionIDs {
			n, err := strconv.Atoi(r.params[want[id]])
			if err != nil || n < 1 {
				t.Errorf("%s: %s = %q", name, want[id], r.params[want[id]])
			}
			total += n
		}
		if total > 900 {
			t.Errorf("%s: the functions reserve %d concurrent executions; a default account (1,000) cannot", name, total)
		}
		t.Logf("%s: %d concurrent executions reserved (API functions %s each, log %s, ship %s, wait %s, reaper %s)", name, total,
			r.params["ApiFunctionConcurrency"], r.params["LogFunctionConcurrency"], r.params["ShipFunctionConcurrency"],
			r.params["WaitFunctionConcurrency"], r.params["ReaperConcurrency"])
	}
}

// TestTemplateTrustedRoles: TrustedRoleArns is required (no default), its pattern takes a
// list of role ARNs or "none" and nothing else, every API function gets it, and each
// samconfig environment gives IAM a role and JWT none; awsfn.Load refuses an IAM function
// given "none".
func TestTemplateTrustedRoles(t *testing.T) {
	tree := loadTree(t)
	p := mapOf(path(tree, "Parameters", "TrustedRoleArns"))
	if p == nil || p["Type"] != "String" || p["Description"] == nil {
		t.Fatalf("parameter TrustedRoleArns: %v", p)
	}
	if _, ok := p["Default"]; ok {
		t.Error("TrustedRoleArns has a default: every deployment must say whom it trusts")
	}
	pat := regexp.MustCompile(fmt.Sprint(p["AllowedPattern"]))
	for v, ok := range map[string]bool{
		"none": true,
		"arn:aws:iam::123456789012:role/agent-host":                             true,
		"arn:aws:iam::123456789012:role/service/agent-host":                     true,
		"arn:aws:iam::123456789012:role/a, arn:aws-cn:iam::210987654321:role/b": true,
		"arn:aws:iam::123456789012:role/a,arn:aws:iam::123456789012:role/ops/b": true,
		"":                                     false,
		"*":                                    false,
		"arn:aws:iam::123456789012:role/*":     false,
		"arn:aws:iam::123456789012:user/admin": false,
		"arn:aws:iam::123456789012:root":       false,
		"arn:aws:sts::123456789012:assumed-role/a/s":                         false,
		"arn:aws:iam::123456789012:role/a,":                                  false,
		"none,arn:aws:iam::123456789012:role/a":                              false,
		"arn:aws:iam::1234:role/a":                                           false,
		"arn:aws:iam::123456789012:role/a,arn:aws:iam::123456789012:user/b":  false,
		"arn:aws:iam::123456789012:role/a arn:aws:iam::123456789012:role/b":  false,
		"arn:aws:iam::123456789012:role/a\narn:aws:iam::123456789012:role/b": false,
	} {
		if pat.MatchString(v) != ok {
			t.Errorf("TrustedRoleArns pattern on %q: %v", v, !ok)
		}
		// Whatever the pattern takes (but "none"), the functions parse to the same roles.
		if ok && v != "none" {
			if _, err := awsfn.ParseTrustedRoles(v); err != nil {
				t.Errorf("the template takes %q, the functions refuse it: %v", v, err)
			}
		}
	}
	for _, id := range functionIDs {
		env := mapOf(path(tree, "Resources", id, "Properties", "Environment", "Variables"))
		got, has := env[awsfn.EnvTrustedRoleARNs]
		// The reaper names no tenant for anyone; the Ship function's one credential is a
		// run's ship token.
		if (id != "ReaperFunction" && id != "ShipFunction") != has || (has && fmt.Sprint(got) != "map[Ref:TrustedRoleArns]") {
			t.Errorf("%s: %s = %v", id, awsfn.EnvTrustedRoleARNs, got)
		}
	}
	for env, o := range samconfigOverrides(t) {
		mode := o["AuthMode"]
		if mode == "" {
			mode = fmt.Sprint(path(tree, "Parameters", "AuthMode", "Default"))
		}
		roles, err := awsfn.ParseTrustedRoles(o["TrustedRoleArns"])
		switch {
		case mode == "IAM" && (err != nil || roles.Len() == 0):
			t.Errorf("samconfig %s: IAM without trusted roles (%q): %v", env, o["TrustedRoleArns"], err)
		case mode == "JWT" && o["TrustedRoleArns"] != "none":
			t.Errorf("samconfig %s: JWT with TrustedRoleArns %q, want none", env, o["TrustedRoleArns"])
		}
	}
	// An IAM deployment given "none" deploys, but its functions refuse to start.
	params := maps.Clone(paramSets(t)["defaults"])
	params["TrustedRoleArns"] = "none"
	env := functionEnv(resolveTemplate(t, tree, params), "ResolveFunction")
	env[awsfn.EnvCursorKeyARN], env[awsfn.EnvCursorKey] = "", testCursorKey
	env[awsfn.EnvProvider] = awsfn.ProviderLocalProcess
	if _, err := awsfn.Load(t.Context(), awsfn.Resolve, func(k string) string { return env[k] }, nil); err == nil ||
		!strings.Contains(err.Error(), awsfn.EnvTrustedRoleARNs) {
		t.Errorf("an IAM function with TrustedRoleArns none: %v, want a refusal naming %s", err, awsfn.EnvTrustedRoleARNs)
	}
}

var ratePeriod = regexp.MustCompile(`^rate\((\d+) (minute|minutes|hour|hours)\)$`)

// periodSeconds returns the period of a rate expression, checking unit pluralisation.
func periodSeconds(expr string) (int, error) {
	m := ratePeriod.FindStringSubmatch(expr)
	if m == nil {
		return 0, fmt.Errorf("%q is not a rate expression", expr)
	}
	n, _ := strconv.Atoi(m[1])
	if (n == 1) != (m[2] == "minute" || m[2] == "hour") {
		return 0, fmt.Errorf("%q: unit must be singular for 1, plural otherwise", expr)
	}
	if strings.HasPrefix(m[2], "hour") {
		return n * 3600, nil
	}
	return n * 60, nil
}

// TestTemplateReaperShipsToTheAPI: the functions that start shippers — the Resolve
// function (agent, attach) and the reaper, which replaces dead shippers
// (docs/design.md §8.3) — are given the Ship function's URL (the ShipUrl output; docs/design.md §9)
// unless PublicUrl overrides it, and they start on that environment, the reaper holding
// the cursor key that mints the shippers' tokens.
func TestTemplateReaperShipsToTheAPI(t *testing.T) {
	tree := loadTree(t)
	if sn := path(tree, "Resources", "Api", "Properties", "StageName"); sn != nil {
		t.Fatalf("the HTTP API names a stage (%v): its URL, and the reaper's, would need it", sn)
	}
	// The defaults' provider is hosted: it needs its key.
	base := maps.Clone(paramSets(t)["defaults"])
	base["ProviderSecretArn"] = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sandkeep/provider-AbCdEf"
	custom := maps.Clone(base)
	custom["PublicUrl"] = "https://sandkeep.example.com/api"
	for name, params := range map[string]map[string]string{"function URL": base, "PublicUrl": custom} {
		resolved := resolveTemplate(t, tree, params)
		env := functionEnv(resolved, "ReaperFunction")
		want := fmt.Sprint(path(resolved, "Outputs", "ShipUrl", "Value"))
		if !strings.Contains(want, ".lambda-url.") {
			t.Fatalf("the ShipUrl output %q is not the Ship function's URL", want)
		}
		if params["PublicUrl"] != "" {
			want = params["PublicUrl"]
		}
		if got := env[awsfn.EnvPublicURL]; got != want {
			t.Errorf("%s: the reaper's %s = %q, want %q", name, awsfn.EnvPublicURL, got, want)
		}
		renv := functionEnv(resolved, "ResolveFunction")
		if got := renv[awsfn.EnvPublicURL]; got != want {
			t.Errorf("%s: the Resolve function's %s = %q, want %q", name, awsfn.EnvPublicURL, got, want)
		}
		rcfg, err := awsfn.Load(t.Context(), awsfn.Resolve, func(k string) string { return renv[k] }, &recordingSecrets{arns: map[string]bool{}})
		if err != nil || rcfg.PublicURL != strings.TrimSuffix(want, "/") {
			t.Errorf("%s: the Resolve function loads public URL %q (%v), want %q", name, rcfg.PublicURL, err, want)
		}
		cfg, err := awsfn.Load(t.Context(), awsfn.Reaper, func(k string) string { return env[k] }, &recordingSecrets{arns: map[string]bool{}})
		if err != nil {
			t.Fatalf("%s: the reaper refuses its environment: %v", name, err)
		}
		if cfg.PublicURL != strings.TrimSuffix(want, "/") || len(cfg.CursorKey) == 0 {
			t.Errorf("%s: the reaper loads public URL %q and a %d-byte cursor key: it would start no shipper", name, cfg.PublicURL, len(cfg.CursorKey))
		}
	}
}

func TestTemplateReaperSchedule(t *testing.T) {
	tree := loadTree(t)
	props := mapOf(path(tree, "Resources", "ReaperFunction", "Properties"))
	var sched map[string]any
	for _, ev := range mapOf(props["Events"]) {
		if path(ev, "Type") == "ScheduleV2" {
			if sched != nil {
				t.Fatal("two schedules")
			}
			sched = mapOf(path(ev, "Properties"))
		}
	}
	if sched == nil {
		t.Fatal("the reaper has no ScheduleV2 event")
	}
	if fmt.Sprint(sched["ScheduleExpression"]) != "map[Ref:ReapSchedule]" {
		t.Errorf("ScheduleExpression %v", sched["ScheduleExpression"])
	}
	if path(sched, "FlexibleTimeWindow", "Mode") != "OFF" {
		t.Errorf("FlexibleTimeWindow %v, want Mode OFF", sched["FlexibleTimeWindow"])
	}
	if path(sched, "RetryPolicy", "MaximumRetryAttempts") != 0 {
		t.Errorf("RetryPolicy %v, want 0 retries", sched["RetryPolicy"])
	}
	if fmt.Sprint(path(sched, "DeadLetterConfig", "Arn")) != "map[Fn::GetAtt:[ReaperDeadLetterQueue Arn]]" {
		t.Errorf("DeadLetterConfig %v", sched["DeadLetterConfig"])
	}
	// A failed sweep (the invocation is asynchronous) is not retried and reaches the DLQ.
	if path(props, "EventInvokeConfig", "MaximumRetryAttempts") != 0 ||
		fmt.Sprint(path(props, "DeadLetterQueue", "TargetArn")) != "map[Fn::GetAtt:[ReaperDeadLetterQueue Arn]]" {
		t.Errorf("reaper async failure handling: %v / %v", props["EventInvokeConfig"], props["DeadLetterQueue"])
	}
	if fmt.Sprint(props["ReservedConcurrentExecutions"]) != "map[Ref:ReaperConcurrency]" {
		t.Errorf("ReservedConcurrentExecutions %v, want the ReaperConcurrency parameter", props["ReservedConcurrentExecutions"])
	}
	if fmt.Sprint(props["Timeout"]) != "map[Ref:ReaperTimeoutSeconds]" {
		t.Errorf("Timeout %v", props["Timeout"])
	}
	// The timeout stays below the period for the defaults and every samconfig environment.
	for name, params := range paramSets(t) {
		r := newResolver(t, tree, params)
		period, err := periodSeconds(r.params["ReapSchedule"])
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		timeout, _ := strconv.Atoi(r.params["ReaperTimeoutSeconds"])
		if timeout <= 0 || timeout >= period {
			t.Errorf("%s: reaper timeout %d s is not below the period %d s", name, timeout, period)
		}
		ttl, _ := strconv.Atoi(r.params["DetachedRunTtlSeconds"])
		if ttl < 60 {
			t.Errorf("%s: DetachedRunTtlSeconds %d", name, ttl)
		}
		// The functions read the same period from SANDKEEP_REAP_SCHEDULE (hosted providers
		// size their sandboxes' lifetime by it).
		if d, err := awsfn.SchedulePeriod(r.params["ReapSchedule"]); err != nil || d != time.Duration(period)*time.Second {
			t.Errorf("%s: awsfn.SchedulePeriod(%q) = %v, %v; want %d s", name, r.params["ReapSchedule"], d, err, period)
		}
	}
	// The parameter pattern refuses the serverless-patterns typo "rate(5 minute)".
	pat := regexp.MustCompile(fmt.Sprint(path(tree, "Parameters", "ReapSchedule", "AllowedPattern")))
	for expr, ok := range map[string]bool{"rate(1 minute)": true, "rate(5 minutes)": true, "rate(5 minute)": false, "rate(1 minutes)": false, "cron(* * * * ? *)": false} {
		if pat.MatchString(expr) != ok {
			t.Errorf("ReapSchedule pattern on %q: %v", expr, !ok)
		}
	}
}

func TestTemplateParameters(t *testing.T) {
	tree := loadTree(t)
	params := mapOf(tree["Parameters"])
	for _, p := range []string{"Stage", "DetachedRunTtlSeconds", "LockLeaseMs", "DriverLeaseMs", "InstanceRetentionSeconds", "IdleStopSeconds",
		"LogRetentionDays", "Provider", "ProviderSecretArn", "CursorKeySecretArn", "ReaperConcurrency", "ReapSchedule", "ReaperTimeoutSeconds",
		"DaytonaBaseUrl", "DaytonaTarget", "DaytonaSnapshot", "E2bTemplate", "E2bDomain", "E2bBaseUrl"} {
		if params[p] == nil {
			t.Errorf("parameter %s missing", p)
		}
	}
	// Provider settings are optional (empty = the provider's default) and documented.
	for _, p := range []string{"ProviderSecretArn", "DaytonaBaseUrl", "DaytonaTarget", "DaytonaSnapshot", "E2bTemplate", "E2bDomain", "E2bBaseUrl"} {
		if d, ok := mapOf(params[p])["Default"]; !ok || d != "" || path(params, p, "Description") == nil {
			t.Errorf("parameter %s: default %v, description %v; want \"\" and a description", p, d, path(params, p, "Description"))
		}
	}
	for p, cases := range map[string]map[string]bool{
		"DaytonaBaseUrl":    {"": true, "https://app.daytona.io/api": true, "http://127.0.0.1:3000/api": true, "app.daytona.io": false},
		"E2bBaseUrl":        {"": true, "https://api.e2b.app": true, "ftp://x": false},
		"ProviderSecretArn": {"": true, "arn:aws:ssm:us-east-1:1:parameter/k": true, "sandkeep/daytona": false},
	} {
		pat := regexp.MustCompile(fmt.Sprint(path(params, p, "AllowedPattern")))
		for v, ok := range cases {
			if pat.MatchString(v) != ok {
				t.Errorf("%s pattern on %q: %v", p, v, !ok)
			}
		}
	}
	// prod runs on a hosted provider with its key in a secret (local-process is a smoke test).
	prod := samconfigOverrides(t)["prod"]
	if (prod["Provider"] != awsfn.ProviderDaytona && prod["Provider"] != awsfn.ProviderE2B) || prod["ProviderSecretArn"] == "" {
		t.Errorf("samconfig prod: provider %q with secret %q; want daytona or e2b with a ProviderSecretArn", prod["Provider"], prod["ProviderSecretArn"])
	}
	if _, ok := mapOf(params["DetachedRunTtlSeconds"])["Default"]; ok {
		t.Error("DetachedRunTtlSeconds has a default; it must be set per environment")
	}
	for env, o := range samconfigOverrides(t) {
		if o["DetachedRunTtlSeconds"] == "" || o["CursorKeySecretArn"] == "" {
			t.Errorf("samconfig %s does not set DetachedRunTtlSeconds and CursorKeySecretArn", env)
		}
		if o["AuthMode"] == "JWT" && (o["JwtIssuer"] == "" || o["JwtAudience"] == "") {
			t.Errorf("samconfig %s: JWT without issuer and audience", env)
		}
		if (o["Provider"] == "daytona" || o["Provider"] == "e2b") && o["ProviderSecretArn"] == "" {
			t.Errorf("samconfig %s: provider %s without its secret", env, o["Provider"])
		}
	}
	allowed := fmt.Sprint(path(params, "Provider", "AllowedValues"))
	for _, p := range []string{awsfn.ProviderDaytona, awsfn.ProviderE2B, awsfn.ProviderLocalProcess} {
		if !strings.Contains(allowed, p) {
			t.Errorf("Provider parameter does not allow %s", p)
		}
	}
}

// policyStatements returns the statements of a function's inline policies, with the
// condition each sits under ("" = unconditional).
func policyStatements(t *testing.T, tree map[string]any, fn string) (stmts []map[string]any, conds []string) {
	t.Helper()
	pols, ok := path(tree, "Resources", fn, "Properties", "Policies").([]any)
	if !ok {
		t.Fatalf("%s: Policies must be a list of inline policies", fn)
	}
	for _, p := range pols {
		cond := ""
		if name, arg, ok := intrinsic(p); ok {
			args, _ := arg.([]any)
			if name != "Fn::If" || len(args) != 3 || fmt.Sprint(args[2]) != "map[Ref:AWS::NoValue]" {
				t.Fatalf("%s: policy %v: only Fn::If [cond, policy, AWS::NoValue] is allowed", fn, p)
			}
			cond, p = fmt.Sprint(args[0]), args[1]
		}
		m := mapOf(p)
		if m == nil {
			t.Fatalf("%s: policy %v is not an inline policy document (SAM policy templates are not allowed)", fn, p)
		}
		for _, s := range m["Statement"].([]any) {
			stmts = append(stmts, mapOf(s))
			conds = append(conds, cond)
		}
	}
	return stmts, conds
}

// actionsOf returns a statement's actions as written (an Fn::If yields both branches).
func actionsOf(s map[string]any) []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case []any:
			for _, c := range x {
				walk(c)
			}
		case map[string]any:
			if name, arg, ok := intrinsic(x); ok && name == "Fn::If" {
				walk(arg.([]any)[1:])
			}
		}
	}
	walk(s["Action"])
	return out
}

// dynamoActions returns the DynamoDB actions of fn's policies, sorted.
func dynamoActions(t *testing.T, tree map[string]any, fn string) []string {
	stmts, conds := policyStatements(t, tree, fn)
	set := map[string]bool{}
	for i, s := range stmts {
		for _, a := range actionsOf(s) {
			if strings.HasPrefix(a, "dynamodb:") {
				if conds[i] != "" {
					t.Errorf("%s: DynamoDB statement under condition %s", fn, conds[i])
				}
				set[a] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

func TestTemplatePolicies(t *testing.T) {
	tree := loadTree(t)
	raw, err := os.ReadFile(templatePath)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"DynamoDBCrudPolicy", "DynamoDBReadPolicy", "DynamoDBWritePolicy", "dynamodb:Scan", "dynamodb:*", "dynamodb:BatchWriteItem", "dynamodb:DeleteTable"} {
		if strings.Contains(string(raw), bad) {
			t.Errorf("template.yaml mentions %s", bad)
		}
	}
	for _, fn := range functionIDs {
		stmts, conds := policyStatements(t, tree, fn)
		var cursor, provider bool
		for i, s := range stmts {
			if s["Effect"] != "Allow" {
				t.Errorf("%s: statement %v is not Allow", fn, s["Sid"])
			}
			for _, a := range actionsOf(s) {
				if a == "*" || strings.HasSuffix(a, ":*") {
					t.Errorf("%s: wildcard action %s", fn, a)
				}
			}
			res := fmt.Sprint(s["Resource"])
			if res == "*" || strings.Contains(res, " *") || strings.HasPrefix(res, "[*") {
				t.Errorf("%s: wildcard resource %v", fn, s["Resource"])
			}
			for _, a := range actionsOf(s) {
				if strings.HasPrefix(a, "dynamodb:") && !strings.Contains(res, "Table") {
					t.Errorf("%s: %s not scoped to the table: %v", fn, a, s["Resource"])
				}
			}
			switch s["Sid"] {
			case "CursorKey":
				cursor = true
				// The push function verifies tickets with it in a JWT deployment only.
				want := map[bool]string{false: "", true: "UseJwt"}[fn == "PushFunction"]
				if conds[i] != want || fmt.Sprint(s["Resource"]) != "map[Ref:CursorKeySecretArn]" ||
					fmt.Sprint(s["Action"]) != "map[Fn::If:[CursorKeyInSsm [ssm:GetParameter] [secretsmanager:GetSecretValue]]]" {
					t.Errorf("%s: cursor-key statement %v (condition %q)", fn, s, conds[i])
				}
			case "ProviderSecret":
				provider = true
				if conds[i] != "HasProviderSecret" || fmt.Sprint(s["Resource"]) != "map[Ref:ProviderSecretArn]" ||
					fmt.Sprint(s["Action"]) != "map[Fn::If:[ProviderSecretInSsm [ssm:GetParameter] [secretsmanager:GetSecretValue]]]" {
					t.Errorf("%s: provider-secret statement %v (condition %q)", fn, s, conds[i])
				}
			}
		}
		if !cursor {
			t.Errorf("%s: no cursor-key statement (API functions sign cursors, they and the reaper mint ship tokens, the push function verifies push tickets)", fn)
		}
		if provider != functionOf(t, fn).UsesProvider() {
			t.Errorf("%s: provider-secret statement present %v; the function calls the provider %v", fn, provider, functionOf(t, fn).UsesProvider())
		}
		if len(dynamoActions(t, tree, fn)) == 0 {
			t.Errorf("%s: no DynamoDB statement", fn)
		}
	}
	// The provider-secret statement exists exactly when a secret is configured (HasProviderSecret),
	// reading that secret with the action of its store.
	for name, params := range paramSets(t) {
		resolved := resolveTemplate(t, tree, params)
		arn := params["ProviderSecretArn"]
		want := "secretsmanager:GetSecretValue"
		if strings.HasPrefix(arn, "arn:aws:ssm:") {
			want = "ssm:GetParameter"
		}
		for _, fn := range functionIDs {
			var found []any
			for _, pol := range asList(path(resolved, "Resources", fn, "Properties", "Policies")) {
				for _, st := range asList(path(pol, "Statement")) {
					if path(st, "Sid") == "ProviderSecret" {
						found = append(found, st)
					}
				}
			}
			switch {
			case !functionOf(t, fn).UsesProvider() && len(found) != 0:
				t.Errorf("%s: %s never calls the provider but may read its secret: %v", name, fn, found)
			case !functionOf(t, fn).UsesProvider():
			case arn == "" && len(found) != 0:
				t.Errorf("%s: %s: provider-secret statement without a ProviderSecretArn: %v", name, fn, found)
			case arn != "" && (len(found) != 1 || path(found[0], "Resource") != arn || fmt.Sprint(path(found[0], "Action")) != "["+want+"]"):
				t.Errorf("%s: %s: provider-secret statements %v; want one granting %s on %s", name, fn, found, want, arn)
			}
		}
	}
}

func TestTemplateTableMatchesCreateTable(t *testing.T) {
	tmpl := parseGoformation(t)
	tbl, err := tmpl.GetDynamoDBTableWithName("Table")
	if err != nil {
		t.Fatal(err)
	}
	if string(tbl.AWSCloudFormationDeletionPolicy) != "Retain" || string(tbl.AWSCloudFormationUpdateReplacePolicy) != "Retain" {
		t.Errorf("DeletionPolicy %q UpdateReplacePolicy %q, want Retain", tbl.AWSCloudFormationDeletionPolicy, tbl.AWSCloudFormationUpdateReplacePolicy)
	}
	if tbl.BillingMode == nil || *tbl.BillingMode != "PAY_PER_REQUEST" {
		t.Error("table is not on-demand")
	}
	if tbl.PointInTimeRecoverySpecification == nil || tbl.PointInTimeRecoverySpecification.PointInTimeRecoveryEnabled == nil || !*tbl.PointInTimeRecoverySpecification.PointInTimeRecoveryEnabled {
		t.Error("point-in-time recovery is off")
	}
	if tbl.TimeToLiveSpecification == nil || tbl.TimeToLiveSpecification.AttributeName == nil || *tbl.TimeToLiveSpecification.AttributeName != "gcAt" || !tbl.TimeToLiveSpecification.Enabled {
		t.Error("TTL is not on gcAt")
	}

	want := dynamostore.CreateTableInput("x")
	norm := func(parts ...string) string { return strings.Join(parts, " ") }
	var gotAttrs, wantAttrs []string
	for _, a := range tbl.AttributeDefinitions {
		gotAttrs = append(gotAttrs, norm(a.AttributeName, a.AttributeType))
	}
	for _, a := range want.AttributeDefinitions {
		wantAttrs = append(wantAttrs, norm(*a.AttributeName, string(a.AttributeType)))
	}
	var gotKeys, wantKeys []string
	for _, k := range tbl.KeySchema {
		gotKeys = append(gotKeys, norm(k.AttributeName, k.KeyType))
	}
	for _, k := range want.KeySchema {
		wantKeys = append(wantKeys, norm(*k.AttributeName, string(k.KeyType)))
	}
	var gotGSIs, wantGSIs []string
	for _, g := range tbl.GlobalSecondaryIndexes {
		s := g.IndexName
		for _, k := range g.KeySchema {
			s += " " + norm(k.AttributeName, k.KeyType)
		}
		s += " " + *g.Projection.ProjectionType
		nk := slices.Clone(g.Projection.NonKeyAttributes)
		sort.Strings(nk)
		gotGSIs = append(gotGSIs, s+" "+strings.Join(nk, ","))
	}
	for _, g := range want.GlobalSecondaryIndexes {
		s := *g.IndexName
		for _, k := range g.KeySchema {
			s += " " + norm(*k.AttributeName, string(k.KeyType))
		}
		s += " " + string(g.Projection.ProjectionType)
		nk := slices.Clone(g.Projection.NonKeyAttributes)
		sort.Strings(nk)
		wantGSIs = append(wantGSIs, s+" "+strings.Join(nk, ","))
	}
	for _, pair := range [][2][]string{{gotAttrs, wantAttrs}, {gotKeys, wantKeys}, {gotGSIs, wantGSIs}} {
		g, w := slices.Clone(pair[0]), slices.Clone(pair[1])
		sort.Strings(g)
		sort.Strings(w)
		if !slices.Equal(g, w) || len(g) == 0 {
			t.Errorf("template.yaml and dynamostore.CreateTable disagree:\ntemplate: %q\nGo:       %q", g, w)
		}
	}
	if len(tbl.LocalSecondaryIndexes) != len(want.LocalSecondaryIndexes) {
		t.Errorf("local indexes: template %d, Go %d", len(tbl.LocalSecondaryIndexes), len(want.LocalSecondaryIndexes))
	}
}

func TestTemplateAlarms(t *testing.T) {
	tmpl := parseGoformation(t)
	alarms := tmpl.GetAllCloudWatchAlarmResources()
	type want struct{ ns, metric, dimName, dimValue string }
	wants := map[string]want{
		"ReclaimFailedAlarm":    {"Sandkeep", "ReapOutcome", "Outcome", "reclaim-failed"},
		"ReaperDeadLetterAlarm": {"AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", ""},
		"Api5xxAlarm":           {"AWS/ApiGateway", "5xx", "ApiId", "ref:Api"},
	}
	for id, w := range wants {
		a, ok := alarms[id]
		if !ok {
			t.Errorf("no alarm %s", id)
			continue
		}
		if a.Namespace == nil || *a.Namespace != w.ns || a.MetricName == nil || *a.MetricName != w.metric ||
			len(a.Dimensions) != 1 || a.Dimensions[0].Name != w.dimName || (w.dimValue != "" && a.Dimensions[0].Value != w.dimValue) {
			t.Errorf("%s: %s/%s %+v", id, deref(a.Namespace), deref(a.MetricName), a.Dimensions)
		}
		if a.ComparisonOperator != "GreaterThanThreshold" || a.Threshold == nil || a.AlarmDescription == nil || !strings.Contains(*a.AlarmDescription, "docs/deploy.md") {
			t.Errorf("%s: operator %s threshold %v description %v", id, a.ComparisonOperator, a.Threshold, a.AlarmDescription)
		}
	}
	tree := loadTree(t)
	if fmt.Sprint(path(tree, "Resources", "ReaperDeadLetterAlarm", "Properties", "Dimensions")) != "[map[Name:QueueName Value:map[Fn::GetAtt:[ReaperDeadLetterQueue QueueName]]]]" {
		t.Error("the DLQ alarm does not watch the reaper's queue")
	}
	if v := path(tree, "Resources", "ReclaimFailedAlarm", "Properties", "Threshold"); v != 0 {
		t.Errorf("reclaim-failed threshold %v, want > 0", v)
	}
}

// asList returns v as a list (nil when it is none).
func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestTemplatePush: the push's WebSocket API exists in every deployment, routes $connect
// (IAM-authenticated, or in a JWT deployment unauthorized at API Gateway: the push function
// verifies its push ticket), $disconnect, subscribe, unsubscribe and $default to the push
// function, which API Gateway alone may invoke from this API; ManageConnections is granted
// on this API's stage alone, and only to the functions that push what they store (resolve,
// log, wait, the reaper) and to the push function. Only a JWT deployment tells the resolve
// function the push URL (it issues tickets) and the push function the cursor key.
func TestTemplatePush(t *testing.T) {
	tree := loadTree(t)
	res := mapOf(path(tree, "Resources"))
	routes := map[string]string{}
	for id, r := range res {
		m := mapOf(r)
		if strings.HasPrefix(fmt.Sprint(m["Type"]), "AWS::ApiGatewayV2::") || id == "PushFunction" || id == "PushInvokePermission" {
			if m["Condition"] != nil {
				t.Errorf("%s: condition %v, want none (both modes serve the push)", id, m["Condition"])
			}
		}
		if m["Type"] == "AWS::ApiGatewayV2::Route" {
			p := mapOf(m["Properties"])
			if fmt.Sprint(p["Target"]) != "map[Fn::Sub:integrations/${PushIntegration}]" {
				t.Errorf("%s: target %v", id, p["Target"])
			}
			routes[fmt.Sprint(p["RouteKey"])] = fmt.Sprint(p["AuthorizationType"])
		}
	}
	if fmt.Sprint(routes) != "map[$connect:map[Fn::If:[UseJwt NONE AWS_IAM]] $default:NONE $disconnect:NONE subscribe:NONE unsubscribe:NONE]" {
		t.Errorf("routes and their authorization: %v", routes)
	}
	for mode, params := range map[string]map[string]string{"IAM": paramSets(t)["defaults"], "JWT": paramSets(t)["jwt-ssm"]} {
		resolved := resolveTemplate(t, tree, params)
		jwt := mode == "JWT"
		if u := functionEnv(resolved, "ResolveFunction")[awsfn.EnvPushURL]; (u != "") != jwt || (jwt && !strings.HasPrefix(u, "wss://")) {
			t.Errorf("%s: the resolve function's %s = %q", mode, awsfn.EnvPushURL, u)
		}
		if _, ok := functionEnv(resolved, "PushFunction")[awsfn.EnvCursorKeyARN]; ok != jwt {
			t.Errorf("%s: the push function told the cursor key %v", mode, ok)
		}
		if granted := secretGrants(resolved, "PushFunction"); (len(granted) == 1) != jwt || len(granted) > 1 {
			t.Errorf("%s: the push function is granted the secrets %v", mode, granted)
		}
	}
	api := mapOf(path(tree, "Resources", "PushApi", "Properties"))
	if api["ProtocolType"] != "WEBSOCKET" || api["RouteSelectionExpression"] != "$request.body.type" {
		t.Errorf("PushApi: %v", api)
	}
	perm := mapOf(path(tree, "Resources", "PushInvokePermission", "Properties"))
	if perm["Principal"] != "apigateway.amazonaws.com" || fmt.Sprint(perm["FunctionName"]) != "map[Ref:PushFunction]" ||
		!strings.Contains(fmt.Sprint(perm["SourceArn"]), "${PushApi}/*") {
		t.Errorf("PushInvokePermission: %v", perm)
	}
	pushing := map[string]bool{"ResolveFunction": true, "LogFunction": true, "WaitFunction": true, "ReaperFunction": true, "PushFunction": true, "ShipFunction": true}
	for _, id := range functionIDs {
		b, _ := json.Marshal(path(tree, "Resources", id, "Properties", "Policies"))
		has := strings.Contains(string(b), "execute-api:ManageConnections")
		if has != pushing[id] {
			t.Errorf("%s: ManageConnections granted %v, want %v", id, has, pushing[id])
		}
		if has && (!strings.Contains(string(b), `${PushApi}/${Stage}/POST/@connections/*`) || strings.Count(string(b), "execute-api:ManageConnections") != 1) {
			t.Errorf("%s: ManageConnections not scoped to the push API's stage: %s", id, b)
		}
	}
}
