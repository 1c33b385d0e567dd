package samtest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/deploy/awsfn"
)

// maxBootstrapBytes is the docs/design.md §11 budget for one bootstrap.
const maxBootstrapBytes = 15 << 20

const repoRoot = "../.."

// TestMakeBuildTargets runs every `make build-<LogicalId> ARTIFACTS_DIR=<tmp>` exactly as
// `sam build` (BuildMethod: makefile) would, and checks each bootstrap is a static AArch64
// Linux executable within the size budget.
func TestMakeBuildTargets(t *testing.T) {
	t.Parallel() // builds seven arm64 binaries: beside the other slow tests
	if testing.Short() {
		t.Skip("builds five arm64 binaries")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	for _, fn := range awsfn.Functions() {
		id := fn.LogicalID()
		dir := t.TempDir()
		start := time.Now()
		cmd := exec.Command("make", "--no-print-directory", "build-"+id, "ARTIFACTS_DIR="+dir)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make build-%s: %v\n%s", id, err, out)
		}
		bin := filepath.Join(dir, "bootstrap")
		st, err := os.Stat(bin)
		if err != nil {
			t.Fatalf("build-%s left no bootstrap in ARTIFACTS_DIR: %v", id, err)
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("%s bootstrap is not ELF: %v", id, err)
		}
		machine, class, typ := f.Machine, f.Class, f.Type
		interp := f.Section(".interp") != nil
		f.Close()
		if machine != elf.EM_AARCH64 || class != elf.ELFCLASS64 || typ != elf.ET_EXEC || interp {
			t.Errorf("%s bootstrap: machine %v class %v type %v dynamic %v; want a static AArch64 executable", id, machine, class, typ, interp)
		}
		if st.Mode()&0o111 == 0 {
			t.Errorf("%s bootstrap is not executable", id)
		}
		if st.Size() > maxBootstrapBytes {
			t.Errorf("%s bootstrap is %d bytes, over the %d budget", id, st.Size(), maxBootstrapBytes)
		}
		t.Logf("%s: bootstrap %.1f MB (%d bytes), %s, built in %s (host %s)", id, float64(st.Size())/(1<<20), st.Size(), machine, time.Since(start).Round(time.Millisecond), runtime.GOARCH)
	}
}
