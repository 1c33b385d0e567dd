package e2b

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
)

// Where E2B's published descriptions are read from, when present. Nothing fails when
// they are absent: the subset document still checks every exchange.
const (
	envOpenAPI     = "SANDKEEP_E2B_OPENAPI"       // a file holding E2B's spec/openapi.yml
	envProto       = "SANDKEEP_E2B_PROCESS_PROTO" // a file holding spec/envd/process/process.proto
	envMirror      = "SANDKEEP_E2B_MIRROR"        // a git dir of github.com/e2b-dev/E2B
	defaultMirror  = "/work/.mirror/e2b-dev+E2B/repo"
	openAPIInRepo  = "spec/openapi.yml"
	protoInRepo    = "spec/envd/process/process.proto"
	subsetDocument = "testdata/e2b-subset.yaml"
)

// published reads one of E2B's published files: from the file named by env, else from
// the mirror via git; source says which, ok=false when neither is available.
func published(env, inRepo string) (data []byte, source string, ok bool) {
	if path := os.Getenv(env); path != "" {
		b, err := os.ReadFile(path)
		if err == nil {
			return b, path + " (from $" + env + ")", true
		}
		return nil, "", false
	}
	dir := os.Getenv(envMirror)
	if dir == "" {
		dir = defaultMirror
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, "", false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, "git", "--git-dir="+dir, "show", "HEAD:"+inRepo).Output()
	if err != nil || len(b) == 0 {
		return nil, "", false
	}
	rev, _ := exec.CommandContext(ctx, "git", "--git-dir="+dir, "rev-parse", "--short", "HEAD").Output()
	return b, dir + "@" + strings.TrimSpace(string(rev)) + ":" + inRepo, true
}

type loadedSpecs struct {
	subsetData    []byte
	publishedData []byte
	source        string
}

// loadSpecs reads the documents once per test binary (parsing happens per fake).
var loadSpecs = sync.OnceValue(func() loadedSpecs {
	var s loadedSpecs
	s.subsetData, _ = os.ReadFile(subsetDocument)
	s.publishedData, s.source, _ = published(envOpenAPI, openAPIInRepo)
	return s
})

// specs returns the subset validator and, when available, the published one.
func specs(t *testing.T) (*specValidator, *specValidator) {
	t.Helper()
	s := loadSpecs()
	if len(s.subsetData) == 0 {
		t.Fatalf("cannot read %s", subsetDocument)
	}
	sub := newValidator(t, "subset", s.subsetData, true)
	if s.publishedData == nil {
		return sub, nil
	}
	return sub, newValidator(t, "published", s.publishedData, false)
}

// TestPublishedDocument reports which published document the contract tests also
// validate against, and checks that every operation and field the subset names exists
// there too (the subset may only narrow, never invent).
func TestPublishedDocument(t *testing.T) {
	s := loadSpecs()
	if s.publishedData == nil {
		t.Skipf("E2B's published OpenAPI document is not available (set $%s or $%s); the subset alone validates", envOpenAPI, envMirror)
	}
	pub := newValidator(t, "published", s.publishedData, false)
	sub := newValidator(t, "subset", s.subsetData, true)
	t.Logf("validating against the published E2B API %q version %s from %s", pub.doc.Info.Title, pub.doc.Info.Version, s.source)
	for path, item := range sub.doc.Paths.Map() {
		pitem := pub.doc.Paths.Value(path)
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
	b, source, ok := published(envProto, protoInRepo)
	if !ok {
		t.Skipf("E2B's process.proto is not available (set $%s or $%s)", envProto, envMirror)
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
