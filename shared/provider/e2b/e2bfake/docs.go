package e2bfake

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Where E2B's published descriptions are read from, when present. Nothing fails when
// they are absent: the subset document still checks every exchange.
const (
	EnvOpenAPI    = "SANDKEEP_E2B_OPENAPI"       // a file holding E2B's spec/openapi.yml
	EnvProto      = "SANDKEEP_E2B_PROCESS_PROTO" // a file holding spec/envd/process/process.proto
	EnvMirror     = "SANDKEEP_E2B_MIRROR"        // a git dir of github.com/e2b-dev/E2B
	DefaultMirror = "/work/.mirror/e2b-dev+E2B/repo"
	OpenAPIInRepo = "spec/openapi.yml"
	ProtoInRepo   = "spec/envd/process/process.proto"
)

// Published reads one of E2B's published files: from the file named by $env, else from
// HEAD of the git mirror ($SANDKEEP_E2B_MIRROR or DefaultMirror); source says which,
// ok=false when neither is available.
func Published(env, inRepo string) (data []byte, source string, ok bool) {
	if path := os.Getenv(env); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, "", false
		}
		return b, path + " (from $" + env + ")", true
	}
	dir := os.Getenv(EnvMirror)
	if dir == "" {
		dir = DefaultMirror
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

// LoadDocs reads the subset document at subsetPath and, when available, E2B's
// published OpenAPI document.
func LoadDocs(subsetPath string) (Docs, error) {
	sub, err := os.ReadFile(subsetPath)
	if err != nil {
		return Docs{}, err
	}
	d := Docs{Subset: sub}
	d.Published, d.PublishedSource, _ = Published(EnvOpenAPI, OpenAPIInRepo)
	return d, nil
}
