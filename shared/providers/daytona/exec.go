package daytona

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// execBody is the toolbox's ExecuteRequest.
type execBody struct {
	Command string            `json:"command"`
	Envs    map[string]string `json:"envs,omitempty"`
	Timeout int               `json:"timeout"` // seconds; always sent (older daemons default to 10)
}

// execResponse is the toolbox's ExecuteResponse: one combined output string.
type execResponse struct {
	ExitCode *int   `json:"exitCode"`
	Result   string `json:"result"`
}

// quote returns s as one POSIX shell word; nothing inside is ever expanded.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// shell wraps a script as the command sent to the toolbox: `sh -c '<script>'` runs the
// same whether the daemon feeds the command to a shell or runs it as a command line.
func shell(script string) string { return "sh -c " + quote(script) }

// The separators of execScript's output: '-' is outside the base64 alphabet.
const (
	sepStderr = "-"
	sepExit   = "-"
)

// execScript runs command with stdin from /dev/null and stdout and stderr in temporary
// files (a child the command leaves behind cannot hold the call open), then prints both
// base64-encoded, so bytes survive the toolbox's JSON string exactly:
// <stdout b64> NL "-" NL <stderr b64> NL "-<exit status>" NL.
func execScript(command string) string {
	return `o=$(mktemp) && e=$(mktemp) || exit 125
sh -c ` + quote(command) + ` </dev/null >"$o" 2>"$e"
rc=$?
base64 <"$o"
echo ` + sepStderr + `
base64 <"$e"
rm -f "$o" "$e"
echo "` + sepExit + `$rc"
`
}

// parseExec decodes execScript's output.
func parseExec(out string) (contract.ExecResult, error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 {
		return contract.ExecResult{}, errors.New("no output markers")
	}
	rc, err := strconv.Atoi(strings.TrimPrefix(lines[len(lines)-1], sepExit))
	if err != nil || !strings.HasPrefix(lines[len(lines)-1], sepExit) {
		return contract.ExecResult{}, errors.New("no exit status")
	}
	lines = lines[:len(lines)-1]
	sep := -1
	for i, l := range lines {
		if l == sepStderr {
			sep = i
			break
		}
	}
	if sep < 0 {
		return contract.ExecResult{}, errors.New("no stderr marker")
	}
	stdout, err := base64.StdEncoding.DecodeString(strings.Join(lines[:sep], ""))
	if err != nil {
		return contract.ExecResult{}, fmt.Errorf("stdout: %w", err)
	}
	stderr, err := base64.StdEncoding.DecodeString(strings.Join(lines[sep+1:], ""))
	if err != nil {
		return contract.ExecResult{}, fmt.Errorf("stderr: %w", err)
	}
	return contract.ExecResult{ExitCode: rc, Stdout: stdout, Stderr: stderr}, nil
}

// toolboxURL returns the toolbox base URL of sandbox id, reading the sandbox when it is
// not cached: ErrSandboxGone when gone, ErrNotStarted when not started.
func (p *Provider) toolboxURL(ctx context.Context, id string) (string, error) {
	p.mu.Lock()
	u, ok := p.toolbox[id]
	p.mu.Unlock()
	if ok {
		return u, nil
	}
	sb, err := p.get(ctx, id)
	if err != nil {
		return "", err
	}
	switch classify(sb) {
	case phaseAlive:
	case phaseGone:
		return "", goneErr(id, "is "+sb.State)
	default:
		return "", fmt.Errorf("daytona: sandbox %s is %s: %w", id, sb.State, ErrNotStarted)
	}
	if sb.ToolboxProxyURL == "" {
		return "", transientf("sandbox %s has no toolbox proxy URL", id)
	}
	return strings.TrimRight(sb.ToolboxProxyURL, "/") + "/" + seg(id), nil
}

// toolboxErr explains a failed toolbox call: the cached URL is dropped and the sandbox
// re-read, so a gone sandbox reads as ErrSandboxGone and a stopped one as ErrNotStarted;
// otherwise the call's own error stands.
func (p *Provider) toolboxErr(ctx context.Context, id string, err error) error {
	p.forget(id)
	if ctx.Err() != nil || errors.Is(err, ErrAuth) {
		return err
	}
	sb, gerr := p.get(ctx, id)
	switch {
	case errors.Is(gerr, contract.ErrSandboxGone):
		return gerr
	case gerr != nil:
		return err
	case classify(sb) == phaseGone:
		return goneErr(id, "is "+sb.State)
	case classify(sb) != phaseAlive:
		return fmt.Errorf("%w (sandbox is %s: %w)", err, sb.State, ErrNotStarted)
	}
	return err
}

// run sends script to the toolbox's process/execute. Only failures proving the command
// never ran are retried: a command is never run twice by this client.
func (p *Provider) run(ctx context.Context, op, id, script string, timeout time.Duration) (execResponse, error) {
	return p.runEnv(ctx, op, id, script, timeout, nil)
}

// runEnv is run with extra variables for this one command (merged over the sandbox's).
func (p *Provider) runEnv(ctx context.Context, op, id, script string, timeout time.Duration, extra map[string]string) (execResponse, error) {
	var res execResponse
	base, err := p.toolboxURL(ctx, id)
	if err != nil {
		return res, err
	}
	secs := int((timeout + time.Second - 1) / time.Second)
	if dl, ok := ctx.Deadline(); ok {
		secs = max(1, int((time.Until(dl)+time.Second-1)/time.Second))
	}
	envs := p.envOf(id)
	if len(extra) > 0 {
		envs = maps.Clone(envs)
		if envs == nil {
			envs = map[string]string{}
		}
		maps.Copy(envs, extra)
	}
	body := execBody{Command: shell(script), Envs: envs, Timeout: secs}
	err = p.do(ctx, request{op: op, method: http.MethodPost, url: base + "/process/execute", body: body,
		retry: retryRejected, timeout: time.Duration(secs)*time.Second + 15*time.Second, limit: 256 << 20}, &res, p.redactorWith(id, extra))
	if err != nil {
		return res, p.toolboxErr(ctx, id, err)
	}
	return res, nil
}

// Exec runs `sh -c command` in the sandbox (stdin /dev/null, the sandbox's env) and waits
// for it: exit status, and stdout and stderr byte for byte. ErrSandboxGone when the
// sandbox is gone; ErrNotStarted when it is not running.
func (p *Provider) Exec(ctx context.Context, id, command string) (contract.ExecResult, error) {
	if err := checkID(id); err != nil {
		return contract.ExecResult{}, err
	}
	res, err := p.run(ctx, "exec", id, execScript(command), p.cfg.ExecTimeout)
	if err != nil {
		return contract.ExecResult{}, err
	}
	out, perr := parseExec(res.Result)
	if perr != nil {
		code := -1
		if res.ExitCode != nil {
			code = *res.ExitCode
		}
		head := p.redactor(id).apply(res.Result)
		head = strings.ToValidUTF8(head[:min(len(head), 200)], "")
		return contract.ExecResult{}, fmt.Errorf("daytona: exec in %s: unreadable wrapper output (exit %d; are sh, base64 and mktemp in the image?): %v: %q",
			id, code, perr, head)
	}
	return out, nil
}

// Start runs `sh -c command` in the background as the leader of a new session (setsid),
// so its process group id is its pid, and returns that id once the group exists (a Kill
// right after Start finds it). Its stdio is /dev/null.
func (p *Provider) Start(ctx context.Context, id, command string) (int, error) {
	return p.StartEnv(ctx, id, command, nil)
}

// StartEnv is Start with env added to that command's variables alone (sent as the
// request's envs, never in the command text; redacted from every error like the sandbox's).
func (p *Provider) StartEnv(ctx context.Context, id, command string, env map[string]string) (int, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	if err := contract.CheckEnv(env); err != nil {
		return 0, err
	}
	// The new session leader writes its own pid, after setsid, then execs the command (same
	// pid); the launcher waits for that file, so the group exists when the id is returned.
	script := `command -v setsid >/dev/null 2>&1 || { echo 'sandkeep: setsid not found' >&2; exit 127; }
f=$(mktemp) || exit 125
setsid sh -c 'echo "$$" >"$1"; exec sh -c "$2"' sandkeep-start "$f" ` + quote(command) + ` </dev/null >/dev/null 2>&1 &
i=0
while [ ! -s "$f" ]; do
  i=$((i+1))
  if [ "$i" -gt 2000 ]; then rm -f "$f"; echo 'sandkeep: the process never started' >&2; exit 1; fi
  sleep 0.01 2>/dev/null || sleep 1
done
cat "$f"
rm -f "$f"
`
	res, err := p.runEnv(ctx, "start", id, script, 30*time.Second, env)
	if err != nil {
		return 0, err
	}
	out := strings.TrimSpace(res.Result)
	pgid, perr := strconv.Atoi(out)
	if res.ExitCode == nil || *res.ExitCode != 0 || perr != nil || pgid <= 1 {
		code := -1
		if res.ExitCode != nil {
			code = *res.ExitCode
		}
		out = p.redactorWith(id, env).apply(out)
		return 0, fmt.Errorf("daytona: start in %s: exit %d: %q", id, code, strings.ToValidUTF8(out[:min(len(out), 200)], ""))
	}
	return pgid, nil
}

// Kill sends SIGKILL to process group pgid of the sandbox; a group that no longer exists
// is nil, and so is any group of a stopped sandbox (no process survives a stop). pgid
// must be above 1 (kill -1 would signal every process).
func (p *Provider) Kill(ctx context.Context, id string, pgid int) error {
	if err := checkID(id); err != nil {
		return err
	}
	if pgid <= 1 {
		return contract.Invalid("pgid", "%d is not a process group id", pgid)
	}
	g := strconv.Itoa(pgid)
	// `kill -9 -N` is the form dash, bash and busybox all parse. A failed kill of a group
	// that kill -0 cannot see either means it is gone: nil.
	script := `kill -9 -` + g + ` 2>/dev/null && exit 0
kill -0 -` + g + ` 2>/dev/null && { echo 'sandkeep: group survives' >&2; exit 1; }
exit 0
`
	var res execResponse
	var err error
	for attempt := 0; ; attempt++ {
		// Kill is idempotent, so unlike Exec it is retried after an ambiguous failure.
		res, err = p.run(ctx, "kill", id, script, 30*time.Second)
		if err == nil || !errors.Is(err, ErrTransient) || attempt >= 3 || ctx.Err() != nil {
			break
		}
		if perr := p.pause(ctx, "kill", id, "unconfirmed"); perr != nil {
			break
		}
	}
	if errors.Is(err, ErrNotStarted) {
		return nil
	}
	if err != nil {
		return err
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		code := -1
		if res.ExitCode != nil {
			code = *res.ExitCode
		}
		return fmt.Errorf("daytona: kill group %d in %s: exit %d: %s", pgid, id, code, bytes.TrimSpace([]byte(p.redactor(id).apply(res.Result))))
	}
	return nil
}
