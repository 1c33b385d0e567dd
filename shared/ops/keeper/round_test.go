package keeper

import (
	"fmt"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Times of the decision tables: the round reads at now; rows idle before idleBefore may be
// reclaimed; maxAge is the setup's max age where a case sets one.
const (
	tNow        = 10_000_000
	tIdleBefore = tNow - 65_000
	tMaxAge     = 1_000_000
)

// tRow is a row naming psid, touched at updatedAt, with a snapshot.
func tRow(psid string, updatedAt int64) *contract.InstanceRow {
	return &contract.InstanceRow{
		InstanceRecord: contract.InstanceRecord{Key: "k", ProviderSandboxID: psid, UpdatedAt: updatedAt, LatestSnapshotID: "snap"},
		Incarnation:    "inc",
	}
}

func tIntent(psid string) *contract.Intent {
	return &contract.Intent{Key: "k", Token: 7, ProviderSandboxID: psid}
}

// view returns a round's view with the table's times; opts change it.
func view(opts ...func(*roundView)) *roundView {
	v := &roundView{now: tNow, idleBefore: tIdleBefore}
	for _, o := range opts {
		o(v)
	}
	return v
}

// TestDecideRound: each case is a branch of the locked round (docs/design.md §4.1 step 3)
// and the one step it leads to.
func TestDecideRound(t *testing.T) {
	young := int64(tNow - 1_000)         // touched a second ago
	oldIdle := int64(tNow - tMaxAge - 1) // past max age and idle (before idleBefore)
	withRow := func(r *contract.InstanceRow) func(*roundView) { return func(v *roundView) { v.row = r } }
	withIntent := func(in *contract.Intent) func(*roundView) { return func(v *roundView) { v.intent = in } }
	maxAge := func(v *roundView) { v.maxAgeMs = tMaxAge }
	restorer := func(v *roundView) { v.canRestore = true }
	lookuper := func(v *roundView) { v.canLookup = true }
	looked := func(id string) func(*roundView) { return func(v *roundView) { v.looked, v.lookedUp = true, id } }
	rowAlive := func(a answer) func(*roundView) { return func(v *roundView) { v.rowAlive = a } }
	intentAlive := func(a answer) func(*roundView) { return func(v *roundView) { v.intentAlive = a } }
	inUse := func(a answer) func(*roundView) { return func(v *roundView) { v.inUse = a } }
	orphanDone := func(v *roundView) { v.orphanDone = true }
	keepIntent := func(v *roundView) { v.keepIntent = true }
	reclaimed := func(v *roundView) { v.reclaimed = true }
	made := func(id string, o Outcome) func(*roundView) {
		return func(v *roundView) { v.made, v.madeOutcome = id, o }
	}
	tomb := tRow("sb-old", young)
	tomb.Reclaiming = "tok-r"
	// A row past max age but touched within lease + margin (after idleBefore): with a max
	// age smaller than that window it is too old and still not idle.
	recentOld := func(v *roundView) { v.maxAgeMs = 10_000; v.row = tRow("sb-row", tNow-20_000) }
	edgeAge := tRow("sb-row", tNow-tMaxAge)       // exactly max age: not strictly older
	edgeIdle := tRow("sb-row", tIdleBefore)       // touched exactly at idleBefore: idle
	edgeIdleMiss := tRow("sb-row", tIdleBefore+1) // a millisecond later: not idle

	cases := []struct {
		name string
		v    *roundView
		want roundStep
	}{
		// A pending reclaim is finished first, whatever else was read.
		{"tombstone: finish the reclaim", view(withRow(tomb)),
			roundStep{kind: stepFinishReclaim, psid: "sb-old", token: "tok-r"}},
		{"tombstone before an intent", view(withRow(tomb), withIntent(tIntent("sb-in"))),
			roundStep{kind: stepFinishReclaim, psid: "sb-old", token: "tok-r"}},
		{"tombstone before max age", view(maxAge, withRow(func() *contract.InstanceRow { r := tRow("sb-old", oldIdle); r.Reclaiming = "t2"; return r }())),
			roundStep{kind: stepFinishReclaim, psid: "sb-old", token: "t2"}},

		// Nothing read: create.
		{"no row, no intent: create", view(), roundStep{kind: stepCreate}},
		{"no row, restorer: create (no snapshot to restore)", view(restorer), roundStep{kind: stepCreate}},

		// The row's sandbox: probe, then resume, restore or create.
		{"row: probe its sandbox", view(withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"row alive: resume (touch)", view(withRow(tRow("sb-row", young)), rowAlive(yes)),
			roundStep{kind: stepResumeRow, psid: "sb-row"}},
		{"row gone, restorer: restore its snapshot", view(restorer, withRow(tRow("sb-row", young)), rowAlive(no)),
			roundStep{kind: stepCreate, snapshot: "snap"}},
		{"row gone, no restorer: create", view(withRow(tRow("sb-row", young)), rowAlive(no)),
			roundStep{kind: stepCreate}},
		{"row gone without a snapshot, restorer: create", view(restorer, withRow(func() *contract.InstanceRow { r := tRow("sb-row", young); r.LatestSnapshotID = ""; return r }()), rowAlive(no)),
			roundStep{kind: stepCreate}},

		// An intent with no recorded sandbox: the provider's Lookup, when it has one.
		{"unrecorded intent, lookuper: look up the key", view(lookuper, withIntent(tIntent("")), withRow(tRow("sb-row", young))),
			roundStep{kind: stepLookupIntent}},
		{"unrecorded intent, no lookuper: as if none", view(withIntent(tIntent("")), withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"unrecorded intent, no lookuper, no row: create", view(withIntent(tIntent(""))), roundStep{kind: stepCreate}},
		{"lookup found nothing: the row decides", view(lookuper, looked(""), withIntent(tIntent("")), withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"lookup found the row's sandbox: the row decides", view(lookuper, looked("sb-row"), withIntent(tIntent("")), withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"lookup found another: probe the row first", view(lookuper, looked("sb-in"), withIntent(tIntent("")), withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"lookup found one, no row: probe it", view(lookuper, looked("sb-in"), withIntent(tIntent(""))),
			roundStep{kind: stepProbeIntent, psid: "sb-in"}},
		{"recorded id wins over lookup", view(lookuper, withIntent(tIntent("sb-in"))),
			roundStep{kind: stepProbeIntent, psid: "sb-in"}},

		// A recorded intent.
		{"intent names the row's sandbox: the row decides", view(withIntent(tIntent("sb-row")), withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"intent names the row's sandbox, alive: resume", view(withIntent(tIntent("sb-row")), withRow(tRow("sb-row", young)), rowAlive(yes)),
			roundStep{kind: stepResumeRow, psid: "sb-row"}},
		{"intent, no row: probe the intent's sandbox", view(withIntent(tIntent("sb-in"))),
			roundStep{kind: stepProbeIntent, psid: "sb-in"}},
		{"intent alive, no row: adopt (resumed)", view(withIntent(tIntent("sb-in")), intentAlive(yes)),
			roundStep{kind: stepAdoptIntent, psid: "sb-in", outcome: OutcomeResumed}},
		{"intent alive, my own from a lost lease: adopt with its outcome", view(withIntent(tIntent("sb-in")), intentAlive(yes), made("sb-in", OutcomeRestored)),
			roundStep{kind: stepAdoptIntent, psid: "sb-in", outcome: OutcomeRestored}},
		{"intent alive, another made: adopt (resumed)", view(withIntent(tIntent("sb-in")), intentAlive(yes), made("sb-x", OutcomeCreated)),
			roundStep{kind: stepAdoptIntent, psid: "sb-in", outcome: OutcomeResumed}},
		{"intent gone, no row: create", view(restorer, withIntent(tIntent("sb-in")), intentAlive(no)),
			roundStep{kind: stepCreate}},
		{"intent and another row: probe the row first", view(withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"row alive, intent names another: destroy the orphan", view(withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young)), rowAlive(yes)),
			roundStep{kind: stepDestroyOrphan, psid: "sb-in"}},
		{"orphan destroyed: resume the row", view(withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young)), rowAlive(yes), orphanDone),
			roundStep{kind: stepResumeRow, psid: "sb-row"}},
		{"orphan's destroy failed: resume the row all the same", view(withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young)), rowAlive(yes), orphanDone, keepIntent),
			roundStep{kind: stepResumeRow, psid: "sb-row"}},
		{"row gone, intent names another: probe the intent", view(withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young)), rowAlive(no)),
			roundStep{kind: stepProbeIntent, psid: "sb-in"}},
		{"row gone, intent alive: adopt it", view(withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young)), rowAlive(no), intentAlive(yes)),
			roundStep{kind: stepAdoptIntent, psid: "sb-in", outcome: OutcomeResumed}},
		{"row gone, intent gone, restorer: restore the row's snapshot", view(restorer, withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young)), rowAlive(no), intentAlive(no)),
			roundStep{kind: stepCreate, snapshot: "snap"}},
		{"row gone, intent gone: create", view(withIntent(tIntent("sb-in")), withRow(tRow("sb-row", young)), rowAlive(no), intentAlive(no)),
			roundStep{kind: stepCreate}},
		{"tombstone finished (row nil), intent: probe the intent", view(withIntent(tIntent("sb-in"))),
			roundStep{kind: stepProbeIntent, psid: "sb-in"}},

		// Max age.
		{"no max age: never reclaimed", view(withRow(tRow("sb-row", oldIdle))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"young row under a max age: probe", view(maxAge, withRow(tRow("sb-row", young))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"exactly max age: not too old", view(maxAge, withRow(edgeAge)),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"too old but touched within lease+margin: probe", view(recentOld),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"too old, touched a ms after idleBefore: probe", view(func(v *roundView) { v.maxAgeMs = 1 }, withRow(edgeIdleMiss)),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"too old, touched at idleBefore: in-use check", view(func(v *roundView) { v.maxAgeMs = 1 }, withRow(edgeIdle)),
			roundStep{kind: stepCheckInUse}},
		{"too old and idle: in-use check", view(maxAge, withRow(tRow("sb-row", oldIdle))),
			roundStep{kind: stepCheckInUse}},
		{"too old, in use: probe (resume anyway)", view(maxAge, withRow(tRow("sb-row", oldIdle)), inUse(yes)),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"too old, in use, alive: resume", view(maxAge, withRow(tRow("sb-row", oldIdle)), inUse(yes), rowAlive(yes)),
			roundStep{kind: stepResumeRow, psid: "sb-row"}},
		{"too old, in use, gone: restore", view(maxAge, restorer, withRow(tRow("sb-row", oldIdle)), inUse(yes), rowAlive(no)),
			roundStep{kind: stepCreate, snapshot: "snap"}},
		{"too old, unused: reclaim", view(maxAge, withRow(tRow("sb-row", oldIdle)), inUse(no)),
			roundStep{kind: stepReclaimExpired, psid: "sb-row"}},
		{"reclaimed: create afresh (no restore)", view(maxAge, restorer, reclaimed, withIntent(tIntent("sb-in"))),
			roundStep{kind: stepCreate}},
		{"too old, intent another, row unprobed: probe the row before the age", view(maxAge, withIntent(tIntent("sb-in")), withRow(tRow("sb-row", oldIdle))),
			roundStep{kind: stepProbeRow, psid: "sb-row"}},
		{"too old, orphan destroyed: in-use check", view(maxAge, withIntent(tIntent("sb-in")), withRow(tRow("sb-row", oldIdle)), rowAlive(yes), orphanDone),
			roundStep{kind: stepCheckInUse}},
		{"too old, orphan destroyed, unused: reclaim", view(maxAge, withIntent(tIntent("sb-in")), withRow(tRow("sb-row", oldIdle)), rowAlive(yes), orphanDone, inUse(no)),
			roundStep{kind: stepReclaimExpired, psid: "sb-row"}},
		{"too old, in use, row probed alive with the orphan: resume", view(maxAge, withIntent(tIntent("sb-in")), withRow(tRow("sb-row", oldIdle)), rowAlive(yes), orphanDone, inUse(yes)),
			roundStep{kind: stepResumeRow, psid: "sb-row"}},
		{"too old, row gone, intent alive: adopt before the age", view(maxAge, withIntent(tIntent("sb-in")), withRow(tRow("sb-row", oldIdle)), rowAlive(no), intentAlive(yes)),
			roundStep{kind: stepAdoptIntent, psid: "sb-in", outcome: OutcomeResumed}},
		{"too old, row and intent gone: in-use check", view(maxAge, withIntent(tIntent("sb-in")), withRow(tRow("sb-row", oldIdle)), rowAlive(no), intentAlive(no)),
			roundStep{kind: stepCheckInUse}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := decideRound(c.v); got != c.want {
				t.Fatalf("decideRound = %v, want %v", got, c.want)
			}
		})
	}
}

// world is what the provider and the runs answer in one round: the key's Lookup, whether
// each sandbox lives, whether another run uses the key, whether a destroy succeeds.
type world struct {
	lookup          string
	aliveA, aliveB  bool
	inUse, destroys bool
	dead            map[string]bool // destroyed by the round's steps
}

func (w world) alive(id string) answer {
	if !w.dead[id] && (id == "sb-a" && w.aliveA || id == "sb-b" && w.aliveB) {
		return yes
	}
	return no
}

// apply is execute's bookkeeping of a non-final step (roundexec.go) against world w.
func (w world) apply(v *roundView, st roundStep) {
	switch st.kind {
	case stepFinishReclaim:
		w.dead[st.psid] = true
		v.row = nil
	case stepLookupIntent:
		v.looked, v.lookedUp = true, w.lookup
	case stepProbeRow:
		v.rowAlive = w.alive(st.psid)
	case stepProbeIntent:
		v.intentAlive = w.alive(st.psid)
	case stepDestroyOrphan:
		w.dead[st.psid] = w.destroys
		v.orphanDone, v.keepIntent = true, !w.destroys
	case stepCheckInUse:
		v.inUse = map[bool]answer{true: yes, false: no}[w.inUse]
	case stepReclaimExpired:
		w.dead[st.psid] = true
		v.row, v.reclaimed = nil, true
	}
}

// TestDecideRoundSettles runs decideRound over every view a round can read (row: none,
// tombstone, young, past max age and idle, past max age and recent; each intent shape;
// provider capabilities; a sandbox of the start's own) against every world, and checks
// that the round settles in a final step, runs no step twice, and never acts against
// what it learned: no resume or adoption of a gone sandbox, no create beside a live row
// it did not reclaim, no reclaim of a row in use, no orphan destroyed unless the row's
// own sandbox lives.
func TestDecideRoundSettles(t *testing.T) {
	rows := map[string]func() *contract.InstanceRow{
		"none":      func() *contract.InstanceRow { return nil },
		"tombstone": func() *contract.InstanceRow { r := tRow("sb-a", tNow-1_000); r.Reclaiming = "tok"; return r },
		"young":     func() *contract.InstanceRow { return tRow("sb-a", tNow-1_000) },
		"oldIdle":   func() *contract.InstanceRow { return tRow("sb-a", tNow-tMaxAge-1) },
		"oldRecent": func() *contract.InstanceRow { return tRow("sb-a", tIdleBefore+1) },
	}
	intents := map[string]*contract.Intent{"none": nil, "unrecorded": tIntent(""), "row's": tIntent("sb-a"), "other": tIntent("sb-b")}
	bools := []bool{false, true}
	n := 0
	for rn, mkRow := range rows {
		for in, intent := range intents {
			for _, maxAge := range []int64{0, 100, tMaxAge} {
				for _, lk := range bools {
					for _, rs := range bools {
						for _, mine := range bools {
							for _, lookup := range []string{"", "sb-a", "sb-b"} {
								for _, aA := range bools {
									for _, aB := range bools {
										for _, use := range bools {
											for _, des := range bools {
												v := view(func(v *roundView) {
													v.row, v.intent, v.maxAgeMs, v.canLookup, v.canRestore = mkRow(), intent, maxAge, lk, rs
													if mine {
														v.made, v.madeOutcome = "sb-b", OutcomeCreated
													}
												})
												w := world{lookup: lookup, aliveA: aA, aliveB: aB, inUse: use, destroys: des, dead: map[string]bool{}}
												name := fmt.Sprintf("row=%s intent=%s maxAge=%d lookuper=%v restorer=%v mine=%v %+v", rn, in, maxAge, lk, rs, mine, w)
												checkRound(t, name, v, w)
												n++
											}
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d rounds checked", n)
}

// intentID is the sandbox v's intent stands for as far as the round learned: its recorded
// id, else what the provider's Lookup found.
func intentID(v *roundView) string {
	switch {
	case v.intent == nil:
		return ""
	case v.intent.ProviderSandboxID != "":
		return v.intent.ProviderSandboxID
	}
	return v.lookedUp
}

// checkRound runs one round of decisions against w and checks the path it takes.
func checkRound(t *testing.T, name string, v *roundView, w world) {
	t.Helper()
	read := *v // the view as read, before any step
	ran := map[stepKind]bool{}
	for range maxRoundSteps {
		st := decideRound(v)
		if ran[st.kind] {
			t.Fatalf("%s: step %v twice", name, st.kind)
		}
		ran[st.kind] = true
		if read.row != nil && read.row.Reclaiming != "" && len(ran) == 1 && st.kind != stepFinishReclaim {
			t.Fatalf("%s: a tombstone's first step is %v", name, st.kind)
		}
		switch st.kind {
		case stepNone:
			t.Fatalf("%s: no step", name)
		case stepAdoptIntent:
			rowLive := v.row != nil && w.alive(v.row.ProviderSandboxID) == yes
			if v.intentAlive != yes || w.alive(st.psid) != yes || st.psid != intentID(v) || rowLive {
				t.Fatalf("%s: adopts %s (intent %v, row %v)", name, st.psid, v.intentAlive, v.rowAlive)
			}
			if want := map[bool]Outcome{true: OutcomeCreated, false: OutcomeResumed}[st.psid == v.made]; st.outcome != want {
				t.Fatalf("%s: adopt outcome %v, want %v", name, st.outcome, want)
			}
		case stepResumeRow:
			if v.row == nil || st.psid != v.row.ProviderSandboxID || v.rowAlive != yes || w.alive(st.psid) != yes {
				t.Fatalf("%s: resumes %s", name, st.psid)
			}
		case stepCreate:
			rowLive := v.row != nil && w.alive(v.row.ProviderSandboxID) == yes
			// A live intent's sandbox is adopted, or destroyed as the orphan of a live row.
			orphan := intentID(v) != "" && w.alive(intentID(v)) == yes && !v.orphanDone
			if rowLive || orphan {
				t.Fatalf("%s: creates beside a live sandbox", name)
			}
			switch {
			case st.snapshot != "" && (!v.canRestore || v.row == nil || st.snapshot != v.row.LatestSnapshotID):
				t.Fatalf("%s: restores %q", name, st.snapshot)
			case st.snapshot == "" && v.canRestore && v.row != nil && v.row.LatestSnapshotID != "":
				t.Fatalf("%s: creates though the row's snapshot could be restored", name)
			}
		case stepReclaimExpired:
			if v.inUse != no || !v.expired() {
				t.Fatalf("%s: reclaims (in use %v)", name, v.inUse)
			}
		case stepDestroyOrphan:
			if v.row == nil || v.rowAlive != yes || st.psid == v.row.ProviderSandboxID {
				t.Fatalf("%s: destroys %s as an orphan", name, st.psid)
			}
		}
		if st.kind.final() {
			return
		}
		w.apply(v, st)
	}
	t.Fatalf("%s: no final step in %d steps", name, maxRoundSteps)
}

// String names a step in failures.
func (s roundStep) String() string {
	return fmt.Sprintf("%v{psid:%q token:%q snapshot:%q outcome:%q}", s.kind, s.psid, s.token, s.snapshot, s.outcome)
}

// TestClassifyRefused: a refused row write is a win when the row re-read carries my
// incarnation (my write landed) or names my sandbox outside a reclaim; else it is lost.
func TestClassifyRefused(t *testing.T) {
	row := func(psid, inc, reclaiming string) *contract.InstanceRow {
		r := tRow(psid, tNow)
		r.Incarnation, r.Reclaiming = inc, reclaiming
		return r
	}
	cases := []struct {
		name string
		cur  *contract.InstanceRow
		want refusal
	}{
		{"no row", nil, refusedLost},
		{"my incarnation", row("sb-mine", "inc-mine", ""), refusedLanded},
		{"my incarnation, reclaiming since", row("sb-mine", "inc-mine", "tok"), refusedLanded},
		{"names my sandbox", row("sb-mine", "inc-other", ""), refusedForMe},
		{"names my sandbox as a tombstone", row("sb-mine", "inc-other", "tok"), refusedLost},
		{"another sandbox", row("sb-other", "inc-other", ""), refusedLost},
	}
	for _, c := range cases {
		if got := classifyRefused(c.cur, "inc-mine", "sb-mine"); got != c.want {
			t.Errorf("%s: classifyRefused = %d, want %d", c.name, got, c.want)
		}
	}
}
