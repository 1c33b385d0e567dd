package designdoc

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sign is the section sign, written as an escape so this file cites nothing itself.
const sign = "\u00a7"

// brief is the name of the design brief that used to live outside the repository, split so
// this file does not name it.
const brief = "SP" + "EC"

var (
	// heading is a numbered heading of docs/design.md: "## 3. Title" or "### 3.1 Title".
	heading = regexp.MustCompile(`^#{2,}\s+(\d+(?:\.\d+)?)[.\s]`)
	// group is one citation: a sign and number, then numbers joined to it by ",", "/", "and"
	// or "or" (each with its own sign).
	group = regexp.MustCompile(sign + `(\d+(?:\.\d+)?)((?:(?:,\s*|\s*/\s*|\s+and\s+|\s+or\s+)` + sign + `\d+(?:\.\d+)?)*)`)
	// number is one number inside a group.
	number = regexp.MustCompile(sign + `(\d+(?:\.\d+)?)`)
	// section is the ASCII form "design.md section N" (YAML descriptions).
	section = regexp.MustCompile(`design\.md section (\d+(?:\.\d+)?)`)
	// outside names the old outside brief, cited or by file name.
	outside = regexp.MustCompile(brief + `(?:\.md|(?:'s)?\s+(?:` + sign + `|section\b))`)
	// docPath is a repository document a comment or document points at.
	docPath = regexp.MustCompile(`\bdocs/[A-Za-z0-9_.-]+\.md\b`)
)

// root returns the repository root (the directory holding go.mod).
func root(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// sections returns the section numbers docs/design.md has.
func sections(t *testing.T, repo string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "docs", "design.md"))
	if err != nil {
		t.Fatalf("docs/design.md: %v", err)
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if m := heading.FindStringSubmatch(line); m != nil {
			have[m[1]] = true
		}
	}
	return have
}

// checked reports whether rel is a file whose comments or text cite the design: Go sources,
// Markdown, YAML, Makefiles and scripts.
func checked(rel string) bool {
	base := filepath.Base(rel)
	switch {
	case strings.HasPrefix(rel, "scripts/"), base == "Makefile":
		return true
	}
	return slices.Contains([]string{".go", ".md", ".yaml", ".yml"}, filepath.Ext(rel))
}

// files returns the repository's checked files, relative to repo, skipping VCS data,
// installed packages and test data.
func files(t *testing.T, repo string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(repo, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(repo, path)
		if err != nil {
			return err
		}
		if rel = filepath.ToSlash(rel); checked(rel) {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// problems returns what is wrong with the citations of one file's text: section numbers
// design.md lacks (have), citations not attributed to design.md (outside design.md itself),
// the outside brief, and docs/*.md paths that do not exist (exists).
func problems(rel, text string, have map[string]bool, exists func(string) bool) []string {
	var out []string
	self := rel == "docs/design.md"
	sc := bufio.NewScanner(strings.NewReader(text))
	// Grown only for a long line: a 1 MiB buffer for every file was most of this package's
	// time under -race.
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		at := func(format string, args ...any) {
			out = append(out, fmt.Sprintf("%s:%d: ", rel, n)+fmt.Sprintf(format, args...))
		}
		// group and docPath match only lines holding the sign or "docs/"; testing for that
		// first keeps the regexp engine off almost every line (its backtracker allocates per
		// line). section and outside begin with a literal the engine seeks itself.
		var cites [][]int
		if strings.Contains(line, sign) {
			cites = group.FindAllStringSubmatchIndex(line, -1)
		}
		var paths []string
		if strings.Contains(line, "docs/") {
			paths = docPath.FindAllString(line, -1)
		}
		for _, m := range cites {
			cite := line[m[0]:m[1]]
			for _, num := range number.FindAllStringSubmatch(cite, -1) {
				if !have[num[1]] {
					at("cites %s%s, which docs/design.md has no section for", sign, num[1])
				}
			}
			if !self && !strings.HasSuffix(line[:m[0]], "design.md ") {
				at("%q cites a section without naming docs/design.md", cite)
			}
		}
		for _, m := range section.FindAllStringSubmatch(line, -1) {
			if !have[m[1]] {
				at("cites section %s, which docs/design.md has no section for", m[1])
			}
		}
		if outside.MatchString(line) {
			at("names the design brief outside the repository; cite docs/design.md")
		}
		for _, p := range paths {
			if !exists(p) {
				at("points at %s, which does not exist", p)
			}
		}
	}
	return out
}

// TestCitationsNameDesignSections fails when a comment or document cites a section
// docs/design.md does not have, cites a section without naming docs/design.md, names the
// design brief that lives outside the repository, or points at a docs/*.md that is absent.
// scripts/cite-design.sh fixes the mechanical cases.
func TestCitationsNameDesignSections(t *testing.T) {
	repo := root(t)
	have := sections(t, repo)
	if len(have) < 20 {
		t.Fatalf("docs/design.md has %d numbered sections; the headings were not recognised", len(have))
	}
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(repo, filepath.FromSlash(p)))
		return err == nil
	}
	all := files(t, repo)
	if len(all) < 100 {
		t.Fatalf("found only %d files to check under %s", len(all), repo)
	}
	var bad []string
	for _, rel := range all {
		data, err := os.ReadFile(filepath.Join(repo, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		bad = append(bad, problems(rel, string(data), have, exists)...)
	}
	for _, b := range bad {
		t.Error(b)
	}
	if len(bad) > 0 {
		t.Logf("%d problems; scripts/cite-design.sh rewrites the mechanical ones", len(bad))
	}
}

// TestProblemsCatchEachMistake proves the check fails on every mistake it is meant to catch,
// and passes the forms the repository uses.
func TestProblemsCatchEachMistake(t *testing.T) {
	have := map[string]bool{"2": true, "2.4": true, "3.1": true, "8": true, "12": true}
	exists := func(p string) bool { return p == "docs/bench.md" || p == "docs/design.md" }
	good := []string{
		"// cites docs/design.md " + sign + "2.4, " + sign + "3.1 and " + sign + "8/" + sign + "12.",
		"    Description: sandkeep HTTP API (docs/design.md section 8)",
		"see docs/bench.md",
		"the spec8Routes table of a SPECIAL case",
	}
	for _, line := range good {
		if p := problems("x.go", line, have, exists); len(p) != 0 {
			t.Errorf("%q: unexpected problems %v", line, p)
		}
	}
	if p := problems("docs/design.md", "as "+sign+"2.4 says", have, exists); len(p) != 0 {
		t.Errorf("a bare self-reference inside docs/design.md: unexpected problems %v", p)
	}
	bad := map[string]string{
		"// docs/design.md " + sign + "9 is absent":        "no section for",
		"// docs/design.md " + sign + "2.4, " + sign + "7": "no section for",
		"// a bare " + sign + "2.4 citation":               "without naming docs/design.md",
		"// see " + brief + " " + sign + "2.4":             "outside the repository",
		"the design is in `" + brief + ".md` of the notes": "outside the repository",
		"    Description: API (" + brief + " section 8)":   "outside the repository",
		"    Description: API (docs/design.md section 9)":  "no section for",
		"// docs/" + "quickstart.md has the session":       "does not exist",
	}
	for line, want := range bad {
		p := problems("x.go", line, have, exists)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("%q: problems %v, want one saying %q", line, p, want)
		}
	}
}
