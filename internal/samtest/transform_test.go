package samtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit/published"
)

// translateScript runs SAM's transform on a template with parameter values (argv) and
// prints the CloudFormation JSON, or the transform's errors on stderr (exit 1). CodeUri "."
// is a local path `sam build` would replace with an S3 location first.
const translateScript = `
import json, re, sys
sys.path.insert(0, sys.argv[1])
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse
from samtranslator.model.exceptions import InvalidDocumentException
src = open(sys.argv[2]).read()
src = re.sub(r"CodeUri: \.\s*\n", "CodeUri: s3://bucket/code.zip\n", src)
params = dict(a.split("=", 1) for a in sys.argv[3:])
class NoManagedPolicies:
    def load(self): return {}
try:
    print(json.dumps(transform(yaml_parse(src), params, NoManagedPolicies())))
except InvalidDocumentException as e:
    for c in e.causes: print("SAM:", c.message, file=sys.stderr)
    sys.exit(1)
`

// TestSAMTransform runs SAM's own transform (the code `sam deploy` runs in CloudFormation)
// on template.yaml for an IAM and a JWT deployment: SAM's samtranslator package from
// $SANDKEEP_SAM_TRANSLATOR (shared/testkit/published) under python3 with boto3, pydantic and
// jsonschema. Without them it skips outside CI and fails under CI=true.
func TestSAMTransform(t *testing.T) {
	t.Parallel() // runs Python twice: beside the other slow tests
	if testing.Short() {
		t.Skip("runs SAM's Python transform")
	}
	unavailable := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("SAM transform check cannot run under CI=true: "+format, args...)
		}
		t.Skipf("SAM transform check did NOT run: "+format, args...)
	}
	dir, err := published.Path(published.SAMTranslator)
	if errors.Is(err, published.ErrMissing) {
		unavailable("%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "samtranslator", "translator", "transform.py")); err != nil {
		t.Fatalf("$%s=%s holds no samtranslator package: %v", published.SAMTranslator, dir, err)
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		unavailable("no python3")
	}
	if out, err := exec.Command(py, "-c", "import boto3, pydantic, jsonschema, yaml").CombinedOutput(); err != nil {
		unavailable("python3 lacks SAM's dependencies: %s", strings.TrimSpace(string(out)))
	}
	script := filepath.Join(t.TempDir(), "translate.py")
	if err := os.WriteFile(script, []byte(translateScript), 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(templatePath)
	for mode, params := range map[string]map[string]string{"IAM": paramSets(t)["defaults"], "JWT": paramSets(t)["jwt-ssm"]} {
		args := []string{script, dir, abs}
		for k, v := range params {
			args = append(args, k+"="+v)
		}
		cmd := exec.Command(py, args...)
		cmd.Env = append(os.Environ(), "AWS_DEFAULT_REGION=us-east-1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: SAM's transform refused template.yaml: %v\n%s", mode, err, stderr.String())
		}
		var cfn map[string]any
		if err := json.Unmarshal(out, &cfn); err != nil {
			t.Fatalf("%s: transform output: %v", mode, err)
		}
		res := mapOf(cfn["Resources"])
		types := map[string]int{}
		for _, r := range res {
			types[path(r, "Type").(string)]++
		}
		t.Logf("SAM transform (%s) ran from %s: %v", mode, dir, sortedCounts(types))
		// Two APIs (HTTP, and the push's WebSocket API, in both modes), a permission per
		// HTTP route and the WebSocket API's one, and the Ship function's URL with its two
		// public permissions.
		if types["AWS::Lambda::Function"] != len(functionIDs) || types["AWS::Scheduler::Schedule"] != 1 || types["AWS::ApiGatewayV2::Api"] != 2 ||
			types["AWS::Lambda::Permission"] != len(spec8Routes)+1+2 || types["AWS::ApiGatewayV2::Route"] != 5 || types["AWS::Serverless::Function"] != 0 ||
			types["AWS::Lambda::Url"] != 1 {
			t.Fatalf("%s: transformed resources %v", mode, types)
		}
		// The function URL (docs/design.md §9): the Ship function's alone, no IAM auth (the
		// ship token is its credential). Anyone may call it — lambda:InvokeFunctionUrl for
		// the URL's NONE auth, and lambda:InvokeFunction only as invoked through a function
		// URL — and no other permission is granted to everyone.
		if u := path(res, "ShipFunctionUrl", "Properties"); path(u, "AuthType") != "NONE" || fmt.Sprint(path(u, "TargetFunctionArn")) != "map[Ref:ShipFunction]" {
			t.Errorf("%s: the function URL %v", mode, u)
		}
		public := map[string]string{}
		for id, r := range res {
			if path(r, "Type") == "AWS::Lambda::Permission" && path(r, "Properties", "Principal") == "*" {
				public[id] = fmt.Sprint(path(r, "Properties"))
			}
		}
		wantPublic := map[string]string{
			"ShipFunctionUrlPublicPermissions":       "map[Action:lambda:InvokeFunctionUrl FunctionName:map[Ref:ShipFunction] FunctionUrlAuthType:NONE Principal:*]",
			"ShipFunctionURLInvokeAllowPublicAccess": "map[Action:lambda:InvokeFunction FunctionName:map[Ref:ShipFunction] InvokedViaFunctionUrl:true Principal:*]",
		}
		if fmt.Sprint(public) != fmt.Sprint(wantPublic) {
			t.Errorf("%s: permissions granted to everyone %v, want %v", mode, public, wantPublic)
		}
		// Every route of the body got its Lambda integration (payload 2.0) and kept the
		// authorizer requirement.
		body := path(res, "Api", "Properties", "Body")
		n := 0
		for p, item := range mapOf(path(body, "paths")) {
			for m, op := range mapOf(item) {
				n++
				integ := path(op, "x-amazon-apigateway-integration")
				fn := spec8Routes[strings.ToUpper(m)+" "+p]
				if path(integ, "payloadFormatVersion") != "2.0" || !strings.Contains(path(integ, "uri", "Fn::Sub").(string), "${"+fn+".Arn}") {
					t.Errorf("%s: %s %s integration %v, want %s", mode, m, p, integ, fn)
				}
				sec, isList := path(op, "security").([]any)
				switch {
				case shipRoutes[strings.ToUpper(m)+" "+p]:
					if !isList || len(sec) != 0 {
						t.Errorf("%s: ship route %s %s security %v after the transform, want []", mode, m, p, path(op, "security"))
					}
				case path(op, "security") == nil || isList && len(sec) == 0:
					// (Still the Fn::If on UseJwt here: CloudFormation resolves it.)
					t.Errorf("%s: %s %s lost its security requirement: %v", mode, m, p, path(op, "security"))
				}
			}
		}
		if n != len(spec8Routes) {
			t.Errorf("%s: %d operations in the transformed body", mode, n)
		}
		// Every function keeps its reserved concurrency through the transform.
		for _, id := range functionIDs {
			if path(res, id, "Properties", "ReservedConcurrentExecutions") == nil {
				t.Errorf("%s: %s has no reserved concurrency after the transform", mode, id)
			}
		}
		sched := path(res, "ReaperFunctionSweep", "Properties")
		if path(sched, "FlexibleTimeWindow", "Mode") != "OFF" || path(sched, "Target", "RetryPolicy", "MaximumRetryAttempts") != float64(0) ||
			path(sched, "Target", "DeadLetterConfig", "Arn") == nil {
			t.Errorf("%s: schedule %v", mode, sched)
		}
		// The reaper's role may send to its DLQ (async failures); no role got a managed
		// DynamoDB policy.
		b, _ := json.Marshal(res)
		for _, bad := range []string{"AmazonDynamoDBFullAccess", "dynamodb:Scan", "dynamodb:*"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s: transformed template contains %s", mode, bad)
			}
		}
		if !strings.Contains(string(mustJSON(path(res, "ReaperFunctionRole"))), "sqs:SendMessage") {
			t.Errorf("%s: the reaper's role cannot send to its dead-letter queue", mode)
		}
		// The push serves both modes (docs/design.md §8.1): its resources carry no condition
		// through the transform, $connect keeps its per-mode authorization (a JWT
		// deployment's verifies a push ticket), and the push role reads the cursor key
		// only under UseJwt.
		for _, id := range []string{"PushApi", "PushConnectRoute", "PushStage", "PushFunction", "PushFunctionRole", "PushInvokePermission"} {
			if c := path(res, id, "Condition"); c != nil {
				t.Errorf("%s: %s has the condition %v after the transform", mode, id, c)
			}
		}
		if a := fmt.Sprint(path(res, "PushConnectRoute", "Properties", "AuthorizationType")); a != "map[Fn::If:[UseJwt NONE AWS_IAM]]" {
			t.Errorf("%s: $connect authorization %s after the transform", mode, a)
		}
		var cursorGrants []string
		for _, p := range path(res, "PushFunctionRole", "Properties", "Policies").([]any) {
			if j := string(mustJSON(p)); strings.Contains(j, "CursorKeySecretArn") {
				cursorGrants = append(cursorGrants, j)
			}
		}
		if len(cursorGrants) != 1 || !strings.HasPrefix(cursorGrants[0], `{"Fn::If":["UseJwt",`) {
			t.Errorf("%s: the push role's cursor-key grants %v, want one under UseJwt", mode, cursorGrants)
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func sortedCounts(m map[string]int) []string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(out)
	return out
}
