package published

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const repoRoot = "../../.."

func TestPathRules(t *testing.T) {
	file := filepath.Join(t.TempDir(), "doc.json")
	if err := os.WriteFile(file, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	const env = "SANDKEEP_PUBLISHED_TEST_DOC"
	for _, c := range []struct {
		name, ci, value string
		missing, fails  bool
	}{
		{name: "unset outside CI", missing: true, fails: true},
		{name: "unset under CI", ci: "true", fails: true},
		{name: "names nothing", value: filepath.Join(t.TempDir(), "absent.json"), fails: true},
		{name: "names nothing under CI", ci: "true", value: filepath.Join(t.TempDir(), "absent.json"), fails: true},
		{name: "names the file", value: file},
		{name: "names the file under CI", ci: "true", value: file},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("CI", c.ci)
			t.Setenv(env, c.value)
			data, p, err := Read(env)
			if (err != nil) != c.fails || errors.Is(err, ErrMissing) != c.missing {
				t.Fatalf("Read: %v (want failure %v, ErrMissing %v)", err, c.fails, c.missing)
			}
			if err != nil && !strings.Contains(err.Error(), env) {
				t.Errorf("the error does not name $%s: %v", env, err)
			}
			if !c.fails && (p != file || string(data) != "{}") {
				t.Errorf("Read = %q, %q", data, p)
			}
		})
	}
}

// TestTestScriptExportsEveryDocument: scripts/test.sh (make test) exports each variable
// from a location under ../shared/vendor, and that location holds the document.
func TestTestScriptExportsEveryDocument(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	vendor := filepath.Join(repoRoot, "..", "shared", "vendor")
	_, statErr := os.Stat(vendor)
	if statErr != nil && os.Getenv("CI") == "true" {
		t.Fatalf("under CI=true the published documents must be at ../shared/vendor: %v", statErr)
	}
	for _, env := range All() {
		m := regexp.MustCompile(`\b` + env + `:([^\s;]+)`).FindSubmatch(script)
		if m == nil {
			t.Errorf("scripts/test.sh does not export $%s from ../shared/vendor", env)
			continue
		}
		if statErr != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(vendor, string(m[1]))); err != nil {
			t.Errorf("$%s: scripts/test.sh names %s, which ../shared/vendor lacks: %v", env, m[1], err)
		}
	}
	if statErr != nil {
		t.Logf("../shared/vendor is absent: checked the script only")
	}
}

// TestNothingNamesAMachinePath: no file of the repository names a path of one machine's
// checkout layout or a local mirror of other repositories (the documents come from
// ../shared/vendor through scripts/test.sh, nothing else).
func TestNothingNamesAMachinePath(t *testing.T) {
	needles := []string{"/" + "work/", "." + "mirror/", "." + "mirror" + "\""}
	// The files git would commit: tracked, and untracked but not ignored.
	out, err := exec.Command("git", "-C", repoRoot, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("git ls-files: %v", err)
		}
		t.Skipf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the work tree
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range needles {
			if i := strings.Index(string(b), n); i >= 0 {
				t.Errorf("%s:%d names %q", f, strings.Count(string(b[:i]), "\n")+1, n)
			}
		}
	}
	if len(files) < 50 {
		t.Fatalf("git listed %d files: not the repository", len(files))
	}
}
