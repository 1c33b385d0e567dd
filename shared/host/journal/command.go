package journal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// ErrJournalExists: the run's journal is already there; a second agent is never launched.
var ErrJournalExists = errors.New("journal: run already launched (journal exists)")

// ErrNoJournal: the run has no journal in the sandbox.
var ErrNoJournal = errors.New("journal: no journal")

// Exit statuses of the launch script itself (the agent's own status goes to the sentinel).
const (
	ExitJournalExists = 124 // the journal already existed: nothing was launched
	ExitNoDir         = 125 // the journal directory could not be made
	ExitInvalid       = 126 // the run id or dir was invalid: nothing was launched
)

// nonceDomain separates the exit nonce from every other SHA-256 use.
const nonceDomain = "sandkeep/journal-exit/v1:"

// ExitNonce returns the first 32 hex digits of SHA-256("sandkeep/journal-exit/v1:" + runID):
// derived, not random, so any reader can recompute it. It stops accidental forgery (an
// agent echoing {"__exit":0}), not an agent that knows its own run id.
func ExitNonce(runID string) string {
	sum := sha256.Sum256([]byte(nonceDomain + runID))
	return hex.EncodeToString(sum[:])[:32]
}

// SentinelLine returns the exit sentinel of runID without its newline:
// {"__exit":<code>,"__nonce":"<nonce>"} (this key order, no spaces).
func SentinelLine(runID string, code int) string {
	return `{"__exit":` + strconv.Itoa(code) + `,"__nonce":"` + ExitNonce(runID) + `"}`
}

// sentinelMax bounds the lines worth parsing as a sentinel (the canonical one is ~60 bytes;
// other writers may add spaces).
const sentinelMax = 256

// parseSentinel reports whether line is an exit sentinel carrying nonce, and its code. Any
// JSON object with exactly the members __exit (an integer) and __nonce (the nonce) counts,
// whatever its spacing, so writers in other languages need not match bytes.
func parseSentinel(line []byte, nonce string) (int, bool) {
	line = bytes.TrimSpace(line)
	if len(line) > sentinelMax || len(line) == 0 || line[0] != '{' || !bytes.Contains(line, []byte(nonce)) {
		return 0, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(line, &m) != nil || len(m) != 2 {
		return 0, false
	}
	var n string
	if json.Unmarshal(m["__nonce"], &n) != nil || n != nonce {
		return 0, false
	}
	code, err := strconv.Atoi(string(m["__exit"]))
	if err != nil {
		return 0, false
	}
	return code, true
}

// Quote returns s as one POSIX shell word: single-quoted, each embedded ' written as '\”.
// Nothing inside is ever expanded.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Command returns the POSIX sh script that launches agentCmd journaled for runID under dir:
// it refuses to start when the journal already exists (atomically, by noclobber's O_EXCL
// create; exit ExitJournalExists, so a retried start never launches twice), writes its own
// pid to the pid file — the script runs as a process group leader (Executor.Start's
// contract), so that is the agent's process group id — runs agentCmd in a subshell with
// stdout appended (>>) to the journal and stderr to the .err file, then ends an unfinished
// last line with a newline and appends the exit sentinel with the subshell's status. Every path is quoted; agentCmd is the caller's shell
// text, inserted as is on its own lines (an `exit N` in it ends only the subshell). An
// invalid tenant, run id or dir (see PathsFor) yields a script that launches nothing and
// exits ExitInvalid; Launch reports those as ErrInvalid before starting anything.
func Command(dir, tenant, runID, agentCmd string) string {
	p, err := PathsFor(dir, tenant, runID)
	if err != nil {
		return fmt.Sprintf("echo 'sandkeep: invalid journal run id or dir' >&2\nexit %d\n", ExitInvalid)
	}
	j, e := Quote(p.Journal), Quote(p.Stderr)
	var b strings.Builder
	fmt.Fprintf(&b, "mkdir -p -- %s || exit %d\n", Quote(p.Dir), ExitNoDir)
	fmt.Fprintf(&b, "set -C\n")
	fmt.Fprintf(&b, "if ! true 2>/dev/null >%s; then echo 'sandkeep: journal exists' >&2; exit %d; fi\n", j, ExitJournalExists)
	fmt.Fprintf(&b, "set +C\n")
	fmt.Fprintf(&b, "echo $$ >%s\n", Quote(p.PID))
	fmt.Fprintf(&b, "(\n%s\n) >>%s 2>>%s\n", agentCmd, j, e)
	fmt.Fprintf(&b, "sandkeep_rc=$?\n")
	// An agent whose output does not end with a newline must not glue the sentinel to its
	// last line: that line would never read as the sentinel, and the run never as ended.
	fmt.Fprintf(&b, "if [ -s %s ] && [ \"$(tail -c 1 -- %s | wc -l)\" -eq 0 ]; then printf '\\n' >>%s; fi\n", j, j, j)
	fmt.Fprintf(&b, "printf '{\"__exit\":%%d,\"__nonce\":\"%%s\"}\\n' \"$sandkeep_rc\" %s >>%s\n", ExitNonce(runID), j)
	return b.String()
}

// Launch starts agentCmd journaled for ctx's tenant's run runID in the background (Executor.Start) and returns
// its process group id; ErrJournalExists when the run was launched before. Two racing
// launches may both pass the early check; the script's atomic create lets one run.
func Launch(ctx context.Context, ex contract.Executor, psid, dir, runID, agentCmd string) (int, error) {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return 0, err
	}
	p, err := PathsFor(DirFor(ex, dir), tenant, runID)
	if err != nil {
		return 0, err
	}
	script := Command(p.Dir, tenant, runID, agentCmd)
	res, err := ex.Exec(ctx, psid, "test -e "+Quote(p.Journal))
	if err != nil {
		return 0, fmt.Errorf("journal: launch %s: %w", runID, err)
	}
	if res.ExitCode == 0 {
		return 0, fmt.Errorf("journal: launch %s: %w", runID, ErrJournalExists)
	}
	pgid, err := ex.Start(ctx, psid, script)
	if err != nil {
		return 0, fmt.Errorf("journal: launch %s: %w", runID, err)
	}
	return pgid, nil
}

// PID returns the agent's process group id from the run's pid file; found=false when there
// is no (complete) pid file.
func PID(ctx context.Context, ex contract.Executor, psid, dir, runID string) (pgid int, found bool, err error) {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return 0, false, err
	}
	res, err := ex.Exec(ctx, psid, "cat -- "+Quote(p.PID)+" 2>/dev/null")
	if err != nil {
		return 0, false, fmt.Errorf("journal: pid of %s: %w", runID, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if res.ExitCode != 0 || err != nil || n <= 1 {
		return 0, false, nil
	}
	return n, true, nil
}

// KillAgent kills the run's agent process group named by its pid file (Executor.Kill); a
// run without a pid file has nothing to kill and is nil.
func KillAgent(ctx context.Context, ex contract.Executor, psid, dir, runID string) error {
	pgid, found, err := PID(ctx, ex, psid, dir, runID)
	if err != nil || !found {
		return err
	}
	if err := ex.Kill(ctx, psid, pgid); err != nil {
		return fmt.Errorf("journal: kill agent of %s: %w", runID, err)
	}
	return nil
}

// StderrTailBytes is how much of the stderr sidecar StderrTail reads by default.
const StderrTailBytes = 4096

// StderrTail returns up to the last n bytes (n <= 0: StderrTailBytes) of the run's stderr
// sidecar; a missing sidecar reads as empty.
func StderrTail(ctx context.Context, ex contract.Executor, psid, dir, runID string, n int) ([]byte, error) {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		n = StderrTailBytes
	}
	res, err := ex.Exec(ctx, psid, fmt.Sprintf("tail -c %d -- %s 2>/dev/null", n, Quote(p.Stderr)))
	if err != nil {
		return nil, fmt.Errorf("journal: stderr of %s: %w", runID, err)
	}
	return res.Stdout, nil
}

// Delete removes the run's journal, stderr and pid files and the shipper's; files already gone are fine.
// Call it only after the run's terminal write and log close succeeded (docs/design.md §6).
func Delete(ctx context.Context, ex contract.Executor, psid, dir, runID string) error {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return err
	}
	res, err := ex.Exec(ctx, psid, "rm -f -- "+Quote(p.Journal)+" "+Quote(p.Stderr)+" "+Quote(p.PID)+" "+
		Quote(p.ShipPID)+" "+Quote(p.ShipHeaders)+" "+Quote(p.ShipBody)+" "+Quote(p.ShipOut)+
		// and the scratch files of shippers killed before their EXIT trap (<name>.<pid>)
		" "+Quote(p.ShipHeaders)+".* "+Quote(p.ShipBody)+".* "+Quote(p.ShipOut)+".*")
	if err != nil {
		return fmt.Errorf("journal: delete %s: %w", runID, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("journal: delete %s: rm exited %d: %s", runID, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return nil
}
