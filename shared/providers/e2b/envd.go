package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The envd process service is a Connect RPC service. Start is server-streaming: the
// request is one enveloped JSON message, the answer a sequence of enveloped JSON
// messages ending with an end-of-stream envelope (flag 0x02) that may carry an error.
// An envelope is 1 flag byte, a 4-byte big-endian length, then the message.
const (
	startPath          = "/process.Process/Start"
	connectContentType = "application/connect+json"
	flagCompressed     = 0x01
	flagEndStream      = 0x02
	maxEnvelope        = 16 << 20
	// keepalivePing asks envd for a keepalive event this often (seconds), so proxies do
	// not cut a long quiet command.
	keepalivePing = "50"
)

// shellArgv is how every command runs: a login bash, as E2B's own SDKs do, so the
// template's profile (PATH and the like) applies.
func shellArgv(command string) []string { return []string{"/bin/bash", "-l", "-c", command} }

// processConfig is envd's ProcessConfig message in its JSON form.
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
}

type startRequest struct {
	Process processConfig `json:"process"`
	Stdin   bool          `json:"stdin"` // false: the command reads EOF, never hangs on stdin
}

type processEvent struct {
	Start *struct {
		Pid uint32 `json:"pid"`
	} `json:"start"`
	Data *struct {
		Stdout []byte `json:"stdout"`
		Stderr []byte `json:"stderr"`
	} `json:"data"`
	End *struct {
		ExitCode int32   `json:"exitCode"`
		Exited   bool    `json:"exited"`
		Status   string  `json:"status"`
		Error    *string `json:"error"`
	} `json:"end"`
	Keepalive *struct{} `json:"keepalive"`
}

type startResponse struct {
	Event processEvent `json:"event"`
}

// connectError is a Connect error, from an end-of-stream message or a non-200 body.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// EnvdError is an error answer of a sandbox's envd (or of the proxy in front of it).
type EnvdError struct {
	Op      string
	Status  int    // HTTP status; 200 when the error came at the end of a stream
	Code    string // the Connect code, when given
	Message string // redacted
}

// Error reports the operation, status, Connect code and the (redacted) message.
func (e *EnvdError) Error() string {
	s := fmt.Sprintf("e2b: envd %s: HTTP %d", e.Op, e.Status)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Unwrap makes an unauthenticated envd answer match ErrConfig.
func (e *EnvdError) Unwrap() error {
	if e.Code == "unauthenticated" || e.Code == "permission_denied" ||
		e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden {
		return ErrConfig
	}
	return nil
}

// refused: envd (or the proxy) turned the request away before starting anything, so a
// retry cannot run the command twice. Only an HTTP-level answer qualifies: an error at
// the end of a stream may follow a started process, and a gateway timeout may hide one.
func (e *EnvdError) refused() bool {
	switch e.Status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	case http.StatusOK, http.StatusGatewayTimeout:
		return false
	}
	return e.Code == "unavailable" || e.Code == "resource_exhausted"
}

func (p *Provider) mergeEnv(id string, env map[string]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.env[id]
	if m == nil {
		m = map[string]string{}
		p.env[id] = m
	}
	maps.Copy(m, env)
}

func (p *Provider) envOf(id string) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.env[id])
}

// SetEnv merges env into the variables this client passes to every later command in
// the sandbox. E2B has no call that changes a running sandbox's environment, so they
// live in this client (per process; a resuming host calls SetEnv again) and travel
// with each process start. ErrSandboxGone when E2B no longer knows the sandbox.
func (p *Provider) SetEnv(ctx context.Context, id string, env map[string]string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := contract.CheckEnv(env); err != nil {
		return err
	}
	if _, err := p.connOf(ctx, id); err != nil && !errors.Is(err, ErrStopped) {
		return err
	}
	p.mergeEnv(id, env)
	return nil
}

// connOf returns how to reach the sandbox's envd, reading the sandbox once when this
// client has not seen it yet: ErrSandboxGone on 404, ErrStopped when paused.
func (p *Provider) connOf(ctx context.Context, id string) (conn, error) {
	p.mu.Lock()
	c := p.conns[id]
	if c != nil && c.envdVersion != "" {
		cc := *c
		p.mu.Unlock()
		return cc, nil
	}
	p.mu.Unlock()
	s, found, err := p.get(ctx, id)
	switch {
	case err != nil:
		return conn{}, err
	case !found:
		return conn{}, fmt.Errorf("e2b: sandbox %s: %w", id, contract.ErrSandboxGone)
	case s.State == "paused":
		return conn{}, fmt.Errorf("e2b: sandbox %s: %w", id, ErrStopped)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[id]; c != nil {
		return *c, nil
	}
	return conn{envdVersion: s.EnvdVersion, token: s.EnvdAccessToken}, nil
}

// dropToken forgets a sandbox's envd details so the next call reads them again.
func (p *Provider) dropToken(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[id]; c != nil {
		c.token, c.envdVersion = "", ""
	}
}

// envdURL is the base URL of a sandbox's envd.
func (p *Provider) envdURL(id string, c conn) string {
	domain := c.domain
	if domain == "" {
		domain = p.cfg.Domain
	}
	return fmt.Sprintf("https://%d-%s.%s", EnvdPort, id, domain)
}

func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:5], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// readEnvelope reads one envelope; io.EOF at a clean boundary.
func readEnvelope(r *bufio.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, fmt.Errorf("truncated envelope header: %w", err)
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:5])
	if n > maxEnvelope {
		return 0, nil, fmt.Errorf("envelope of %d bytes is too large", n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return 0, nil, fmt.Errorf("truncated envelope: %w", err)
	}
	return h[0], msg, nil
}

// run starts argv in the sandbox over envd and collects its output until it ends. It
// retries only what envd or its proxy refused before starting anything; a 502 is
// checked against the control plane, so a sandbox that is gone or paused says so.
func (p *Provider) run(ctx context.Context, op, id string, argv []string) (contract.ExecResult, error) {
	return p.runEnv(ctx, op, id, argv, nil)
}

// runEnv is run with extra variables for this one process (merged over the sandbox's).
func (p *Provider) runEnv(ctx context.Context, op, id string, argv []string, extra map[string]string) (contract.ExecResult, error) {
	if err := checkID(id); err != nil {
		return contract.ExecResult{}, err
	}
	var res contract.ExecResult
	authRetried := false
	err := p.retry(ctx, "envd "+op+" in "+id, func(ctx context.Context, _ int) (bool, time.Duration, error) {
		c, err := p.connOf(ctx, id)
		if err != nil {
			return true, 0, err
		}
		r, err := p.startOnce(ctx, op, id, c, argv, extra)
		var ee *EnvdError
		switch {
		case err == nil:
			res = r
			return true, 0, nil
		case errors.As(err, &ee) && ee.Status == http.StatusUnauthorized && !authRetried:
			// The token may have changed (a resume); read it again once.
			authRetried = true
			p.dropToken(id)
			return false, 0, err
		case errors.As(err, &ee) && ee.Status == http.StatusBadGateway:
			st, serr := p.Status(ctx, id)
			switch {
			case serr == nil && st == contract.SandboxGone:
				return true, 0, fmt.Errorf("e2b: sandbox %s: %w", id, contract.ErrSandboxGone)
			case serr == nil && st == contract.SandboxStopped:
				return true, 0, fmt.Errorf("e2b: sandbox %s: %w", id, ErrStopped)
			}
			return false, 0, err
		case errors.As(err, &ee) && ee.refused():
			return false, 0, err
		case isDialError(err) && ctx.Err() == nil:
			return false, 0, err
		}
		return true, 0, err
	})
	if err != nil {
		return contract.ExecResult{}, err
	}
	p.keepAlive(ctx, id)
	return res, nil
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// keepAlive pushes the sandbox's end out to Lifetime() from now when this client last
// did so more than a quarter of Lifetime() ago: a host that keeps reading its agent's
// journal keeps the sandbox alive even while attached. Best effort.
func (p *Provider) keepAlive(ctx context.Context, id string) {
	p.mu.Lock()
	c := p.conns[id]
	due := c == nil || time.Since(c.refreshed) > p.lifetime/4
	p.mu.Unlock()
	if !due {
		return
	}
	if err := p.setTimeout(ctx, id); err != nil {
		p.log.Warn("e2b: could not refresh the sandbox timeout", "sandbox", id, "err", err.Error())
	}
}

// startOnce is one Start call: send the request, read the stream to its end.
func (p *Provider) startOnce(ctx context.Context, op, id string, c conn, argv []string, extra map[string]string) (contract.ExecResult, error) {
	envs := p.envOf(id)
	if len(extra) > 0 {
		envs = maps.Clone(envs)
		if envs == nil {
			envs = map[string]string{}
		}
		maps.Copy(envs, extra)
	}
	msg, err := json.Marshal(startRequest{Process: processConfig{Cmd: argv[0], Args: argv[1:], Envs: envs}})
	if err != nil {
		return contract.ExecResult{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.envdURL(id, c)+startPath, bytes.NewReader(envelope(0, msg)))
	if err != nil {
		return contract.ExecResult{}, err
	}
	req.Header.Set("Content-Type", connectContentType)
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Keepalive-Ping-Interval", keepalivePing)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(EnvdPort))
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(p.cfg.User+":")))
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	if dl, ok := ctx.Deadline(); ok {
		if ms := time.Until(dl).Milliseconds(); ms > 0 {
			req.Header.Set("Connect-Timeout-Ms", strconv.FormatInt(ms, 10))
		}
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: %w", op, id, p.scrub(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var ce connectError
		if json.Unmarshal(b, &ce) != nil || (ce.Code == "" && ce.Message == "") {
			ce.Message = strings.TrimSpace(string(b))
		}
		return contract.ExecResult{}, &EnvdError{Op: op + " in " + id, Status: resp.StatusCode, Code: p.redactWith(extra, ce.Code), Message: p.redactWith(extra, ce.Message)}
	}
	var out contract.ExecResult
	var stdout, stderr bytes.Buffer
	started := false
	br := bufio.NewReader(resp.Body)
	for {
		flags, body, err := readEnvelope(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream ended without an end-of-stream message")
			}
			return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: %w", op, id, p.scrub(err))
		}
		if flags&flagCompressed != 0 {
			return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: compressed message (not requested)", op, id)
		}
		if flags&flagEndStream != 0 {
			var end struct {
				Error *connectError `json:"error"`
			}
			if err := json.Unmarshal(body, &end); err != nil {
				return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: unreadable end of stream", op, id)
			}
			if end.Error != nil {
				return contract.ExecResult{}, &EnvdError{Op: op + " in " + id, Status: http.StatusOK, Code: p.redactWith(extra, end.Error.Code), Message: p.redactWith(extra, end.Error.Message)}
			}
			return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: stream ended before the process did", op, id)
		}
		var ev startResponse
		if err := json.Unmarshal(body, &ev); err != nil {
			return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: unreadable event: %w", op, id, err)
		}
		e := ev.Event
		switch {
		case e.Start != nil:
			started = true
		case e.Data != nil:
			stdout.Write(e.Data.Stdout)
			stderr.Write(e.Data.Stderr)
			if stdout.Len()+stderr.Len() > p.cfg.MaxOutput {
				return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: output exceeds %d bytes", op, id, p.cfg.MaxOutput)
			}
		case e.End != nil:
			if e.End.Error != nil && !started {
				return contract.ExecResult{}, fmt.Errorf("e2b: envd %s in %s: process did not start: %s", op, id, p.redactWith(extra, *e.End.Error))
			}
			out.ExitCode = exitCode(e.End.ExitCode, e.End.Exited, e.End.Status)
			out.Stdout, out.Stderr = stdout.Bytes(), stderr.Bytes()
			// Drain to the end-of-stream envelope so the connection can be reused; its
			// content no longer matters.
			_, _ = io.Copy(io.Discard, io.LimitReader(br, 1<<20))
			return out, nil
		}
	}
}

// signalNumber numbers the signal names Go's process status uses ("signal: killed").
func signalNumber(name string) (int, bool) {
	switch name {
	case "hangup":
		return 1, true
	case "interrupt":
		return 2, true
	case "quit":
		return 3, true
	case "aborted":
		return 6, true
	case "killed":
		return 9, true
	case "segmentation fault":
		return 11, true
	case "broken pipe":
		return 13, true
	case "alarm clock":
		return 14, true
	case "terminated":
		return 15, true
	}
	return 0, false
}

// exitCode maps envd's end event to a shell-style status: the exit code when the
// process exited, 128+n when signal n ended it, -1 when unknown.
func exitCode(code int32, exited bool, status string) int {
	if exited {
		return int(code)
	}
	if name, ok := strings.CutPrefix(status, "signal: "); ok {
		if n, ok := signalNumber(name); ok {
			return 128 + n
		}
	}
	if code > 0 {
		return int(code)
	}
	return -1
}

// Exec runs `bash -l -c command` in the sandbox as the configured user, with the
// client's environment for the sandbox, and waits for it: exit status (128+n when
// signal n ended the shell), stdout and stderr. ErrSandboxGone when E2B confirms the
// sandbox is gone; ErrStopped when it is paused (Exec never resumes).
func (p *Provider) Exec(ctx context.Context, id, command string) (contract.ExecResult, error) {
	return p.run(ctx, "exec", id, shellArgv(command))
}

// quote returns s as one POSIX shell word.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// startScript launches command under setsid and prints the new group's id only once
// the group exists: the command's shell first prints its own $$ (it is the session
// and group leader, whether or not setsid had to fork) into the wrapper's process
// substitution, then points its stdio at /dev/null and runs command. The wrapper
// does not wait for a process substitution, so it exits at once; the command holds
// none of the wrapper's (envd's) pipes. Printing $! instead would race setsid(2): a
// caller could kill the group before it existed.
func startScript(command string) string {
	inner := "echo $$\nexec </dev/null >/dev/null 2>&1\n" + command
	return "read -r pgid < <(setsid /bin/bash -c " + quote(inner) + " 2>&1 </dev/null)\nprintf '%s\\n' \"$pgid\"\n"
}

// Start runs command in the background in its own session and process group (setsid,
// which the template must provide) and returns the group id. envd sees only the short
// wrapper that launches it, so the command outlives the call and envd's stream.
func (p *Provider) Start(ctx context.Context, id, command string) (int, error) {
	return p.StartEnv(ctx, id, command, nil)
}

// StartEnv is Start with env added to that process's variables alone (sent as the
// process's envs, never in its command text; redacted from every error).
func (p *Provider) StartEnv(ctx context.Context, id, command string, env map[string]string) (int, error) {
	if err := contract.CheckEnv(env); err != nil {
		return 0, err
	}
	res, err := p.runEnv(ctx, "start", id, shellArgv(startScript(command)), env)
	if err != nil {
		return 0, err
	}
	pgid, perr := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if res.ExitCode != 0 || perr != nil || pgid <= 1 {
		return 0, fmt.Errorf("e2b: start in %s: launcher exited %d without a process group id: %s",
			id, res.ExitCode, p.redactWith(env, strings.TrimSpace(string(res.Stdout)+" "+string(res.Stderr))))
	}
	return pgid, nil
}

// Kill sends SIGKILL to process group pgid in the sandbox; a group that no longer
// exists is nil.
func (p *Provider) Kill(ctx context.Context, id string, pgid int) error {
	if pgid <= 1 {
		return contract.Invalid("pgid", "%d is not a process group id", pgid)
	}
	n := strconv.Itoa(pgid)
	// Exit 3 marks "no such process": the group is already gone.
	res, err := p.Exec(ctx, id, "out=$(kill -KILL -- -"+n+" 2>&1) && exit 0\n"+
		"case \"$out\" in *\"No such process\"*) exit 3;; esac\nprintf '%s' \"$out\"\nexit 1\n")
	if err != nil {
		return err
	}
	switch res.ExitCode {
	case 0, 3: // killed, or no such group
		return nil
	}
	return fmt.Errorf("e2b: kill group %d in %s: exit %d: %s", pgid, id, res.ExitCode, p.redact(strings.TrimSpace(string(res.Stdout))))
}
