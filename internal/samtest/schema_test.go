package samtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/awslabs/goformation/v7/schema"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sandkeep/sandkeep/shared/testkit/published"
)

// The SAM schema shipped in the goformation module we depend on (go.mod pins it).
const goformationVersion = "v7.14.9"

// SAM's own schema (schema_source/sam.schema.json of aws/serverless-application-model
// v1.110.0, commit 7000d0a3b0e5e0d9fca014ce135850718aad1290) is never committed here: it is
// read from $SANDKEEP_SAM_SCHEMA (shared/testkit/published; `make test` sets it).

// paramSets are the parameter values the template is resolved with: the bare minimum on
// defaults, both samconfig.toml environments, and a JWT deployment with SSM secrets.
func paramSets(t *testing.T) map[string]map[string]string {
	t.Helper()
	sets := map[string]map[string]string{
		"defaults": {
			"DetachedRunTtlSeconds": "900",
			"CursorKeySecretArn":    "arn:aws:secretsmanager:us-east-1:123456789012:secret:sandkeep/cursor-AbCdEf",
			"TrustedRoleArns":       "arn:aws:iam::123456789012:role/service/agent-host",
		},
		"jwt-ssm": {
			"DetachedRunTtlSeconds": "600", "AuthMode": "JWT", "JwtIssuer": "https://issuer.example/", "JwtAudience": "sandkeep",
			"CursorKeySecretArn": "arn:aws:ssm:us-east-1:123456789012:parameter/sandkeep/cursor",
			"ProviderSecretArn":  "arn:aws:ssm:us-east-1:123456789012:parameter/sandkeep/daytona",
			"TrustedRoleArns":    "none",
		},
	}
	for env, o := range samconfigOverrides(t) {
		sets["samconfig-"+env] = o
	}
	if len(sets) != 4 {
		t.Fatalf("samconfig.toml should define default and prod deploy parameters; parameter sets: %d", len(sets))
	}
	return sets
}

// notPrefix matches strings of at least one character that do not start with prefix: the
// one lookahead form SAM's schema uses ("^(?!AWS::Serverless::).+$"), which Go's RE2
// syntax cannot express.
type notPrefix struct{ pattern, prefix string }

func (n notPrefix) MatchString(s string) bool { return s != "" && !strings.HasPrefix(s, n.prefix) }
func (n notPrefix) String() string            { return n.pattern }

var negativePrefix = regexp.MustCompile(`^\^\(\?!([^()|*+?\[\]\\]*)\)\.\+\$$`)

// regexpEngine is RE2 plus notPrefix; any other unsupported pattern is an error.
func regexpEngine(pattern string) (jsonschema.Regexp, error) {
	if m := negativePrefix.FindStringSubmatch(pattern); m != nil {
		return notPrefix{pattern: pattern, prefix: m[1]}, nil
	}
	return regexp.Compile(pattern)
}

// compileSchema compiles a draft-04 schema document given as JSON text.
func compileSchema(t *testing.T, name, text string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if m, ok := doc.(map[string]any); ok {
		// goformation's schema declares the draft-04 meta-schema's own URL as its $id;
		// keeping it would make the compiler mistake the document for the meta-schema.
		delete(m, "$id")
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft4)
	c.UseRegexpEngine(regexpEngine)
	if err := c.AddResource(name, doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	s, err := c.Compile(name)
	if err != nil {
		t.Fatalf("compile %s: %v", name, err)
	}
	return s
}

// instance turns a tree into a jsonschema instance (numbers as json.Number).
func instance(t *testing.T, tree any) any {
	t.Helper()
	b, err := json.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// stringifyEnv renders environment variable values as strings, as CloudFormation passes
// them (a Ref to a Number parameter is a number to our resolver).
func stringifyEnv(tree map[string]any) {
	fix := func(fn any) {
		vars := mapOf(path(fn, "Environment", "Variables"))
		for k, v := range vars {
			if f, ok := v.(float64); ok {
				vars[k] = strings.TrimSuffix(strings.TrimRight(jsonNumber(f), "0"), ".")
			}
		}
	}
	fix(path(tree, "Globals", "Function"))
	for _, r := range mapOf(tree["Resources"]) {
		fix(path(r, "Properties"))
	}
}

func jsonNumber(f float64) string {
	b, _ := json.Marshal(f)
	s := string(b)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// goformationGaps are the parts of our template goformation v7.14.9's schema (2024) has
// no definition for; they are removed before validating against it and checked by SAM's
// own schema (when present) and by our raw-YAML assertions instead. The test proves each
// is still a gap, so a newer schema makes it fail until the exemption is dropped.
var goformationGaps = []struct {
	what  string
	gap   func(schemaDefs map[string]any) bool
	strip func(tree map[string]any) int // returns how many places it removed
}{
	{
		what: "LoggingConfig of AWS::Serverless::Function (SAM, November 2023)",
		gap: func(defs map[string]any) bool {
			_, has := mapOf(path(defs, "AWS::Serverless::Function", "properties", "Properties", "properties"))["LoggingConfig"]
			return !has
		},
		strip: func(tree map[string]any) int {
			n := 0
			for _, fn := range append([]any{path(tree, "Globals", "Function")}, functionProps(tree)...) {
				if m := mapOf(fn); m != nil && m["LoggingConfig"] != nil {
					delete(m, "LoggingConfig")
					n++
				}
			}
			return n
		},
	},
	{
		what: "ScheduleV2 events (EventBridge Scheduler, SAM 2022)",
		gap: func(defs map[string]any) bool {
			b, _ := json.Marshal(defs["AWS::Serverless::Function.EventSource"])
			for name := range defs {
				if strings.HasPrefix(name, "AWS::Serverless::Function.") && strings.Contains(name, "ScheduleV2") {
					return false
				}
			}
			return !strings.Contains(string(b), "ScheduleV2")
		},
		strip: func(tree map[string]any) int {
			n := 0
			for _, fn := range functionProps(tree) {
				for name, ev := range mapOf(mapOf(fn)["Events"]) {
					if path(ev, "Type") == "ScheduleV2" {
						delete(mapOf(mapOf(fn)["Events"]), name)
						n++
					}
				}
			}
			return n
		},
	},
}

// functionProps returns the Properties of every AWS::Serverless::Function.
func functionProps(tree map[string]any) []any {
	var out []any
	for _, r := range mapOf(tree["Resources"]) {
		if path(r, "Type") == "AWS::Serverless::Function" {
			out = append(out, path(r, "Properties"))
		}
	}
	return out
}

// TestTemplateMatchesGoformationSAMSchema validates template.yaml, resolved for every
// parameter set, against the SAM schema published in goformation v7.14.9: the template's
// top level, then each resource against its type's definition (validating the whole
// template at once tries every one of ~1,000 resource types for each resource).
func TestTemplateMatchesGoformationSAMSchema(t *testing.T) {
	const name = "goformation-" + goformationVersion + "-sam.schema.json"
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema.SamSchema))
	if err != nil {
		t.Fatal(err)
	}
	defs := mapOf(mapOf(doc)["definitions"])
	tree := loadTree(t)
	// Compile only what our template needs: the top level without the Resources dispatch
	// (an anyOf over ~1,000 resource types) and the definitions of the resource types we
	// use, with everything they reference. Compiling the whole 7.7 MB document takes
	// minutes; each resource is validated against its own type's definition instead.
	roots := []string{}
	for _, r := range mapOf(tree["Resources"]) {
		roots = append(roots, fmt.Sprint(path(r, "Type")))
	}
	top := map[string]any{}
	for k, v := range mapOf(doc) {
		top[k] = v
	}
	delete(top, "$id") // it claims the draft-04 meta-schema's own URL
	props := map[string]any{}
	for k, v := range mapOf(top["properties"]) {
		props[k] = v
	}
	props["Resources"] = map[string]any{"type": "object"}
	top["properties"] = props
	delete(top, "definitions")
	top["definitions"] = referenced(defs, append(roots, refsIn(top)...))
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft4)
	if err := c.AddResource(name, top); err != nil {
		t.Fatal(err)
	}
	compiled := map[string]*jsonschema.Schema{}
	compile := func(loc string) *jsonschema.Schema {
		if s, ok := compiled[loc]; ok {
			return s
		}
		s, err := c.Compile(loc)
		if err != nil {
			t.Fatalf("compile %s: %v", loc, err)
		}
		compiled[loc] = s
		return s
	}
	if gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod")); err != nil || !strings.Contains(string(gomod), "github.com/awslabs/goformation/v7 "+goformationVersion+"\n") {
		t.Fatalf("go.mod does not pin goformation %s (the schema this test names): %v", goformationVersion, err)
	}
	for _, g := range goformationGaps {
		if !g.gap(defs) {
			t.Errorf("goformation's schema now defines %s: drop the exemption", g.what)
		}
	}
	validate := func(t *testing.T, tree map[string]any) error {
		top := map[string]any{}
		for k, v := range tree {
			top[k] = v
		}
		top["Resources"] = map[string]any{}
		if err := compile(name).Validate(instance(t, top)); err != nil {
			return err
		}
		for id, r := range mapOf(tree["Resources"]) {
			typ, _ := path(r, "Type").(string)
			if _, ok := defs[typ]; !ok {
				return fmt.Errorf("resource %s: type %q unknown to the schema", id, typ)
			}
			if err := compile(name + "#/definitions/" + typ).Validate(instance(t, r)); err != nil {
				return fmt.Errorf("resource %s (%s): %w", id, typ, err)
			}
		}
		return nil
	}
	for set, params := range paramSets(t) {
		t.Run(set, func(t *testing.T) {
			resolved := resolveTemplate(t, tree, params)
			stringifyEnv(resolved)
			for _, g := range goformationGaps {
				if g.strip(resolved) == 0 {
					t.Errorf("exemption %q removed nothing: drop it", g.what)
				}
			}
			if err := validate(t, resolved); err != nil {
				t.Fatalf("template.yaml (%s) does not match goformation %s's SAM schema:\n%v", set, goformationVersion, err)
			}
		})
	}
	// Negative controls: the schema catches a misspelt property and a wrong type.
	for what, spoil := range map[string]func(map[string]any){
		"misspelt function property": func(m map[string]any) {
			mapOf(path(m, "Resources", "ResolveFunction", "Properties"))["Runtim"] = "provided.al2023"
		},
		"table billing mode as a number": func(m map[string]any) { mapOf(path(m, "Resources", "Table", "Properties"))["BillingMode"] = 1 },
	} {
		bad := resolveTemplate(t, tree, paramSets(t)["defaults"])
		stringifyEnv(bad)
		for _, g := range goformationGaps {
			g.strip(bad)
		}
		spoil(bad)
		if err := validate(t, bad); err == nil {
			t.Errorf("negative control: a %s passed the schema", what)
		}
	}
}

// TestTemplateMatchesSAMOwnSchema validates template.yaml against SAM's own schema
// ($SANDKEEP_SAM_SCHEMA; skipped without it, a failure under CI=true): the raw template
// (SAM's schema accepts intrinsics) and every resolved parameter set.
func TestTemplateMatchesSAMOwnSchema(t *testing.T) {
	text, source, err := published.Read(published.SAMSchema)
	if errors.Is(err, published.ErrMissing) {
		t.Skipf("SAM's own schema check did NOT run: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SAM's own schema check runs against %s", source)
	s := compileSchema(t, "sam.schema.json", string(text))
	tree := loadTree(t)
	if err := s.Validate(instance(t, tree)); err != nil {
		t.Fatalf("template.yaml (raw) does not match SAM's schema:\n%v", err)
	}
	for name, params := range paramSets(t) {
		resolved := resolveTemplate(t, tree, params)
		stringifyEnv(resolved)
		if err := s.Validate(instance(t, resolved)); err != nil {
			t.Fatalf("template.yaml (%s) does not match SAM's schema:\n%v", name, err)
		}
	}
	bad := loadTree(t)
	mapOf(path(bad, "Resources", "ReaperFunction", "Properties", "Events", "Sweep", "Properties"))["Retries"] = 0
	if err := s.Validate(instance(t, bad)); err == nil {
		t.Fatal("negative control: an unknown ScheduleV2 property passed SAM's schema")
	}
}

// refsIn returns the definition names v references ("#/definitions/<name>").
func refsIn(v any) []string {
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if r, ok := x["$ref"].(string); ok && strings.HasPrefix(r, "#/definitions/") {
				out = append(out, strings.TrimPrefix(r, "#/definitions/"))
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(v)
	return out
}

// referenced returns the definitions named in roots and everything they reference.
func referenced(defs map[string]any, roots []string) map[string]any {
	out := map[string]any{}
	for len(roots) > 0 {
		n := roots[len(roots)-1]
		roots = roots[:len(roots)-1]
		if _, done := out[n]; done {
			continue
		}
		d, ok := defs[n]
		if !ok {
			continue
		}
		out[n] = d
		roots = append(roots, refsIn(d)...)
	}
	return out
}
