// Package journal is the in-sandbox run journal: an agent's stdout appended to an NDJSON
// file inside the sandbox, closed by an exit sentinel, so its output outlives the host that
// launched it. The wire format is language-neutral:
//
//   - directory Dir inside the sandbox: the provider's (contract.JournalDirer; local-process
//     keeps it under each sandbox's own directory, since its sandboxes share one host), else
//     /tmp/sandkeep-runs;
//   - files <name>.ndjson (stdout, then one sentinel line), <name>.err (stderr) and
//     <name>.pid (the agent's process group id), name = enc(tenant + "/" + runId): the
//     tenant is part of every name, so two tenants' runs of one id never share a file, in
//     whatever directory they meet;
//   - enc keeps [A-Za-z0-9.-] and writes every other byte of its UTF-8 input as "_" + two
//     lowercase hex digits; names longer than 200 are capped with a hash suffix;
//   - sentinel {"__exit":<code>,"__nonce":"<nonce>"}, nonce = first 32 hex digits of
//     SHA-256("sandkeep/journal-exit/v1:" + runId).
//
// Everything here touches the journal only through a contract.Executor's shell, never through
// a filesystem API, so it works against any provider that can run a POSIX shell. Every call
// taking a context names the files of that context's tenant (contract.Tenant), as the stores do.
package journal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// DefaultDir is the journal directory inside a sandbox when neither the caller nor the
// provider names one: right for providers whose sandboxes each have a filesystem of their own.
const DefaultDir = "/tmp/sandkeep-runs"

// MaxNameLen caps an encoded run id (the file name without its extension).
const MaxNameLen = 200

// hashLen is the length of the hash suffix of a capped name (128 bits: two long run ids
// sharing a prefix collide only by a SHA-256 collision).
const hashLen = 32

// The file extensions of a run's files.
const (
	ExtJournal = ".ndjson"
	ExtStderr  = ".err"
	ExtPID     = ".pid"
	// The shipper's files (docs/design.md §6): its pid, and its scratch files (the last
	// answer's headers and body, the batch being sent).
	ExtShipPID     = ".ship.pid"
	ExtShipHeaders = ".ship.h"
	ExtShipBody    = ".ship.b"
	ExtShipOut     = ".ship.o"
)

// exts are the extensions of a run's files, a longer one before any it ends with.
var exts = []string{ExtJournal, ExtStderr, ExtShipPID, ExtPID, ExtShipHeaders, ExtShipBody, ExtShipOut}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-'
}

// Encode returns the file name token of runID: [A-Za-z0-9.-] kept, every other byte as
// "_xx" (lowercase hex). A token over MaxNameLen is cut and ends in "-" + 32 hex digits of
// SHA-256(runID); a token that merely looks like a capped one is capped too, so Encode
// stays injective. Encode is total; callers validate run ids (CheckRunID) first.
func Encode(runID string) string {
	var b strings.Builder
	b.Grow(len(runID))
	for i := 0; i < len(runID); i++ {
		c := runID[i]
		if isNameByte(c) {
			b.WriteByte(c)
			continue
		}
		const digits = "0123456789abcdef"
		b.WriteByte('_')
		b.WriteByte(digits[c>>4])
		b.WriteByte(digits[c&0xf])
	}
	s := b.String()
	if len(s) > MaxNameLen || looksCapped(s) {
		sum := sha256.Sum256([]byte(runID))
		s = s[:MaxNameLen-1-hashLen] + "-" + hex.EncodeToString(sum[:])[:hashLen]
	}
	return s
}

// looksCapped reports whether s has the shape of a capped token: exactly MaxNameLen long,
// ending in "-" and hashLen lowercase hex digits.
func looksCapped(s string) bool {
	if len(s) != MaxNameLen || s[MaxNameLen-1-hashLen] != '-' {
		return false
	}
	for i := MaxNameLen - hashLen; i < MaxNameLen; i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Decode returns the run id a token encodes. It fails closed (its consumer deletes files):
// capped tokens, malformed or non-canonical escapes ("_41" for "A", uppercase hex), invalid
// UTF-8 and ids the stores reject are all ok=false. The result is a store key, never a path.
func Decode(token string) (runID string, ok bool) {
	if token == "" || len(token) > MaxNameLen || looksCapped(token) {
		return "", false
	}
	b := make([]byte, 0, len(token))
	for i := 0; i < len(token); i++ {
		c := token[i]
		switch {
		case isNameByte(c):
			b = append(b, c)
		case c == '_' && i+2 < len(token):
			v, err := hex.DecodeString(token[i+1 : i+3])
			if err != nil {
				return "", false
			}
			b = append(b, v[0])
			i += 2
		default:
			return "", false
		}
	}
	runID = string(b)
	if !utf8.ValidString(runID) || contract.CheckStoreID("runId", runID) != nil || Encode(runID) != token {
		return "", false
	}
	return runID, true
}

// tenantSep joins the tenant and the run id of a name; the tenant charset
// (contract.CheckTenant: [A-Za-z0-9._-]) never holds it, so the first one splits a name.
const tenantSep = "/"

// Name returns the file name token of tenant's run runID: Encode(tenant + "/" + runID).
// Injective over (tenant, runID), so no two tenants' runs share a name.
func Name(tenant, runID string) string { return Encode(tenant + tenantSep + runID) }

// ParseName returns the tenant and run id a token names; ok=false for anything Decode
// refuses and for a token without a tenant (a name of the old, run-id-only format).
func ParseName(token string) (tenant, runID string, ok bool) {
	id, ok := Decode(token)
	if !ok {
		return "", "", false
	}
	tenant, runID, found := strings.Cut(id, tenantSep)
	if !found || contract.CheckTenant(tenant) != nil || CheckRunID(runID) != nil {
		return "", "", false
	}
	return tenant, runID, true
}

// SplitName parses a journal directory entry "<token><ext>" (ext one of .ndjson, .err,
// .pid and the shipper's .ship.*) into its tenant, run id and extension; ok=false for
// anything ParseName refuses.
func SplitName(name string) (tenant, runID, ext string, ok bool) {
	for _, e := range exts {
		if tok, found := strings.CutSuffix(name, e); found {
			tenant, id, ok := ParseName(tok)
			return tenant, id, e, ok
		}
	}
	return "", "", "", false
}

// CheckRunID is the journal's check of a run id: the stores' rule (non-empty, valid UTF-8,
// no NUL, at most contract.MaxIDLen bytes), so file names and nonces are the same bytes in
// every language.
func CheckRunID(runID string) error { return contract.CheckStoreID("runId", runID) }

// Paths are the shell paths of one run's files.
type Paths struct {
	Dir     string
	Journal string // <dir>/<enc>.ndjson
	Stderr  string // <dir>/<enc>.err
	PID     string // <dir>/<enc>.pid
	// The shipper's: <dir>/<enc>.ship.pid, .ship.h, .ship.b, .ship.o.
	ShipPID, ShipHeaders, ShipBody, ShipOut string
}

// PathsFor returns the paths of tenant's run runID under dir ("" = DefaultDir). A relative
// dir is relative to the sandbox's working directory. ErrInvalid for a bad tenant or run id,
// or a dir holding NUL.
func PathsFor(dir, tenant, runID string) (Paths, error) {
	if err := contract.CheckTenant(tenant); err != nil {
		return Paths{}, err
	}
	if err := CheckRunID(runID); err != nil {
		return Paths{}, err
	}
	d, err := cleanDir(dir)
	if err != nil {
		return Paths{}, err
	}
	base := d + "/" + Name(tenant, runID)
	if d == "/" {
		base = "/" + Name(tenant, runID)
	}
	return Paths{Dir: d, Journal: base + ExtJournal, Stderr: base + ExtStderr, PID: base + ExtPID,
		ShipPID: base + ExtShipPID, ShipHeaders: base + ExtShipHeaders, ShipBody: base + ExtShipBody, ShipOut: base + ExtShipOut}, nil
}

// DirFor returns the journal directory to use in ex's sandboxes: dir when set, else the
// provider's own (contract.JournalDirer), else DefaultDir.
func DirFor(ex contract.Executor, dir string) string {
	if dir != "" {
		return dir
	}
	if jd, ok := ex.(contract.JournalDirer); ok {
		if d := jd.JournalDir(); d != "" {
			return d
		}
	}
	return DefaultDir
}

// PathsIn returns the paths of ctx's tenant's run runID in ex's sandboxes (DirFor).
func PathsIn(ctx context.Context, ex contract.Executor, dir, runID string) (Paths, error) {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return Paths{}, err
	}
	return PathsFor(DirFor(ex, dir), tenant, runID)
}

// cleanDir defaults dir, strips trailing slashes and keeps a leading "-" from reading as a
// command option.
func cleanDir(dir string) (string, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if strings.ContainsRune(dir, 0) {
		return "", contract.Invalid("dir", "contains NUL")
	}
	if t := strings.TrimRight(dir, "/"); t != "" {
		dir = t
	} else {
		dir = "/"
	}
	if strings.HasPrefix(dir, "-") {
		dir = "./" + dir
	}
	return dir, nil
}
