// Package contract holds sandkeep's contracts: the records, the store interfaces every
// backend implements, the provider interface, the sandbox key and the sentinel errors.
//
// Every method documents its invariant in one line; shared/testkit turns each of those
// lines into a conformance case that every backend must pass.
package contract

import (
	"errors"
	"fmt"
)

// Sentinel errors; test with errors.Is. Infrastructure errors are wrapped with %w and are
// never one of these.
var (
	// ErrUnknownRun: the run does not exist in the caller's tenant.
	ErrUnknownRun = errors.New("unknown run")
	// ErrTerminalRun: the run is completed, failed or aborted; it never changes again.
	ErrTerminalRun = errors.New("run is terminal")
	// ErrSuperseded: a higher driver epoch owns the run or its log.
	ErrSuperseded = errors.New("superseded by a newer driver epoch")
	// ErrLogClosed: the run's event log has a close item; nothing more is appended.
	ErrLogClosed = errors.New("event log closed")
	// ErrLeaseLost: a lock lease could no longer be guaranteed (cause of fn's ctx).
	ErrLeaseLost = errors.New("lock lease lost")
	// ErrSandboxGone: the provider confirmed the sandbox no longer exists.
	ErrSandboxGone = errors.New("sandbox gone")
	// ErrConflict: a condition of a conditional write did not hold (another writer won).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the input is malformed; the wrapping message names the field.
	ErrInvalid = errors.New("invalid input")
	// ErrAppDriven: the run is app-driven (created through the reference run store, whose
	// caller drives it): sandkeep's own claims (start, attach, the reaper) never take it.
	ErrAppDriven = errors.New("run is app-driven")
	// ErrSandkeepDriven: the run is driven by sandkeep (started by its start operation): the
	// reference run store's writes never touch it.
	ErrSandkeepDriven = errors.New("run is driven by sandkeep")
	// ErrNoTenant: the context carries no tenant (WithTenant was never called): a
	// programming error of the caller, never a client's input; "" must be chosen explicitly.
	ErrNoTenant = errors.New("no tenant in context (sandbox.WithTenant)")
)

// Invalid returns an error wrapping ErrInvalid that names the offending field.
func Invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...))
}

// Ended is ErrTerminalRun for rec, a terminal run, saying how it ended: its status and,
// when it has one, its error code ("run is terminal: aborted (expired)"), so a driver the
// reaper or another host ended learns why rather than meeting a gone sandbox.
func Ended(rec RunRecord) error {
	how := string(rec.Status)
	if rec.Error != nil && rec.Error.Code != "" {
		how += " (" + rec.Error.Code + ")"
	}
	return fmt.Errorf("%w: %s", ErrTerminalRun, how)
}

// Sentinels returns every sentinel error above, the one list of them: each is an answer
// (of a store, a provider, a lease), never an infrastructure failure. The retry policy
// (shared/store/storecall), the keeper's provider-error count and the conformance suite's
// "refusals are distinguishable" check all read it.
func Sentinels() []error {
	return []error{ErrUnknownRun, ErrTerminalRun, ErrSuperseded, ErrLogClosed, ErrLeaseLost,
		ErrSandboxGone, ErrConflict, ErrInvalid, ErrAppDriven, ErrSandkeepDriven, ErrNoTenant}
}

// IsSentinel reports whether err is, or wraps, one of Sentinels.
func IsSentinel(err error) bool {
	for _, s := range Sentinels() {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
