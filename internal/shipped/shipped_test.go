package shipped

import (
	"bytes"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

// binaries are the package patterns of what sandkeep ships.
var binaries = []string{"./cmd/sandkeep", "./functions/..."}

// module is the repository's module path.
const module = "github.com/sandkeep/sandkeep"

// scaffoldNames are repository packages that hold tests' machinery without the "test"
// suffix in their name.
var scaffoldNames = []string{"testkit", "faultrun", "e2bfake", "e2bconformance", "designdoc", "shipped"}

// pkg is one package of a `go list -deps` answer.
type pkg struct {
	path     string
	standard bool
	imports  []string
}

// deps lists the packages patterns link (go list -deps), with their direct imports.
func deps(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}\t{{.Standard}}\t{{join .Imports \",\"}}"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %v: %v\n%s", patterns, err, stderr.String())
	}
	var ps []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			t.Fatalf("go list line %q", line)
		}
		p := pkg{path: f[0], standard: f[1] == "true"}
		if f[2] != "" {
			p.imports = strings.Split(f[2], ",")
		}
		ps = append(ps, p)
	}
	return ps
}

// scaffolding returns why p is test scaffolding ("" when it is not): the standard
// library's testing support, or a repository package named for tests, or one whose own
// (non-test) files import "testing".
func scaffolding(p pkg) string {
	switch {
	case p.standard && (p.path == "testing" || strings.HasPrefix(p.path, "testing/") || p.path == "net/http/httptest"):
		return "the standard library's test support"
	case p.standard || !strings.HasPrefix(p.path, module+"/"):
		return ""
	case strings.HasSuffix(path.Base(p.path), "test"), slices.Contains(scaffoldNames, path.Base(p.path)):
		return "a test package of this repository"
	case slices.Contains(p.imports, "testing"):
		return `a repository package importing "testing"`
	}
	return ""
}

// TestShippedBinariesLinkNoTestScaffolding: the operator CLI and the Lambdas link none of
// the test doubles, suites or testing support.
func TestShippedBinariesLinkNoTestScaffolding(t *testing.T) {
	ps := deps(t, binaries...)
	own := 0
	for _, p := range ps {
		if strings.HasPrefix(p.path, module+"/") {
			own++
		}
		if why := scaffolding(p); why != "" {
			t.Errorf("%v link %s: %s", binaries, p.path, why)
		}
	}
	if own < 10 {
		t.Fatalf("go list -deps %v named only %d packages of %s", binaries, own, module)
	}
	t.Logf("%d packages of this module linked", own)
}

// TestScaffoldingIsRecognised is the check's negative control: the dependencies of a
// package that is test scaffolding must be flagged — the package itself, the testing
// support it links, and a repository package importing "testing".
func TestScaffoldingIsRecognised(t *testing.T) {
	flagged := map[string]bool{}
	for _, p := range deps(t, "./shared/testkit/keepertest") {
		if scaffolding(p) != "" {
			flagged[p.path] = true
		}
	}
	for _, want := range []string{module + "/shared/testkit/keepertest", "testing"} {
		if !flagged[want] {
			t.Errorf("%s not recognised as test scaffolding (flagged: %v)", want, flagged)
		}
	}
	if p := (pkg{path: module + "/shared/ops/keeper"}); scaffolding(p) != "" {
		t.Errorf("shared/ops/keeper flagged as scaffolding: %s", scaffolding(p))
	}
	if p := (pkg{path: module + "/shared/rogue", imports: []string{"context", "testing"}}); scaffolding(p) == "" {
		t.Error("a repository package importing testing was not flagged")
	}
}
