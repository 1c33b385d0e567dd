package localprocess

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
)

func (p *Provider) mergeEnv(id string, env map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.sandEnv[id]
	if m == nil {
		m = map[string]string{}
		p.sandEnv[id] = m
	}
	for k, v := range env {
		m[k] = v
	}
}

// environ is the environment of a command in sandbox id: the base environment with the
// sandbox's variables on top (sorted, so runs are reproducible).
func (p *Provider) environ(id string) []string {
	p.mu.Lock()
	m := p.sandEnv[id]
	extra := make([]string, 0, len(m))
	for k, v := range m {
		extra = append(extra, k+"="+v)
	}
	p.mu.Unlock()
	slices.Sort(extra)
	return append(slices.Clone(p.env), extra...)
}

// SetEnv sets variables for every later Exec/Start in the sandbox (merged with those set
// before); ErrSandboxGone when the sandbox does not exist.
func (p *Provider) SetEnv(ctx context.Context, id string, env map[string]string) error {
	if err := contract.CheckEnv(env); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := p.runnable(id); err != nil {
		return err
	}
	p.mergeEnv(id, env)
	return nil
}

// runnable returns the directory of a sandbox commands may run in: ErrSandboxGone when
// missing, ErrStopped when stopped.
func (p *Provider) runnable(id string) (string, error) {
	dir, st, err := p.state(id)
	switch {
	case err != nil:
		return "", err
	case st == contract.SandboxGone:
		return "", fmt.Errorf("local-process: %s: %w", id, contract.ErrSandboxGone)
	case st == contract.SandboxStopped:
		return "", fmt.Errorf("local-process: %s: %w", id, ErrStopped)
	}
	return dir, nil
}

func (p *Provider) command(dir, id, command string) *exec.Cmd {
	cmd := exec.Command(p.shell, "-c", command)
	cmd.Dir = dir
	cmd.Env = p.environ(id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// startErr classifies a failure to start a command: the sandbox vanished under it (its
// directory was the working directory) or something transient.
func (p *Provider) startErr(id string, err error) error {
	if _, st, serr := p.state(id); serr == nil && st == contract.SandboxGone {
		return fmt.Errorf("local-process: %s: %w", id, contract.ErrSandboxGone)
	}
	return fmt.Errorf("local-process: start in %s: %w", id, err)
}

// Exec runs `sh -c command` in the sandbox directory with the sandbox environment and waits
// for the shell: the result has its exit status (128+n when killed by signal n) and its
// whole stdout and stderr. A cancelled ctx kills the command's process group.
//
// Output goes to temporary files rather than pipes, so a background process the command
// leaves behind cannot hold Exec open; such a group stays recorded, so Destroy kills it.
func (p *Provider) Exec(ctx context.Context, id, command string) (contract.ExecResult, error) {
	if err := ctx.Err(); err != nil {
		return contract.ExecResult{}, err
	}
	dir, err := p.runnable(id)
	if err != nil {
		return contract.ExecResult{}, err
	}
	stdout, err := os.CreateTemp("", "sandkeep-exec-out-")
	if err != nil {
		return contract.ExecResult{}, fmt.Errorf("local-process: exec: %w", err)
	}
	defer removeTemp(stdout)
	stderr, err := os.CreateTemp("", "sandkeep-exec-err-")
	if err != nil {
		return contract.ExecResult{}, fmt.Errorf("local-process: exec: %w", err)
	}
	defer removeTemp(stderr)

	cmd := p.command(dir, id, command)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		return contract.ExecResult{}, p.startErr(id, err)
	}
	pgid := cmd.Process.Pid
	recErr := record(dir, pgid)
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		case <-done:
		}
	}()
	waitErr := cmd.Wait()
	close(done)
	unrecordIfEmpty(dir, pgid)

	if recErr != nil {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return contract.ExecResult{}, p.startErr(id, recErr)
	}
	if err := ctx.Err(); err != nil {
		return contract.ExecResult{}, fmt.Errorf("local-process: exec in %s: %w", id, err)
	}
	code, err := exitCode(cmd, waitErr)
	if err != nil {
		return contract.ExecResult{}, fmt.Errorf("local-process: exec in %s: %w", id, err)
	}
	res := contract.ExecResult{ExitCode: code}
	if res.Stdout, err = readAll(stdout); err == nil {
		res.Stderr, err = readAll(stderr)
	}
	if err != nil {
		return contract.ExecResult{}, fmt.Errorf("local-process: exec output: %w", err)
	}
	return res, nil
}

func removeTemp(f *os.File) {
	_ = f.Close()
	_ = os.Remove(f.Name())
}

func readAll(f *os.File) ([]byte, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// exitCode maps a finished command to a shell-style exit status.
func exitCode(cmd *exec.Cmd, waitErr error) (int, error) {
	var ee *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &ee) {
		return 0, waitErr
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return cmd.ProcessState.ExitCode(), nil
}

// Start runs `sh -c command` in the background as the leader of a new process group and
// returns the group id. The group is recorded in the sandbox (Destroy and Stop kill it);
// the child is reaped when it exits, so it never lingers as a zombie. ctx bounds only the
// start: the command outlives it, as an agent outlives the request that launched it.
// Stdin, stdout and stderr are /dev/null; the command redirects what it wants kept.
func (p *Provider) Start(ctx context.Context, id, command string) (int, error) {
	return p.StartEnv(ctx, id, command, nil)
}

// StartEnv is Start with env added to the command's environment (never to its text).
func (p *Provider) StartEnv(ctx context.Context, id, command string, env map[string]string) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := contract.CheckEnv(env); err != nil {
		return 0, err
	}
	dir, err := p.runnable(id)
	if err != nil {
		return 0, err
	}
	cmd := p.command(dir, id, command)
	for _, k := range slices.Sorted(maps.Keys(env)) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	if err := cmd.Start(); err != nil {
		return 0, p.startErr(id, err)
	}
	pgid := cmd.Process.Pid
	err = record(dir, pgid)
	// A shipper is known by its token, which only a shipper's environment holds
	// (docs/design.md §6): StopStarted counts it apart from the agents.
	if err == nil && !p.track(pgid, started{dir: dir, shipper: env[journal.EnvShipToken] != ""}) {
		err = ErrClosed
	}
	if err != nil {
		// Unrecorded (Destroy could not find it) or started after StopStarted: never leave
		// it running.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		_ = cmd.Wait()
		unrecordIfEmpty(dir, pgid)
		return 0, p.startErr(id, err)
	}
	go func() {
		_ = cmd.Wait()
		if unrecordIfEmpty(dir, pgid) {
			p.untrack(pgid)
		}
	}()
	return pgid, nil
}

// ErrClosed: StopStarted ran; this Provider starts nothing more.
var ErrClosed = errors.New("local-process: provider stopped its agents")

// started is a group Start launched: its sandbox directory, and whether it is a run's
// shipper rather than an agent.
type started struct {
	dir     string
	shipper bool
}

// track notes a group Start launched, for StopStarted; false once StopStarted ran.
func (p *Provider) track(pgid int, g started) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.started[pgid] = g
	return true
}

func (p *Provider) untrack(pgid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.started, pgid)
}

// StopStarted kills every process group Start launched through this Provider that still
// has a live process, refuses every later Start (ErrClosed), and returns how many groups
// it killed. A server whose run state dies with it (`sandkeep dev` on the in-memory
// backend) calls it on its way out: afterwards nothing could reach those agents, let
// alone finish their runs. Only groups still recorded in their sandbox are signalled, so
// a recycled pid is never hit. It returns how many agents and, apart, how many shippers
// it killed.
func (p *Provider) StopStarted() (agents, shippers int, err error) {
	p.mu.Lock()
	p.closed = true
	all := p.started
	p.started = map[int]started{}
	p.mu.Unlock()
	var errs []error
	for _, pgid := range slices.Sorted(maps.Keys(all)) {
		killed, err := killGroup(all[pgid].dir, pgid)
		switch {
		case killed && all[pgid].shipper:
			shippers++
		case killed:
			agents++
		}
		errs = append(errs, err)
	}
	return agents, shippers, errors.Join(errs...)
}

// Kill sends SIGKILL to a process group the sandbox started. A group that is already gone,
// or that this sandbox never started (its record is absent: another sandbox's group, or
// a sandbox restored from a snapshot), is nil: only recorded groups are ever signalled.
func (p *Provider) Kill(ctx context.Context, id string, pgid int) error {
	if pgid <= 1 {
		return contract.Invalid("pgid", "%d is not a process group id", pgid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, st, err := p.state(id)
	if err != nil {
		return err
	}
	if st == contract.SandboxGone {
		return nil
	}
	if _, err := killGroup(dir, pgid); err != nil {
		return fmt.Errorf("local-process: kill %d in %s: %w", pgid, id, err)
	}
	return nil
}

// record notes that process group pgid runs in sandbox dir, with its leader's start time.
func record(dir string, pgid int) error {
	return os.WriteFile(filepath.Join(dir, metaDir, pgidDir, strconv.Itoa(pgid)), []byte(procStart(pgid)), 0o644)
}

// unrecordIfEmpty drops the record of pgid once no process of the group is left (kill
// with signal 0 finds none); a group whose leader exited but whose children live on stays
// recorded.
func unrecordIfEmpty(dir string, pgid int) (empty bool) {
	if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
		_ = os.Remove(filepath.Join(dir, metaDir, pgidDir, strconv.Itoa(pgid)))
		return true
	}
	return false
}

// killGroup kills recorded group pgid of the sandbox in dir and drops its record; an
// unrecorded or vanished group is nil. killed reports whether the group had a process to
// kill.
func killGroup(dir string, pgid int) (killed bool, err error) {
	rec := filepath.Join(dir, metaDir, pgidDir, strconv.Itoa(pgid))
	want, err := os.ReadFile(rec)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// A leader that is alive with another start time is a recycled pid: the kernel only
	// reuses a pid once its process group is empty, so our group is gone.
	if got := procStart(pgid); len(want) > 0 && got != "" && got != string(want) {
		return false, removeRecord(rec)
	}
	err = syscall.Kill(-pgid, syscall.SIGKILL)
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return false, err
	}
	return err == nil, removeRecord(rec)
}

func removeRecord(rec string) error {
	if err := os.Remove(rec); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// killRecorded kills every recorded process group of the sandbox in dir.
func killRecorded(dir string) error {
	entries, err := os.ReadDir(filepath.Join(dir, metaDir, pgidDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		pgid, err := strconv.Atoi(e.Name())
		if err != nil || pgid <= 1 {
			continue
		}
		_, err = killGroup(dir, pgid)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// procStart returns the start time of process pid (field 22 of /proc/<pid>/stat, clock
// ticks since boot), or "" when it cannot be read (no such process, or no procfs).
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) is parenthesised and may hold spaces: count from its end.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(s[i+1:])
	const startField = 22 - 3 // fields after ")" start at field 3
	if len(fields) <= startField {
		return ""
	}
	return fields[startField]
}
