// Package clitest runs the sandkeep binary as real processes for tests: it builds
// ./cmd/sandkeep once per test binary (with the race detector when the tests have it),
// starts `sandkeep dev` on a free port, and runs commands against it with captured output.
// Nothing of it is shared between tests but the built binary, so tests that use it can
// call t.Parallel(): each dev server has its own port and sandbox directory, and a child
// process gets its environment through Start's env (never t.Setenv, which forbids
// t.Parallel).
package clitest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/testkit/syncbuf"
)

// Deadline bounds every wait of this package (a process to print, to exit).
const Deadline = 90 * time.Second

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Main runs the package's tests and removes the built binary; call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// MainParallel is Main for a package whose tests call t.Parallel() and mostly wait on the
// processes they run: unless -parallel was given, up to n of them run at once instead of
// GOMAXPROCS (2 on CI), which would leave the machine idle while they wait.
func MainParallel(m *testing.M, n int) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			fmt.Fprintf(os.Stderr, "clitest: -test.parallel: %v\n", err)
			os.Exit(2)
		}
	}
	Main(m)
}

// Binary returns the path of a freshly built sandkeep binary (built once per test binary).
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "sandkeep-clitest-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "sandkeep")
		args := []string{"build", "-o", build.bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, "github.com/sandkeep/sandkeep/cmd/sandkeep")
		// go test puts its own GOROOT/bin first on the PATH of the test binary.
		goBin, err := exec.LookPath("go")
		if err != nil {
			build.err = fmt.Errorf("go build ./cmd/sandkeep: no go command on PATH: %w", err)
			return
		}
		out, err := exec.Command(goBin, args...).CombinedOutput()
		if err != nil {
			build.err = fmt.Errorf("go build ./cmd/sandkeep: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// Buffer is a goroutine-safe output sink that can be waited on.
type Buffer = syncbuf.Buffer

// Proc is one running sandkeep (or other) process.
type Proc struct {
	Cmd    *exec.Cmd
	Stdout *Buffer
	Stderr *Buffer
	done   chan struct{}
	err    error
}

// Start runs bin with args and env (added to this process's environment); the process is
// killed when the test ends if it still runs.
func Start(t testing.TB, env []string, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Cmd: exec.Command(bin, args...), Stdout: &Buffer{}, Stderr: &Buffer{}, done: make(chan struct{})}
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = p.Stdout, p.Stderr
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s %v: %v", bin, args, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.Cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// WaitFor polls until re matches the output of the named stream ("stdout" or "stderr"),
// failing the test after Deadline; it returns the submatches.
func (p *Proc) WaitFor(t testing.TB, stream string, re *regexp.Regexp) []string {
	t.Helper()
	b := p.Stdout
	if stream == "stderr" {
		b = p.Stderr
	}
	deadline := time.Now().Add(Deadline)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(b.String()); m != nil {
			return m
		}
		select {
		case <-p.done:
			if m := re.FindStringSubmatch(b.String()); m != nil {
				return m
			}
			t.Fatalf("%s exited (%v) before its %s matched %s\nstdout:\n%s\nstderr:\n%s", p.Cmd.Path, p.err, stream, re, p.Stdout, p.Stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("%s: no %s matching %s within %v\nstdout:\n%s\nstderr:\n%s", p.Cmd.Path, stream, re, Deadline, p.Stdout, p.Stderr)
	return nil
}

// WaitLines polls until stdout holds at least n complete lines.
func (p *Proc) WaitLines(t testing.TB, n int) []string {
	t.Helper()
	deadline := time.Now().Add(Deadline)
	for time.Now().Before(deadline) {
		if l := p.Stdout.Lines(); len(l) >= n {
			return l
		}
		select {
		case <-p.done:
			if l := p.Stdout.Lines(); len(l) >= n {
				return l
			}
			t.Fatalf("%s exited (%v) after %d lines, want %d\nstderr:\n%s", p.Cmd.Path, p.err, len(p.Stdout.Lines()), n, p.Stderr)
		case <-time.After(5 * time.Millisecond):
		}
	}
	t.Fatalf("%s: %d lines within %v, want %d\nstderr:\n%s", p.Cmd.Path, len(p.Stdout.Lines()), Deadline, n, p.Stderr)
	return nil
}

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// Wait waits (at most Deadline) for the process to exit and returns its exit status
// (-1 when a signal killed it).
func (p *Proc) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(Deadline):
		_ = p.Cmd.Process.Kill()
		<-p.done
		t.Fatalf("%s did not exit within %v\nstdout:\n%s\nstderr:\n%s", p.Cmd.Path, Deadline, p.Stdout, p.Stderr)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -1
		}
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("%s: %v", p.Cmd.Path, p.err)
	}
	return 0
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Run runs bin to completion and returns its exit status with its output.
func Run(t testing.TB, env []string, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := Start(t, env, bin, args...)
	code = p.Wait(t)
	return code, p.Stdout.String(), p.Stderr.String()
}

// Dev is a running `sandkeep dev`.
type Dev struct {
	*Proc
	URL        string // http://127.0.0.1:PORT
	SandboxDir string
}

var listeningRE = regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)\n`)

// StartDev starts `sandkeep dev --addr 127.0.0.1:0 --sandbox-dir <temp>` with extra args
// (a --sandbox-dir among them wins: a restarted server finds its sandboxes again) and waits
// until it listens; it is stopped (SIGINT, then killed) when the test ends.
func StartDev(t testing.TB, env []string, args ...string) *Dev {
	t.Helper()
	dir := t.TempDir()
	full := append([]string{"dev", "--addr", "127.0.0.1:0"}, args...)
	for i, a := range args {
		if a == "--sandbox-dir" && i+1 < len(args) {
			dir = args[i+1]
		}
	}
	if !hasFlag(args, "--provider") && !hasFlag(args, "--sandbox-dir") {
		full = append(full, "--sandbox-dir", dir)
	}
	p := Start(t, env, Binary(t), full...)
	m := p.WaitFor(t, "stdout", listeningRE)
	d := &Dev{Proc: p, URL: m[1], SandboxDir: dir}
	t.Cleanup(func() {
		d.Stop(t)
		killGroupsUnder(dir)
	})
	return d
}

// killGroupsUnder kills the process groups named by the agent and shipper pid files under
// dir: a durable run's agent and its shipper outlive the server by design, and a shipper
// still retrying would write into dir while the test's cleanup removes it.
func killGroupsUnder(dir string) {
	_ = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return nil
		}
		if _, _, ext, ok := journal.SplitName(e.Name()); !ok || ext != journal.ExtPID && ext != journal.ExtShipPID {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		if pgid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pgid > 1 {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		return nil
	})
}

// Stop asks the dev server to shut down (SIGINT) and waits for it.
func (d *Dev) Stop(t testing.TB) {
	if d.Exited() {
		return
	}
	_ = d.Cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		_ = d.Cmd.Process.Kill()
		<-d.done
		t.Errorf("sandkeep dev did not stop within 30 s of SIGINT")
	}
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// Context is a context bounded by Deadline, cancelled when the test ends.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Deadline)
	t.Cleanup(cancel)
	return ctx
}
