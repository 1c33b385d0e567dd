package samtest

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	templatePath  = "../../template.yaml"
	samconfigPath = "../../samconfig.toml"
)

// loadTree reads template.yaml into a generic tree: maps, slices and scalars, with the
// short-form intrinsics (!Ref, !If, ...) in their long JSON form ({"Ref": x}, {"Fn::If": [...]}).
func loadTree(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(templatePath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("template.yaml: %v", err)
	}
	v, err := toTree(&doc)
	if err != nil {
		t.Fatalf("template.yaml: %v", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatal("template.yaml is not a mapping")
	}
	return m
}

func toTree(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		return toTree(n.Content[0])
	case yaml.AliasNode:
		return toTree(n.Alias)
	}
	var v any
	switch n.Kind {
	case yaml.MappingNode:
		m := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			if _, dup := m[k]; dup {
				return nil, fmt.Errorf("line %d: duplicate key %q", n.Content[i].Line, k)
			}
			c, err := toTree(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[k] = c
		}
		v = m
	case yaml.SequenceNode:
		s := []any{}
		for _, c := range n.Content {
			cv, err := toTree(c)
			if err != nil {
				return nil, err
			}
			s = append(s, cv)
		}
		v = s
	case yaml.ScalarNode:
		if strings.HasPrefix(n.Tag, "!") && !strings.HasPrefix(n.Tag, "!!") {
			v = n.Value
		} else if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
	default:
		return nil, fmt.Errorf("line %d: unexpected node kind %v", n.Line, n.Kind)
	}
	if !strings.HasPrefix(n.Tag, "!") || strings.HasPrefix(n.Tag, "!!") {
		return v, nil
	}
	switch tag := n.Tag[1:]; tag {
	case "Ref", "Condition":
		return map[string]any{tag: v}, nil
	case "GetAtt":
		if s, ok := v.(string); ok {
			res, attr, _ := strings.Cut(s, ".")
			v = []any{res, attr}
		}
		return map[string]any{"Fn::GetAtt": v}, nil
	default:
		return map[string]any{"Fn::" + tag: v}, nil
	}
}

// intrinsic returns the name and argument of a one-key intrinsic map.
func intrinsic(v any) (name string, arg any, ok bool) {
	m, isMap := v.(map[string]any)
	if !isMap || len(m) != 1 {
		return "", nil, false
	}
	for k, a := range m {
		if k == "Ref" || k == "Condition" || strings.HasPrefix(k, "Fn::") {
			return k, a, true
		}
	}
	return "", nil, false
}

// noValue is what AWS::NoValue evaluates to; its parent drops it.
type noValue struct{}

// resolver evaluates intrinsics the way CloudFormation would for one set of parameter
// values: Ref of a parameter is its value (a number for Number parameters), Ref of a
// resource "ref:<LogicalId>", GetAtt a placeholder ARN naming resource and attribute.
type resolver struct {
	params    map[string]string
	ptypes    map[string]string
	rawConds  map[string]any
	conds     map[string]bool
	resources map[string]any
}

// newResolver takes the template's parameter defaults overridden by overrides; every
// parameter must end up with a value (like a deploy).
func newResolver(t *testing.T, tree map[string]any, overrides map[string]string) *resolver {
	t.Helper()
	r := &resolver{params: map[string]string{}, ptypes: map[string]string{}, conds: map[string]bool{},
		rawConds: mapOf(tree["Conditions"]), resources: mapOf(tree["Resources"])}
	for name, p := range mapOf(tree["Parameters"]) {
		pm := mapOf(p)
		r.ptypes[name] = fmt.Sprint(pm["Type"])
		if d, ok := pm["Default"]; ok {
			r.params[name] = fmt.Sprint(d)
		}
	}
	for k, v := range overrides {
		if _, ok := r.ptypes[k]; !ok {
			t.Fatalf("override of unknown parameter %s", k)
		}
		r.params[k] = v
	}
	for name := range r.ptypes {
		if _, ok := r.params[name]; !ok {
			t.Fatalf("parameter %s has no value (no default, no override)", name)
		}
	}
	return r
}

func (r *resolver) condition(name string) (bool, error) {
	if v, ok := r.conds[name]; ok {
		return v, nil
	}
	raw, ok := r.rawConds[name]
	if !ok {
		return false, fmt.Errorf("unknown condition %s", name)
	}
	v, err := r.eval(raw)
	if err != nil {
		return false, fmt.Errorf("condition %s: %w", name, err)
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("condition %s is %T, not a boolean", name, v)
	}
	r.conds[name] = b
	return b, nil
}

var pseudo = map[string]string{
	"AWS::Region": "us-east-1", "AWS::Partition": "aws", "AWS::AccountId": "123456789012",
	"AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "sandkeep", "AWS::StackId": "stack-id",
}

func (r *resolver) ref(name string) (any, error) {
	if name == "AWS::NoValue" {
		return noValue{}, nil
	}
	if v, ok := pseudo[name]; ok {
		return v, nil
	}
	if v, ok := r.params[name]; ok {
		if r.ptypes[name] == "Number" {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("parameter %s=%q is not a number", name, v)
			}
			return n, nil
		}
		return v, nil
	}
	if _, ok := r.resources[name]; ok {
		return "ref:" + name, nil
	}
	return nil, fmt.Errorf("Ref to unknown %s", name)
}

func (r *resolver) getAtt(res, attr string) (any, error) {
	// SAM makes a function's URL resource, <LogicalId>Url, from its FunctionUrlConfig;
	// its FunctionUrl ends with a slash.
	if fn, ok := strings.CutSuffix(res, "Url"); ok && path(r.resources, fn, "Properties", "FunctionUrlConfig") != nil {
		if attr != "FunctionUrl" {
			return nil, fmt.Errorf("GetAtt %s.%s", res, attr)
		}
		return "https://" + strings.ToLower(fn) + "id.lambda-url.us-east-1.on.aws/", nil
	}
	if _, ok := r.resources[res]; !ok {
		return nil, fmt.Errorf("GetAtt of unknown resource %s", res)
	}
	return "arn:aws:placeholder:us-east-1:123456789012:" + res + "/" + attr, nil
}

var subVar = regexp.MustCompile(`\$\{([^}!]+)\}`)

func (r *resolver) eval(v any) (any, error) {
	if name, arg, ok := intrinsic(v); ok {
		return r.evalIntrinsic(name, arg)
	}
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, c := range x {
			e, err := r.eval(c)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			if _, drop := e.(noValue); !drop {
				out[k] = e
			}
		}
		return out, nil
	case []any:
		out := []any{}
		for i, c := range x {
			e, err := r.eval(c)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			if _, drop := e.(noValue); !drop {
				out = append(out, e)
			}
		}
		return out, nil
	}
	return v, nil
}

func (r *resolver) evalIntrinsic(name string, arg any) (any, error) {
	args, _ := arg.([]any)
	str := func(v any) string {
		if f, ok := v.(float64); ok {
			return strconv.FormatFloat(f, 'f', -1, 64)
		}
		return fmt.Sprint(v)
	}
	evalArgs := func(n int) ([]any, error) {
		if len(args) != n {
			return nil, fmt.Errorf("%s takes %d arguments, has %v", name, n, arg)
		}
		out := make([]any, n)
		for i, a := range args {
			e, err := r.eval(a)
			if err != nil {
				return nil, err
			}
			out[i] = e
		}
		return out, nil
	}
	switch name {
	case "Ref":
		return r.ref(str(arg))
	case "Condition":
		return r.condition(str(arg))
	case "Fn::GetAtt":
		if len(args) != 2 {
			return nil, fmt.Errorf("GetAtt %v", arg)
		}
		return r.getAtt(str(args[0]), str(args[1]))
	case "Fn::If":
		if len(args) != 3 {
			return nil, fmt.Errorf("Fn::If %v", arg)
		}
		c, err := r.condition(str(args[0]))
		if err != nil {
			return nil, err
		}
		if c {
			return r.eval(args[1])
		}
		return r.eval(args[2])
	case "Fn::Equals":
		a, err := evalArgs(2)
		if err != nil {
			return nil, err
		}
		return str(a[0]) == str(a[1]), nil
	case "Fn::Not":
		a, err := evalArgs(1)
		if err != nil {
			return nil, err
		}
		b, ok := a[0].(bool)
		if !ok {
			return nil, fmt.Errorf("Fn::Not of %T", a[0])
		}
		return !b, nil
	case "Fn::And", "Fn::Or":
		all := name == "Fn::And"
		res := all
		for _, c := range args {
			e, err := r.eval(c)
			if err != nil {
				return nil, err
			}
			b, ok := e.(bool)
			if !ok {
				return nil, fmt.Errorf("%s of %T", name, e)
			}
			if all {
				res = res && b
			} else {
				res = res || b
			}
		}
		return res, nil
	case "Fn::Select":
		a, err := evalArgs(2)
		if err != nil {
			return nil, err
		}
		i, err := strconv.Atoi(str(a[0]))
		list, ok := a[1].([]any)
		if err != nil || !ok || i < 0 || i >= len(list) {
			return nil, fmt.Errorf("Fn::Select %v out of range", a)
		}
		return list[i], nil
	case "Fn::Split":
		a, err := evalArgs(2)
		if err != nil {
			return nil, err
		}
		out := []any{}
		for _, p := range strings.Split(str(a[1]), str(a[0])) {
			out = append(out, p)
		}
		return out, nil
	case "Fn::Join":
		a, err := evalArgs(2)
		if err != nil {
			return nil, err
		}
		list, ok := a[1].([]any)
		if !ok {
			return nil, fmt.Errorf("Fn::Join of %T", a[1])
		}
		parts := make([]string, len(list))
		for i, p := range list {
			parts[i] = str(p)
		}
		return strings.Join(parts, str(a[0])), nil
	case "Fn::Sub":
		tmpl, vars := "", map[string]any{}
		switch x := arg.(type) {
		case string:
			tmpl = x
		case []any:
			if len(x) != 2 {
				return nil, fmt.Errorf("Fn::Sub %v", arg)
			}
			tmpl = str(x[0])
			vars = mapOf(x[1])
		}
		var ferr error
		out := subVar.ReplaceAllStringFunc(tmpl, func(m string) string {
			name := m[2 : len(m)-1]
			var v any
			var err error
			if ev, ok := vars[name]; ok {
				v, err = r.eval(ev)
			} else if res, attr, ok := strings.Cut(name, "."); ok {
				v, err = r.getAtt(res, attr)
			} else {
				v, err = r.ref(name)
				// Inside a Sub a resource's Ref stands in a URL or an ARN: render it as a
				// physical id (an API's is lower-case alphanumerics), not "ref:<LogicalId>".
				if id, ok := v.(string); ok && strings.HasPrefix(id, "ref:") {
					v = strings.ToLower(strings.TrimPrefix(id, "ref:")) + "id"
				}
			}
			if err != nil {
				ferr = err
			}
			return str(v)
		})
		return out, ferr
	}
	return nil, fmt.Errorf("intrinsic %s is not supported by the test resolver", name)
}

// resolveTemplate evaluates Resources, Globals and Outputs for one parameter set; the
// Parameters and Conditions sections stay as written.
func resolveTemplate(t *testing.T, tree map[string]any, overrides map[string]string) map[string]any {
	t.Helper()
	r := newResolver(t, tree, overrides)
	out := map[string]any{}
	for k, v := range tree {
		switch k {
		case "Resources", "Globals", "Outputs":
			e, err := r.eval(v)
			if err != nil {
				t.Fatalf("resolve %s: %v", k, err)
			}
			out[k] = e
		default:
			out[k] = v
		}
	}
	return out
}

// mapOf returns v as a map (nil when it is not one).
func mapOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// path walks a tree by keys; a missing key yields nil.
func path(v any, keys ...string) any {
	for _, k := range keys {
		v = mapOf(v)[k]
	}
	return v
}

// samconfigOverrides returns the parameter_overrides of each environment in samconfig.toml
// (env name → parameter → value). The file is read with a line parser: it only needs
// `[<env>.deploy.parameters]` tables and their `parameter_overrides = [ "K=V", ... ]` arrays.
func samconfigOverrides(t *testing.T) map[string]map[string]string {
	t.Helper()
	f, err := os.Open(samconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]string{}
	env, inArray := "", false
	table := regexp.MustCompile(`^\[([A-Za-z0-9_-]+)\.deploy\.parameters\]$`)
	item := regexp.MustCompile(`^"([A-Za-z0-9]+)=(.*)",?$`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "["):
			env, inArray = "", false
			if m := table.FindStringSubmatch(line); m != nil {
				env = m[1]
				out[env] = map[string]string{}
			}
		case env != "" && strings.HasPrefix(line, "parameter_overrides = ["):
			inArray = true
		case inArray && line == "]":
			inArray = false
		case inArray:
			m := item.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("samconfig.toml: cannot read override line %q", line)
			}
			out[env][m[1]] = m[2]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
