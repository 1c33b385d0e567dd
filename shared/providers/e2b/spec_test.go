package e2b

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandkeep/sandkeep/shared/testkit/published"
)

// parseDoc loads and validates an OpenAPI document.
func parseDoc(t *testing.T, name string, data []byte) *openapi3.T {
	t.Helper()
	l := openapi3.NewLoader()
	doc, err := l.LoadFromData(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := doc.Validate(l.Context); err != nil {
		t.Fatalf("%s: invalid: %v", name, err)
	}
	return doc
}

// TestPublishedDocument reports which published document the contract tests also
// validate against, and checks that every operation and field the subset names exists
// there too (the subset may only narrow, never invent).
func TestPublishedDocument(t *testing.T) {
	docs, err := loadDocs()
	if err != nil {
		t.Fatal(err)
	}
	sub := parseDoc(t, "subset", docs.Subset)
	if docs.Published == nil {
		t.Skipf("E2B's published OpenAPI document is not available (set $%s); the subset alone validates", published.E2BOpenAPI)
	}
	pub := parseDoc(t, "published", docs.Published)
	t.Logf("validating against the published E2B API %q version %s from %s", pub.Info.Title, pub.Info.Version, docs.PublishedSource)
	for path, item := range sub.Paths.Map() {
		pitem := pub.Paths.Value(path)
		if pitem == nil {
			t.Errorf("subset path %s is not in the published document", path)
			continue
		}
		for method, op := range item.Operations() {
			pop := pitem.GetOperation(method)
			if pop == nil {
				t.Errorf("subset %s %s is not in the published document", method, path)
				continue
			}
			if op.RequestBody != nil {
				if pop.RequestBody == nil {
					t.Errorf("%s %s: the published operation takes no body", method, path)
				} else {
					sameFields(t, method+" "+path+" request", op.RequestBody.Value.Content.Get("application/json").Schema.Value,
						pop.RequestBody.Value.Content.Get("application/json").Schema.Value)
				}
			}
			for code, resp := range op.Responses.Map() {
				presp := pop.Responses.Status(atoi(code))
				if presp == nil {
					t.Logf("%s %s %s: declared by the subset only (the client handles it; E2B does not document it here)", method, path, code)
					continue
				}
				sc := resp.Value.Content.Get("application/json")
				psc := presp.Value.Content.Get("application/json")
				if sc != nil && psc != nil {
					sameFields(t, method+" "+path+" "+code, sc.Schema.Value, psc.Schema.Value)
				}
			}
			for _, prm := range op.Parameters {
				if pop.Parameters.GetByInAndName(prm.Value.In, prm.Value.Name) == nil &&
					pitem.Parameters.GetByInAndName(prm.Value.In, prm.Value.Name) == nil {
					t.Errorf("%s %s: parameter %s not in the published document", method, path, prm.Value.Name)
				}
			}
		}
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// sameFields checks that every property the subset schema names exists in the
// published schema (recursing into objects and array items).
func sameFields(t *testing.T, where string, sub, pub *openapi3.Schema) {
	t.Helper()
	if sub.Items != nil && pub.Items != nil {
		sameFields(t, where+"[]", sub.Items.Value, pub.Items.Value)
	}
	for name, ps := range sub.Properties {
		pp := pub.Properties[name]
		if pp == nil {
			t.Errorf("%s: field %s is not in the published schema", where, name)
			continue
		}
		if len(ps.Value.Properties) > 0 {
			sameFields(t, where+"."+name, ps.Value, pp.Value)
		}
	}
}

// TestPublishedProcessProto checks the envd messages the client writes and reads
// against the published process.proto: each field (in its JSON lowerCamel form here,
// snake_case there) must be declared in its message.
func TestPublishedProcessProto(t *testing.T) {
	b, source, err := published.Read(published.E2BProcessProto)
	if errors.Is(err, published.ErrMissing) {
		t.Skipf("E2B's process.proto is not available: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checking envd fields against %s", source)
	proto := string(b)
	want := map[string][]string{
		"service Process":  {"rpc Start(StartRequest) returns (stream StartResponse)"},
		"ProcessConfig":    {"string cmd", "repeated string args", "map<string, string> envs"},
		"StartRequest":     {"ProcessConfig process", "optional bool stdin"},
		"StartResponse":    {"ProcessEvent event"},
		"ProcessEvent":     {"StartEvent start", "DataEvent data", "EndEvent end", "KeepAlive keepalive"},
		"StartEvent":       {"uint32 pid"},
		"DataEvent":        {"bytes stdout", "bytes stderr"},
		"EndEvent":         {"sint32 exit_code", "bool exited", "string status", "optional string error"},
		"package process;": nil,
	}
	for block, fields := range want {
		i := strings.Index(proto, block)
		if block != "service Process" && block != "package process;" {
			m := regexp.MustCompile(`message\s+` + block + `\s*\{`).FindStringIndex(proto)
			if m == nil {
				i = -1
			} else {
				i = m[0]
			}
		}
		if i < 0 {
			t.Errorf("%s: not declared in process.proto", block)
			continue
		}
		body := proto[i:]
		if j := strings.Index(body, "}"); j > 0 {
			body = body[:j]
		}
		norm := strings.Join(strings.Fields(body), " ")
		for _, f := range fields {
			if !strings.Contains(norm, f) {
				t.Errorf("%s: %q not found in process.proto", block, f)
			}
		}
	}
}
