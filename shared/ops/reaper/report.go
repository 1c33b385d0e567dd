package reaper

import "github.com/sandkeep/sandkeep/shared/ops/keeper"

// Outcome is what a sweep did with one candidate run (docs/design.md §5): the run's own
// fate. What became of the sandbox of a run it ended is the entry's Sandbox, apart, so a
// run finalized on a sandbox another run still uses reads finalized, sandbox kept.
type Outcome string

// The run outcomes of a sweep.
const (
	Finalized      Outcome = "finalized"       // finished while detached: transcript replayed, run ended from its exit code
	Expired        Outcome = "expired"         // past the TTL or cancelled: agent killed, run aborted (or ended by its sentinel)
	Producing      Outcome = "producing"       // no sentinel yet: left alone, nothing written
	Reshipped      Outcome = "reshipped"       // no sentinel, its shipper dead: claimed, a new shipper started
	Unknown        Outcome = "unknown"         // the probe could not answer: left alone, nothing written
	BudgetExceeded Outcome = "budget-exceeded" // a finished run's replay did not fit the run budget (resumed next sweep)
	NotClaimed     Outcome = "not-claimed"     // the claim was refused: a viewer returned, or someone else ended it
	Failed         Outcome = "failed"          // an error; the run is retried next sweep
)

// Outcomes counts the runs of a sweep per outcome; every key is always present in JSON.
type Outcomes struct {
	Finalized      int `json:"finalized"`
	Expired        int `json:"expired"`
	Producing      int `json:"producing"`
	Reshipped      int `json:"reshipped"`
	Unknown        int `json:"unknown"`
	BudgetExceeded int `json:"budget-exceeded"`
	NotClaimed     int `json:"not-claimed"`
	Failed         int `json:"failed"`
}

// add counts one outcome.
func (o *Outcomes) add(x Outcome) {
	switch x {
	case Finalized:
		o.Finalized++
	case Expired:
		o.Expired++
	case Producing:
		o.Producing++
	case Reshipped:
		o.Reshipped++
	case Unknown:
		o.Unknown++
	case BudgetExceeded:
		o.BudgetExceeded++
	case NotClaimed:
		o.NotClaimed++
	default:
		o.Failed++
	}
}

// Get returns the count of outcome x.
func (o Outcomes) Get(x Outcome) int {
	switch x {
	case Finalized:
		return o.Finalized
	case Expired:
		return o.Expired
	case Producing:
		return o.Producing
	case Reshipped:
		return o.Reshipped
	case Unknown:
		return o.Unknown
	case BudgetExceeded:
		return o.BudgetExceeded
	case NotClaimed:
		return o.NotClaimed
	}
	return o.Failed
}

// AllOutcomes lists every outcome, in report order.
var AllOutcomes = []Outcome{Finalized, Expired, Producing, Reshipped, Unknown, BudgetExceeded, NotClaimed, Failed}

// SandboxFate is what a sweep did with the sandbox of a run it ended (RunEntry.Sandbox).
type SandboxFate string

// The sandbox fates of a run a sweep ended.
const (
	SandboxReclaimed     SandboxFate = "reclaimed"      // destroyed and its row deleted (or both found gone by then)
	SandboxKept          SandboxFate = "kept"           // kept: another run uses it, or its row was touched too recently (Kept says which)
	SandboxReclaimFailed SandboxFate = "reclaim-failed" // destroying it failed: the tombstone stays, the next sweep retries (the leak alarm)
)

// Sandboxes counts the sandbox fates of the runs a sweep ended; every key always present.
type Sandboxes struct {
	Reclaimed     int `json:"reclaimed"`
	Kept          int `json:"kept"`
	ReclaimFailed int `json:"reclaim-failed"`
}

// add counts one fate ("" counts nothing: the run had no sandbox left to reclaim).
func (s *Sandboxes) add(f SandboxFate) {
	switch f {
	case SandboxReclaimed:
		s.Reclaimed++
	case SandboxKept:
		s.Kept++
	case SandboxReclaimFailed:
		s.ReclaimFailed++
	}
}

// The ReapOutcome metric names of kept and failed reclaims: the names the leak alarm
// (template.yaml, docs/deploy.md) and dashboards watch, kept when the fates moved out of
// the run outcomes.
const (
	metricInUse         = "in-use"
	metricReclaimFailed = "reclaim-failed"
)

// RunEntry is one candidate's line in the report.
type RunEntry struct {
	Tenant   string  `json:"tenant"`
	RunID    string  `json:"runId"`
	Outcome  Outcome `json:"outcome"`
	Status   string  `json:"status,omitempty"`   // the run's status after the sweep acted
	ExitCode *int    `json:"exitCode,omitempty"` // when the journal's sentinel was read
	Events   int     `json:"events,omitempty"`   // events this sweep appended
	Error    string  `json:"error,omitempty"`
	DryRun   bool    `json:"dryRun,omitempty"` // the outcome a real sweep would have had
	// Reclaim is a dry run's word on the run's sandbox after it ended: destroy-and-delete,
	// keep-in-use (a real sweep reports the sandbox kept) or none.
	Reclaim string `json:"reclaim,omitempty"`
	// Sandbox is what a real sweep did with the sandbox of a run it ended (absent when it
	// ended none, or the sandbox was gone already); a reclaim-failed one has Error.
	Sandbox SandboxFate `json:"sandbox,omitempty"`
	// Kept says why a kept sandbox was kept: KeptIdleStop (left for the thread's next run),
	// KeptInUse (KeptFor names the run using it) or KeptTouched (RetryAt is when a later
	// sweep retries the reclaim, epoch ms).
	Kept    string `json:"kept,omitempty"`
	KeptFor string `json:"keptFor,omitempty"`
	RetryAt int64  `json:"retryAt,omitempty"`
	// Resumed: the sweep started the run's stopped sandbox to read its journal.
	Resumed bool `json:"resumed,omitempty"`
}

// Why a reclaim kept a sandbox (RunEntry.Kept): the keeper's words (keeper.Reclaim).
const (
	KeptInUse   = keeper.KeptInUse   // a non-terminal run is stamped with its key
	KeptTouched = keeper.KeptTouched // its row was touched too recently to tombstone; retried
	// KeptIdleStop: the run ended and its sandbox stays for the thread's next run; the idle
	// stop stops it after the grace (docs/design.md §5).
	KeptIdleStop = "idle-stop"
)

// Swept counts the housekeeping of a sweep besides candidate runs.
type Swept struct {
	Lapsed                int `json:"lapsed"`                // runs whose lapsed driver lease was turned into a detach
	Stale                 int `json:"stale"`                 // index hits that no longer qualified on re-read
	PendingReclaims       int `json:"pendingReclaims"`       // tombstoned rows finished (destroyed and deleted)
	PendingReclaimsFailed int `json:"pendingReclaimsFailed"` // tombstoned rows whose destroy failed again
	IdleReclaimed         int `json:"idleReclaimed"`         // instance rows past retention reclaimed
	IdleInUse             int `json:"idleInUse"`             // idle rows kept: a non-terminal run uses them
	IdleFailed            int `json:"idleFailed"`            // idle rows whose reclaim failed
	DeferredReclaimed     int `json:"deferredReclaimed"`     // deferred reclaims retried and done
	DeferredKept          int `json:"deferredKept"`          // deferred reclaims retried: in use (dropped) or touched again (deferred again)
	DeferredWaiting       int `json:"deferredWaiting"`       // deferred reclaims not due yet
	SnapshotsDeleted      int `json:"snapshotsDeleted"`      // superseded (or reclaimed rows') snapshots deleted
	SnapshotsFailed       int `json:"snapshotsFailed"`       // snapshot deletes that failed (retried next sweep)
	IntentsDropped        int `json:"intentsDropped"`        // stale intents whose sandbox a row names
	OrphansDestroyed      int `json:"orphansDestroyed"`      // stale intents' unrecorded sandboxes destroyed
	IntentsFailed         int `json:"intentsFailed"`         // stale intents left for the next sweep
	JournalSandboxes      int `json:"journalSandboxes"`      // sandboxes whose journal directory was swept
	JournalsDeleted       int `json:"journalsDeleted"`       // journals deleted (terminal runs, old orphans)
	JournalsKept          int `json:"journalsKept"`          // journals kept (live runs, young orphans, undecodable)
}

// Lifecycle counts what a sweep did to sandboxes' running time (docs/design.md §5): the
// idle stops, the sandboxes it started itself, and every destroy.
type Lifecycle struct {
	Stopped   int `json:"stopped"`   // idle sandboxes stopped (files kept; the next start resumes them)
	Resumed   int `json:"resumed"`   // stopped sandboxes this sweep started itself (to read an ended run's journal)
	Destroyed int `json:"destroyed"` // sandboxes destroyed: one-run sandboxes, reclaims, orphans
	Gone      int `json:"gone"`      // idle sandboxes the provider no longer had (the next start recreates)
	Archived  int `json:"archived"`  // idle sandboxes the provider had archived itself (no stop asked; the next start resumes them)
	// IdleRunning (the IdleRunningSandboxes metric): of the rows this sweep listed past the
	// grace (at most IdleStopLimit), those it found with no live run and their sandbox
	// running — stopped, destroyed (one-run), failed or unsupported; not gone, archived,
	// in use, not due or busy. Not every sandbox running with no live run at the sweep's
	// time: those within their grace or past the listing limit are not counted
	// (docs/design.md §5). After the sweep only the failed and unsupported ones still run.
	IdleRunning int `json:"idleRunning"`
	InUse       int `json:"inUse"`       // listed, but a run that has not ended uses the key (deferred)
	NotDue      int `json:"notDue"`      // listed, but the latest run ended within the grace (deferred)
	Unsupported int `json:"unsupported"` // the provider cannot stop sandboxes
	Busy        int `json:"busy"`        // the sandbox lock was held (a start); the next sweep retries
	Failed      int `json:"failed"`      // stops that failed (the sandbox runs on; retried after a grace)

	destroyedOneRun int // one-run sandboxes destroyed by the idle stop (summed into Destroyed)
}

// countDestroys sums every destroy of the sweep into Lifecycle.Destroyed.
func (r *Report) countDestroys() {
	s := r.Swept
	r.Lifecycle.Destroyed = r.Lifecycle.destroyedOneRun + r.Sandboxes.Reclaimed + s.PendingReclaims +
		s.IdleReclaimed + s.DeferredReclaimed + s.OrphansDestroyed
}

// Report is a sweep's one-line JSON report (docs/design.md §5).
type Report struct {
	Considered int        `json:"considered"`
	Probed     int        `json:"probed"`
	Outcomes   Outcomes   `json:"outcomes"`
	Sandboxes  Sandboxes  `json:"sandboxes"` // the sandboxes of the runs this sweep ended
	Runs       []RunEntry `json:"runs"`
	Swept      Swept      `json:"swept"`
	Lifecycle  Lifecycle  `json:"lifecycle"`
	// Planned is a dry run's housekeeping: what a sweep would do now (absent otherwise).
	Planned []Planned `json:"planned,omitempty"`
}

// add reports one run's line: considered, counted by its outcome and its sandbox's fate.
func (r *Report) add(e RunEntry) {
	r.Considered++
	r.Outcomes.add(e.Outcome)
	r.Sandboxes.add(e.Sandbox)
	if e.Resumed {
		r.Lifecycle.Resumed++
	}
	r.Runs = append(r.Runs, e)
}

// OutcomeCounts returns the ReapOutcome metrics of the report, every name present: the runs
// per outcome, and under "in-use" and "reclaim-failed" the ended runs' sandboxes kept and
// failed to destroy (the Lambda handler and Sweep emit them).
func (r Report) OutcomeCounts() map[string]int {
	m := make(map[string]int, len(AllOutcomes)+2)
	for _, o := range AllOutcomes {
		m[string(o)] = r.Outcomes.Get(o)
	}
	// A sandbox left to the idle stop is no leak: in-use counts the ones a reclaim kept.
	inUse := 0
	for _, e := range r.Runs {
		if e.Sandbox == SandboxKept && e.Kept != KeptIdleStop {
			inUse++
		}
	}
	m[metricInUse], m[metricReclaimFailed] = inUse, r.Sandboxes.ReclaimFailed
	return m
}

// metricNames lists the names of OutcomeCounts in report order.
func metricNames() []string {
	names := make([]string, 0, len(AllOutcomes)+2)
	for _, o := range AllOutcomes {
		names = append(names, string(o))
	}
	return append(names, metricInUse, metricReclaimFailed)
}
