// Package localprocess is the local-process sandbox provider (docs/design.md §2.5): one directory per
// sandbox under a base directory, commands run as child processes of this process in their
// own process groups. It offers no isolation whatsoever; it exists for development and
// for tests that need a real shell.
//
// Layout under baseDir:
//
//	<key>.<random>/               a sandbox; the directory name is its provider sandbox id
//	<key>.<random>/.sandkeep/     provider bookkeeping, never copied into snapshots:
//	    created                   creation time (unix ns), orders Lookup's candidates
//	    journal/                  the run journals of this sandbox (JournalDir): every
//	                              sandbox shares this host, so each keeps its own
//	    stopped                   marker of an emulated stopped sandbox (see Stop)
//	    pgid/<pgid>               a process group started in the sandbox (content: the
//	                              leader's start time, to recognise a recycled pid)
//	.snapshots/<key>.<random>/    a snapshot: a copy of a sandbox directory
//	.creating.<id>, .destroying.<id>, .snapshots/.creating.<id>
//	                              work directories; a sandbox appears and disappears by
//	                              one rename, so nobody ever sees it half made or half gone
//
// Decisions the spec leaves open: a missing directory (ENOENT) is a confirmed gone sandbox,
// every other filesystem error is transient; CreateInput.Workspace is ignored (the
// directory starts empty); environment variables (CreateInput.Env, SetEnv) are kept in
// this Provider's memory only, so secrets never reach the disk or a snapshot, and a new
// Provider over the same baseDir starts without them (callers re-inject after resume);
// snapshot labels are ignored.
package localprocess

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// ErrStopped: the sandbox exists but is stopped (see Stop); Resume starts it again.
var ErrStopped = errors.New("local-process: sandbox stopped")

const (
	metaDir       = ".sandkeep"
	createdFile   = "created"
	stoppedFile   = "stopped"
	pgidDir       = "pgid"
	snapshotsDir  = ".snapshots"
	creatingPfx   = ".creating."
	destroyingPfx = ".destroying."
)

// Provider is the local-process provider; safe for concurrent use.
type Provider struct {
	base  string
	shell string
	env   []string // base environment of every command

	mu      sync.Mutex
	sandEnv map[string]map[string]string // per sandbox id, set by Create/Restore/SetEnv
	started map[int]started              // groups Start launched, not yet seen empty
	closed  bool                         // StopStarted ran
}

// Option configures a Provider.
type Option func(*Provider)

// WithShell sets the POSIX shell commands run under (default /bin/sh).
func WithShell(path string) Option { return func(p *Provider) { p.shell = path } }

// WithBaseEnv replaces the environment every command starts from (default: MinimalEnv of
// this process's environment); sandbox variables are added on top.
func WithBaseEnv(env []string) Option {
	return func(p *Provider) { p.env = slices.Clone(env) }
}

// DefaultPath is the PATH of a sandbox command when the environment it derives from has none.
const DefaultPath = "/usr/local/bin:/usr/bin:/bin"

// MinimalEnv returns the environment a sandbox command starts from, derived from environ
// (an os.Environ list): PATH (DefaultPath when absent), HOME, LANG and TMPDIR, nothing
// else. Every entry point that launches local-process agents (the dev server, `sandkeep
// reap`, `runs finish --force`) runs with an operator's or a function's environment, which
// holds credentials (AWS_*, SANDKEEP_*): an agent must never inherit them, so the default
// is this list, and a run's own variables come on top (docs/design.md §13).
func MinimalEnv(environ []string) []string {
	keep := []string{"PATH", "HOME", "LANG", "TMPDIR"}
	var out []string
	seen := map[string]bool{}
	for _, kv := range environ {
		k, _, ok := strings.Cut(kv, "=")
		if ok && slices.Contains(keep, k) && !seen[k] {
			seen[k] = true
			out = append(out, kv)
		}
	}
	if !seen["PATH"] {
		out = append(out, "PATH="+DefaultPath)
	}
	slices.Sort(out)
	return out
}

// New returns a provider keeping its sandboxes under baseDir (created on first Create).
func New(baseDir string, opts ...Option) *Provider {
	p := &Provider{
		base:    filepath.Clean(baseDir),
		shell:   "/bin/sh",
		env:     MinimalEnv(os.Environ()),
		sandEnv: map[string]map[string]string{},
		started: map[int]started{},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

var (
	_ contract.Provider     = (*Provider)(nil)
	_ contract.Lookuper     = (*Provider)(nil)
	_ contract.StatusReader = (*Provider)(nil)
	_ contract.Snapshotter  = (*Provider)(nil)
	_ contract.Restorer     = (*Provider)(nil)
	_ contract.Executor     = (*Provider)(nil)
	_ contract.EnvStarter   = (*Provider)(nil)
	_ contract.EnvSetter    = (*Provider)(nil)
	_ contract.JournalDirer = (*Provider)(nil)
)

// Name is "local-process", the provider name stored in sandbox keys and instance rows.
func (p *Provider) Name() string { return "local-process" }

// JournalDir is the run-journal directory of every sandbox: under the sandbox's own directory
// (commands run there), never an absolute path all sandboxes of this host would share.
func (p *Provider) JournalDir() string { return metaDir + "/journal" }

// BaseDir returns the directory holding every sandbox of this provider.
func (p *Provider) BaseDir() string { return p.base }

// Path returns the directory of sandbox id (whether or not it exists); ErrInvalid for a
// malformed id, so a path outside baseDir is never returned.
func (p *Provider) Path(id string) (string, error) {
	if _, err := parseID("providerSandboxId", id); err != nil {
		return "", err
	}
	return filepath.Join(p.base, id), nil
}

// Create makes a new empty sandbox named in.Name (or restores in.SnapshotID when set) and
// returns its fresh id; two creates with one name yield two sandboxes.
func (p *Provider) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	if in.SnapshotID != "" {
		return p.Restore(ctx, in)
	}
	return p.materialize(ctx, in, func(dst string) error { return os.Mkdir(dst, 0o755) })
}

// Restore creates a new sandbox named in.Name holding a copy of snapshot in.SnapshotID and
// returns its fresh id; ErrSandboxGone when the snapshot does not exist.
func (p *Provider) Restore(ctx context.Context, in contract.CreateInput) (string, error) {
	if _, err := parseID("snapshotId", in.SnapshotID); err != nil {
		return "", err
	}
	src := filepath.Join(p.base, snapshotsDir, in.SnapshotID)
	if _, err := os.Stat(src); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("local-process: snapshot %s: %w", in.SnapshotID, contract.ErrSandboxGone)
		}
		return "", fmt.Errorf("local-process: snapshot %s: %w", in.SnapshotID, err)
	}
	return p.materialize(ctx, in, func(dst string) error { return copyTree(ctx, src, dst) })
}

// materialize builds a sandbox in a work directory with fill, stamps it, and makes it
// appear under its id with one rename.
func (p *Provider) materialize(ctx context.Context, in contract.CreateInput, fill func(dst string) error) (string, error) {
	if err := checkKey("name", in.Name); err != nil {
		return "", err
	}
	if err := contract.CheckEnv(in.Env); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	id, err := mintID(in.Name)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(p.base, 0o755); err != nil {
		return "", fmt.Errorf("local-process: base dir: %w", err)
	}
	work := filepath.Join(p.base, creatingPfx+id)
	if err := fill(work); err != nil {
		_ = os.RemoveAll(work)
		return "", fmt.Errorf("local-process: create %s: %w", id, err)
	}
	err = os.MkdirAll(filepath.Join(work, metaDir, pgidDir), 0o755)
	if err == nil {
		stamp := strconv.FormatInt(time.Now().UnixNano(), 10)
		err = os.WriteFile(filepath.Join(work, metaDir, createdFile), []byte(stamp), 0o644)
	}
	if err == nil {
		err = os.Rename(work, filepath.Join(p.base, id))
	}
	if err != nil {
		_ = os.RemoveAll(work)
		return "", fmt.Errorf("local-process: create %s: %w", id, err)
	}
	if len(in.Env) > 0 {
		p.mergeEnv(id, in.Env)
	}
	return id, nil
}

// state reads a sandbox's state without changing it: gone only on ENOENT (or a non-directory
// where the sandbox should be); any other error is returned as transient.
func (p *Provider) state(id string) (dir string, st contract.SandboxStatus, err error) {
	if _, err := parseID("providerSandboxId", id); err != nil {
		return "", "", err
	}
	dir = filepath.Join(p.base, id)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return dir, contract.SandboxGone, nil
	case err != nil:
		return dir, "", fmt.Errorf("local-process: stat %s: %w", id, err)
	case !fi.IsDir():
		return dir, contract.SandboxGone, nil
	}
	_, err = os.Stat(filepath.Join(dir, metaDir, stoppedFile))
	switch {
	case err == nil:
		return dir, contract.SandboxStopped, nil
	case errors.Is(err, fs.ErrNotExist):
		return dir, contract.SandboxAlive, nil
	}
	return dir, "", fmt.Errorf("local-process: stat %s: %w", id, err)
}

// Status reports alive, stopped or gone without starting anything; an error is transient.
func (p *Provider) Status(ctx context.Context, id string) (contract.SandboxStatus, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	_, st, err := p.state(id)
	return st, err
}

// existing returns the directory and state of a sandbox that exists (alive or stopped);
// ErrSandboxGone, wrapped as op's, when it does not; ctx's error once it has ended.
func (p *Provider) existing(ctx context.Context, op, id string) (string, contract.SandboxStatus, error) {
	if err := ctx.Err(); err != nil {
		return "", "", err
	}
	dir, st, err := p.state(id)
	switch {
	case err != nil:
		return "", "", err
	case st == contract.SandboxGone:
		return "", "", fmt.Errorf("local-process: %s %s: %w", op, id, contract.ErrSandboxGone)
	}
	return dir, st, nil
}

// Resume returns nil when the sandbox exists (clearing a stopped marker), ErrSandboxGone
// when its directory is missing, and any other error as transient.
func (p *Provider) Resume(ctx context.Context, id string) error {
	dir, st, err := p.existing(ctx, "resume", id)
	switch {
	case err != nil:
		return err
	case st == contract.SandboxStopped:
		err := os.Remove(filepath.Join(dir, metaDir, stoppedFile))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("local-process: resume %s: %w", id, err)
		}
	}
	return nil
}

// Stop emulates a provider stopping an idle sandbox: it kills the sandbox's process groups
// and marks it stopped, so Status reports stopped and Exec/Start fail with ErrStopped
// until Resume. ErrSandboxGone when the sandbox does not exist.
func (p *Provider) Stop(ctx context.Context, id string) error {
	dir, _, err := p.existing(ctx, "stop", id)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, metaDir, stoppedFile), nil, 0o644); err != nil {
		return fmt.Errorf("local-process: stop %s: %w", id, err)
	}
	return killRecorded(dir)
}

// Destroy kills every recorded process group of the sandbox and removes its directory;
// idempotent: a sandbox already gone is nil, and a destroy interrupted half way is
// finished by the next call.
//
// The directory is first renamed out of the way, so the sandbox is gone for every other
// call at once and a concurrent Start cannot record a new group behind the kill.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	dir, st, err := p.state(id)
	if err != nil {
		return err
	}
	trash := filepath.Join(p.base, destroyingPfx+id)
	if st != contract.SandboxGone {
		if err := os.Rename(dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("local-process: destroy %s: %w", id, err)
		}
	}
	p.mu.Lock()
	delete(p.sandEnv, id)
	p.mu.Unlock()
	if _, err := os.Lstat(trash); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := killRecorded(trash); err != nil {
		return fmt.Errorf("local-process: destroy %s: %w", id, err)
	}
	return removeAll(ctx, trash)
}

// removeAll removes dir, retrying briefly: a process killed a moment ago may still be
// creating files in it.
func removeAll(ctx context.Context, dir string) error {
	var err error
	for attempt := range 8 {
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("local-process: remove %s: %w (after %w)", dir, ctx.Err(), err)
		case <-time.After(time.Duration(attempt+1) * 10 * time.Millisecond):
		}
	}
	return fmt.Errorf("local-process: remove %s: %w", dir, err)
}

// Lookup returns the id of a sandbox named name: a directory "<name>.<random>" under
// baseDir. When several exist (each Create mints a fresh one), the newest by creation time
// wins, ties broken by the greater id, so repeated lookups agree. A missing baseDir is
// "none found".
func (p *Provider) Lookup(ctx context.Context, name string) (string, bool, error) {
	if err := checkKey("name", name); err != nil {
		return "", false, err
	}
	if err := ctx.Err(); err != nil {
		return "", false, err
	}
	entries, err := os.ReadDir(p.base)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("local-process: lookup %s: %w", name, err)
	}
	var best string
	var bestAt int64 = -1
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() || !strings.HasPrefix(n, name+".") {
			continue
		}
		if k, err := parseID("id", n); err != nil || k != name {
			continue
		}
		at := createdAt(filepath.Join(p.base, n))
		if at > bestAt || at == bestAt && n > best {
			best, bestAt = n, at
		}
	}
	return best, best != "", nil
}

// createdAt reads a sandbox's creation stamp; an unreadable stamp sorts first.
func createdAt(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, metaDir, createdFile))
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Snapshot copies the sandbox directory (without its bookkeeping) to
// baseDir/.snapshots/<id> and returns the new snapshot id; ErrSandboxGone when the sandbox
// does not exist. A stopped sandbox can be snapshotted. The label is ignored.
func (p *Provider) Snapshot(ctx context.Context, id, label string) (string, error) {
	dir, st, err := p.state(id)
	if err != nil {
		return "", err
	}
	if st == contract.SandboxGone {
		return "", fmt.Errorf("local-process: snapshot %s: %w", id, contract.ErrSandboxGone)
	}
	key, _ := parseID("providerSandboxId", id) // checked by state
	snap, err := mintID(key)
	if err != nil {
		return "", err
	}
	snaps := filepath.Join(p.base, snapshotsDir)
	if err := os.MkdirAll(snaps, 0o755); err != nil {
		return "", fmt.Errorf("local-process: snapshot %s: %w", id, err)
	}
	work := filepath.Join(snaps, creatingPfx+snap)
	err = copyTree(ctx, dir, work)
	if err == nil {
		err = os.Rename(work, filepath.Join(snaps, snap))
	}
	if err != nil {
		_ = os.RemoveAll(work)
		if _, st, serr := p.state(id); serr == nil && st == contract.SandboxGone {
			err = errors.Join(err, contract.ErrSandboxGone) // destroyed while copying
		}
		return "", fmt.Errorf("local-process: snapshot %s: %w", id, err)
	}
	return snap, nil
}

// DeleteSnapshot removes a snapshot; a missing one is nil.
func (p *Provider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if _, err := parseID("snapshotId", snapshotID); err != nil {
		return err
	}
	return removeAll(ctx, filepath.Join(p.base, snapshotsDir, snapshotID))
}
