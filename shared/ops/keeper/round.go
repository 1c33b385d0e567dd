package keeper

import "github.com/sandkeep/sandkeep/shared/contract"

// One round of the locked path (docs/design.md §4.1 step 3) is read → decide → execute:
// decideRound is a plain function of what the round has read and learned (roundView) that
// names one step; an executor (roundexec.go) runs it and records what it learned, until a
// final step writes the row. Probes — a provider's Lookup or Resume, the in-use check — are
// reads too: decideRound asks for one when the decision needs a fact the round lacks.

// answer is what a probe of the round said; unknown until it ran.
type answer uint8

const (
	unknown answer = iota
	yes
	no
)

// roundView is what one round under the sandbox lock knows: the row and the key's open
// intent as read, the start's setting, and what the steps run so far found out.
type roundView struct {
	row    *contract.InstanceRow // nil: no row, or the row was reclaimed this round
	intent *contract.Intent      // the key's open intent; nil: none

	now        int64 // ms, taken after the lock wait
	maxAgeMs   int64 // the setup's max age; 0: rows never age out
	idleBefore int64 // a row touched after this may serve a run the lagging index hides
	canLookup  bool  // the provider finds a sandbox by key (contract.Lookuper)
	canRestore bool  // the provider restores snapshots (contract.Restorer)
	// made and madeOutcome: the sandbox this start made before it lost a lease, and how.
	made        string
	madeOutcome Outcome

	looked      bool   // the provider's Lookup of the key ran (for an intent with no id)
	lookedUp    string // what it found ("" none)
	rowAlive    answer // Resume of the row's sandbox
	intentAlive answer // Resume of the intent's sandbox
	inUse       answer // another non-terminal run uses the key
	orphanDone  bool   // the destroy of the intent's orphan ran
	keepIntent  bool   // that destroy failed: the intent stays, so the orphan stays findable
	reclaimed   bool   // the row was reclaimed past max age: create afresh
}

// stepKind names what a round does next.
type stepKind uint8

const (
	stepNone stepKind = iota
	// Steps that learn or clean up, then decide again.
	stepFinishReclaim  // the row is a reclaim's tombstone: destroy its sandbox, delete the row
	stepLookupIntent   // the intent recorded no sandbox: ask the provider's Lookup of the key
	stepProbeRow       // Resume the row's sandbox: alive or gone
	stepProbeIntent    // Resume the intent's sandbox: alive or gone
	stepDestroyOrphan  // the row's sandbox lives, so the intent's sandbox is an orphan
	stepCheckInUse     // the row is past max age and idle: does another run use the key?
	stepReclaimExpired // past max age, idle, unused: mark reclaiming, destroy, delete the row
	// Final steps: each writes the row and ends the round.
	stepAdoptIntent // the intent's sandbox lives: the row names it
	stepResumeRow   // the row's sandbox lives: Touch the row
	stepCreate      // restore (from snapshot) or create, announced by an intent first
)

var stepNames = [...]string{"none", "finish-reclaim", "lookup-intent", "probe-row", "probe-intent",
	"destroy-orphan", "check-in-use", "reclaim-expired", "adopt-intent", "resume-row", "create"}

func (s stepKind) String() string { return stepNames[s] }

// final reports whether the step ends the round.
func (s stepKind) final() bool { return s >= stepAdoptIntent }

// roundStep is one step with what its executor needs beyond the view.
type roundStep struct {
	kind     stepKind
	psid     string  // the sandbox the step acts on
	token    string  // stepFinishReclaim: the tombstone's reclaim token
	snapshot string  // stepCreate: the snapshot to restore ("" creates)
	outcome  Outcome // stepAdoptIntent: what the start reports
}

// decideRound names the round's next step. In order: a pending reclaim is finished; an
// open intent's sandbox is adopted before anything is created — unless the row names
// another live sandbox (the row won after the intent was opened: the intent's sandbox is
// the orphan); a row past max age, idle and unused is reclaimed; the row's sandbox is
// resumed; else restore from the row's snapshot (when the provider can) or create.
func decideRound(v *roundView) roundStep {
	if v.reclaimed {
		return roundStep{kind: stepCreate} // an expired row is neither resumed nor restored
	}
	row := v.row
	if row != nil && row.Reclaiming != "" {
		return roundStep{kind: stepFinishReclaim, psid: row.ProviderSandboxID, token: row.Reclaiming}
	}
	if st := decideIntent(v); st.kind != stepNone {
		return st
	}
	if row == nil {
		return roundStep{kind: stepCreate}
	}
	if v.expired() {
		switch v.inUse {
		case unknown:
			return roundStep{kind: stepCheckInUse}
		case no:
			return roundStep{kind: stepReclaimExpired, psid: row.ProviderSandboxID}
		}
	}
	switch v.rowAlive {
	case unknown:
		return roundStep{kind: stepProbeRow, psid: row.ProviderSandboxID}
	case yes:
		return roundStep{kind: stepResumeRow, psid: row.ProviderSandboxID}
	}
	st := roundStep{kind: stepCreate}
	if v.canRestore {
		st.snapshot = row.LatestSnapshotID
	}
	return st
}

// decideIntent is the open intent's part of decideRound: stepNone when the intent needs
// nothing (none, no sandbox known, the row's own sandbox, or settled by the steps run).
func decideIntent(v *roundView) roundStep {
	if v.intent == nil {
		return roundStep{}
	}
	id := v.intent.ProviderSandboxID
	if id == "" && v.canLookup {
		if !v.looked {
			return roundStep{kind: stepLookupIntent}
		}
		id = v.lookedUp
	}
	row := v.row
	if id == "" || row != nil && row.ProviderSandboxID == id {
		return roundStep{}
	}
	if row != nil {
		switch v.rowAlive {
		case unknown:
			return roundStep{kind: stepProbeRow, psid: row.ProviderSandboxID}
		case yes:
			if !v.orphanDone {
				return roundStep{kind: stepDestroyOrphan, psid: id}
			}
			return roundStep{}
		}
	}
	switch v.intentAlive {
	case unknown:
		return roundStep{kind: stepProbeIntent, psid: id}
	case yes:
		out := OutcomeResumed
		if id == v.made {
			out = v.madeOutcome // our own sandbox, from before a lost lease
		}
		return roundStep{kind: stepAdoptIntent, psid: id, outcome: out}
	}
	return roundStep{}
}

// expired reports whether the row is past the setup's max age (strictly older) and idle
// past the driver lease and margin, so a reclaim may be tried (docs/design.md §2.1
// mark-reclaiming): a row touched since may serve a run the lagging index does not show.
func (v *roundView) expired() bool {
	r := v.row
	return v.maxAgeMs > 0 && v.now-r.UpdatedAt > v.maxAgeMs && r.UpdatedAt <= v.idleBefore
}
