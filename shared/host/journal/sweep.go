package journal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// OrphanAge is how old a journal unknown to the run store must be before a sweep deletes it
// (docs/design.md §6): the newest of its files' mtimes, compared with the sweeper's clock; an hour absorbs
// ordinary clock skew between host and sandbox.
const OrphanAge = time.Hour

// ErrNoMtimes: the sandbox's stat printed no witness line for the directory (e.g. a BSD
// stat without -c), so no listing or age can be trusted.
var ErrNoMtimes = errors.New("journal: stat gave no mtime witness for the directory")

// Entry is one run's files in a journal directory.
type Entry struct {
	RunID   string
	Names   []string  // its file names in the directory, sorted
	ModTime time.Time // the newest mtime of its files (second precision)
}

// OlderThan reports whether every file of the run was last modified at or before cutoff.
func (e Entry) OlderThan(cutoff time.Time) bool { return !e.ModTime.After(cutoff) }

// Listing is a journal directory as a sweep sees it.
type Listing struct {
	// Runs are the decodable runs, sorted by run id. Only these may be deleted, by run id
	// (Delete re-derives every path from it).
	Runs []Entry
	// Undecodable are names a sweep must leave alone: it cannot tell whose they are.
	Undecodable []string
	// Foreign are names of other tenants' runs: a sweep in one tenant never touches them.
	Foreign []string
}

// List lists the journal directory's files (DirFor) with their mtimes in one shell call
// (`stat -c '%Y %n'`, dot-files included) and groups ctx's tenant's by run id; names that do
// not decode (capped, non-canonical, of the old run-id-only format) and other tenants'
// names are returned apart, never as runs. A missing directory lists nothing; a stat that
// prints no line for the directory itself is ErrNoMtimes, never an empty listing, so an
// unsupported stat cannot read as "nothing here".
func List(ctx context.Context, ex contract.Executor, psid, dir string) (Listing, error) {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return Listing{}, err
	}
	d, err := cleanDir(DirFor(ex, dir))
	if err != nil {
		return Listing{}, err
	}
	script := "d=" + Quote(d) + "\n" +
		"[ -d \"$d\" ] || { echo nodir; exit 0; }\n" +
		"stat -c '%Y %n' -- \"$d\" \"$d\"/* \"$d\"/.[!.]* \"$d\"/..?* 2>/dev/null\n" +
		"exit 0\n"
	res, err := ex.Exec(ctx, psid, script)
	if err != nil {
		return Listing{}, fmt.Errorf("journal: list %s: %w", d, err)
	}
	if res.ExitCode != 0 {
		return Listing{}, fmt.Errorf("journal: list %s: exit %d: %s", d, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	if string(res.Stdout) == "nodir\n" {
		return Listing{}, nil
	}
	return parseListing(d, tenant, string(res.Stdout))
}

// parseListing parses `stat -c '%Y %n'` lines for directory d as tenant sees it:
// "<seconds> <d>" is the witness; "<seconds> <d>/<name>" an entry. Other lines (a name
// holding a newline splits into some) are ignored.
func parseListing(d, tenant, out string) (Listing, error) {
	prefix := d + "/"
	if d == "/" {
		prefix = "/"
	}
	witness := false
	runs := map[string]*Entry{}
	var undecodable, foreign []string
	for line := range strings.Lines(out) {
		line = strings.TrimSuffix(line, "\n")
		secs, path, ok := strings.Cut(line, " ")
		if !ok || secs == "" || strings.Trim(secs, "0123456789") != "" {
			continue
		}
		n, err := strconv.ParseInt(secs, 10, 64)
		if err != nil {
			continue
		}
		if path == d {
			witness = true
			continue
		}
		name, ok := strings.CutPrefix(path, prefix)
		if !ok || name == "" || strings.Contains(name, "/") {
			continue
		}
		owner, runID, _, ok := SplitName(name)
		switch {
		case !ok:
			undecodable = append(undecodable, name)
			continue
		case owner != tenant:
			foreign = append(foreign, name)
			continue
		}
		mt := time.Unix(n, 0)
		e := runs[runID]
		if e == nil {
			e = &Entry{RunID: runID, ModTime: mt}
			runs[runID] = e
		}
		e.Names = append(e.Names, name)
		if mt.After(e.ModTime) {
			e.ModTime = mt
		}
	}
	if !witness {
		return Listing{}, fmt.Errorf("journal: list %s: %w", d, ErrNoMtimes)
	}
	l := Listing{Undecodable: undecodable, Foreign: foreign}
	slices.Sort(l.Undecodable)
	slices.Sort(l.Foreign)
	for _, e := range runs {
		slices.Sort(e.Names)
		l.Runs = append(l.Runs, *e)
	}
	slices.SortFunc(l.Runs, func(a, b Entry) int { return strings.Compare(a.RunID, b.RunID) })
	return l, nil
}
