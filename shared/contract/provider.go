package contract

import (
	"context"
	"strings"
	"time"
)

// CreateInput describes a sandbox to create.
type CreateInput struct {
	Name       string            // the sandbox key
	Workspace  any               // the setup's workspace document
	Env        map[string]string // secrets and settings to inject
	SnapshotID string            // restore from this snapshot ("" = fresh)
}

// Provider creates, resumes and destroys sandboxes. A name is not an identity: every
// Create yields a fresh id, even for the same name.
type Provider interface {
	// Name identifies the provider in sandbox keys and instance rows.
	Name() string
	// Create makes a new sandbox named in.Name and returns its fresh id.
	Create(ctx context.Context, in CreateInput) (providerSandboxID string, err error)
	// Resume returns nil when the sandbox is alive (starting a stopped, paused or archived
	// one: same id, files intact), ErrSandboxGone when confirmed gone, any other error when
	// transient (never read as gone).
	Resume(ctx context.Context, providerSandboxID string) error
	// Destroy removes the sandbox; idempotent, already gone is nil.
	Destroy(ctx context.Context, providerSandboxID string) error
}

// Lookuper finds a sandbox by name (the sandbox key).
type Lookuper interface {
	// Lookup returns the id of a sandbox named name; found=false when none exists.
	Lookup(ctx context.Context, name string) (id string, found bool, err error)
}

// SandboxStatus is what Status reports without starting anything.
type SandboxStatus string

// The sandbox statuses. Stopped covers a paused sandbox (E2B) and one on its way to
// stopped; archived is a stopped sandbox whose files the provider moved to cheaper
// storage (Daytona), slower to resume. Resume starts either, files intact.
const (
	SandboxAlive    SandboxStatus = "alive"
	SandboxStopped  SandboxStatus = "stopped"
	SandboxArchived SandboxStatus = "archived"
	SandboxGone     SandboxStatus = "gone"
)

// Resumable reports whether the sandbox exists but is not running (stopped or archived):
// Resume starts it with its files.
func (s SandboxStatus) Resumable() bool { return s == SandboxStopped || s == SandboxArchived }

// StatusReader reads a sandbox's state without starting it (the reaper's probe).
type StatusReader interface {
	// Status reports alive, stopped, archived or gone; an error is transient, never gone.
	Status(ctx context.Context, providerSandboxID string) (SandboxStatus, error)
}

// Stopper stops a sandbox that no run needs, so it stops costing compute (docs/design.md §2.5).
type Stopper interface {
	// Stop stops a running sandbox, keeping its files: a stopped (or paused/archived) one is
	// nil, a gone one ErrSandboxGone, any other error transient (never read as gone).
	Stop(ctx context.Context, providerSandboxID string) error
}

// LifeExtender is a provider whose sandboxes end after an absolute time to live however
// busy they are (E2B's timeout): the keeper extends a live run's sandbox on the run's
// heartbeats, about once per ExtendEvery (docs/design.md §5).
type LifeExtender interface {
	// ExtendLife makes the sandbox live at least the provider's time to live from now; a
	// gone one is ErrSandboxGone, any other error transient.
	ExtendLife(ctx context.Context, providerSandboxID string) error
	// ExtendEvery is the period of the extensions: well under the time to live, so one
	// missed window still leaves the sandbox alive.
	ExtendEvery() time.Duration
}

// Snapshotter captures a sandbox's filesystem.
type Snapshotter interface {
	// Snapshot returns the id of a new snapshot of the sandbox.
	Snapshot(ctx context.Context, providerSandboxID, label string) (snapshotID string, err error)
}

// SnapshotDeleter deletes snapshots nothing refers to any more (superseded on the row).
type SnapshotDeleter interface {
	// DeleteSnapshot deletes the snapshot; idempotent, already gone is nil.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
}

// Restorer creates sandboxes from snapshots.
type Restorer interface {
	// Restore creates a new sandbox from in.SnapshotID and returns its fresh id;
	// ErrSandboxGone when the snapshot no longer exists.
	Restore(ctx context.Context, in CreateInput) (providerSandboxID string, err error)
}

// ExecResult is a foreground command's outcome.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Executor runs shell commands inside a sandbox (the journal of docs/design.md §6 needs it).
type Executor interface {
	// Exec runs a shell command in the sandbox and waits for it.
	Exec(ctx context.Context, providerSandboxID, command string) (ExecResult, error)
	// Start runs a shell command in the background in its own process group, returning
	// the group id.
	Start(ctx context.Context, providerSandboxID, command string) (pgid int, err error)
	// Kill kills a process group of the sandbox; an already-gone group is nil.
	Kill(ctx context.Context, providerSandboxID string, pgid int) error
}

// JournalDirer is an Executor whose sandboxes share one host filesystem (local-process): it
// names the run-journal directory inside each sandbox, so no two sandboxes share one.
type JournalDirer interface {
	// JournalDir is a directory private to each sandbox, relative to its commands' working
	// directory (the sandbox's own); without this capability the journal uses an absolute one.
	JournalDir() string
}

// EnvStarter starts a background command with variables of its own (an agent's env).
type EnvStarter interface {
	// StartEnv is Executor.Start with env added to that command's environment alone; the
	// values never enter the command's text (so no process listing or log shows them).
	StartEnv(ctx context.Context, providerSandboxID, command string, env map[string]string) (pgid int, err error)
}

// EnvSetter re-injects secrets into a resumed sandbox.
type EnvSetter interface {
	// SetEnv sets environment variables for later commands in the sandbox.
	SetEnv(ctx context.Context, providerSandboxID string, env map[string]string) error
}

// MaxEnvEntryBytes bounds one variable as a process receives it, "NAME=value": the
// kernel refuses to exec with any single environment string of 128 KiB or more, its NUL
// included (Linux's MAX_ARG_STRLEN), which would surface as a launch that fails for ever.
const MaxEnvEntryBytes = 128<<10 - 1

// CheckEnv validates variables to inject into a sandbox: POSIX names
// ([A-Za-z_][A-Za-z0-9_]*), values without NUL, and NAME=value at most MaxEnvEntryBytes,
// the same on every provider, so a workspace's secrets valid on one provider are valid on
// all. Its messages name the variable, never its value.
func CheckEnv(env map[string]string) error {
	for k, v := range env {
		if !isEnvName(k) {
			return Invalid("env", "variable name %q", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return Invalid("env", "value of %s contains NUL", k)
		}
		if n := len(k) + 1 + len(v); n > MaxEnvEntryBytes {
			return Invalid("env", "%s=<value> is %d bytes; the exec limit is %d bytes per variable (128 KiB with its NUL)", k, n, MaxEnvEntryBytes)
		}
	}
	return nil
}

func isEnvName(k string) bool {
	if k == "" || k[0] >= '0' && k[0] <= '9' {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
