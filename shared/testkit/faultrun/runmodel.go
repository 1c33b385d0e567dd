package faultrun

import (
	"fmt"

	"github.com/anishathalye/porcupine"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// MaxBurn bounds how many epochs one Claim call may burn: a claim whose response was lost
// and that the SDK retried applies once per attempt (docs/design.md §3.1: a repeated claim
// may skip an epoch, which is harmless). It is the most attempts one store call makes.
const MaxBurn = 4

// Run-register operations (docs/design.md §2.2 fenced primitives).
const (
	runCreate    = "create-claimed"
	runClaim     = "claim"
	runUpdate    = "update-fenced"
	runRecord    = "record-sandbox"
	runHeartbeat = "heartbeat"
	runDetach    = "detach"
	runLapse     = "lapse"
	runCancel    = "request-cancel"
	runState     = "state"
	runGet       = "get"
	runPlain     = "update" // the reference Update: unconditional patch of an existing run
)

// runPatch is the part of a RunPatch the register models.
type runPatch struct {
	Status            contract.RunStatus // "" = left alone
	SetDetached       bool
	Detached          int64
	ClearDetached     bool
	SetCancel, Cancel bool
	ClearCancel       bool
	SetEpoch          bool
	Epoch             int64
	ClearEpoch        bool
	SetKey, ClearKey  bool
	Key               string
}

func modelPatch(p contract.RunPatch) runPatch {
	var m runPatch
	m.Status, _ = p.Status.Value()
	m.Detached, m.SetDetached = p.DetachedSince.Value()
	m.ClearDetached = p.DetachedSince.IsClear()
	m.Cancel, m.SetCancel = p.CancelRequested.Value()
	m.ClearCancel = p.CancelRequested.IsClear()
	m.Epoch, m.SetEpoch = p.DriverEpoch.Value()
	m.ClearEpoch = p.DriverEpoch.IsClear()
	m.Key, m.SetKey = p.SandboxKey.Value()
	m.ClearKey = p.SandboxKey.IsClear()
	return m
}

// RunInput is one recorded fenced-run call.
type RunInput struct {
	Op            string
	Token         string
	Epoch         int64
	Lease         int64
	Key           string
	Psid          string
	Now           int64
	ClearDetached bool
	// The reaper's claim conditions (ClaimCond).
	CondDetached  bool
	Detached      int64
	CondCutoff    bool
	Cutoff        int64
	CondCancelled bool
	CondUnheld    bool
	Unheld        int64
	Patch         runPatch
}

// RunView is the register as one call observed it (Exists=false: no run).
type RunView struct {
	Exists      bool
	Epoch       int64
	Status      contract.RunStatus
	HasDetached bool
	Detached    int64
	Lapsed      bool
	Cancel      bool
	Lease       int64
	Key         string
	Psid        string
	// Record is set for reads of the reference record only (Get): driver attributes
	// (lease, lapsed, provider sandbox id) are not compared.
	Record bool
}

// RunOutput is what a fenced-run call returned.
type RunOutput struct {
	Err     errClass
	Created bool
	View    RunView
}

// regState is the model's register: the durable run state plus the tokens it carries.
type regState struct {
	RunView
	CreateToken string // the token of the create (never changes)
	Token       string // the token of the last create or claim
}

func viewOf(st *contract.RunState) RunView {
	if st == nil {
		return RunView{}
	}
	v := RunView{Exists: true, Epoch: st.Epoch(), Status: st.Status, Lapsed: st.Lapsed,
		Cancel: st.Cancelled(), Lease: st.LeaseUntil, Psid: st.ProviderSandboxID}
	if st.DetachedSince != nil {
		v.HasDetached, v.Detached = true, *st.DetachedSince
	}
	if st.SandboxKey != nil {
		v.Key = *st.SandboxKey
	}
	return v
}

// matches reports whether the observed view o agrees with the model's state s.
func (s regState) matches(o RunView) bool {
	if !o.Exists || !s.Exists {
		return o.Exists == s.Exists
	}
	a := s.RunView
	if o.Record {
		a.Lease, a.Lapsed, a.Psid, a.Record = o.Lease, o.Lapsed, o.Psid, true
	}
	return a == o
}

// fenced is the common refusal logic of update-fenced, record, heartbeat and detach:
// it returns the allowed refusals (nil slice + ok when the write may apply).
func fenced(s regState, epoch int64) (refusals []errClass, applies bool) {
	switch {
	case !s.Exists:
		return []errClass{errUnknown}, false
	case s.Status.Terminal() && s.Epoch != epoch:
		// Both conditions fail: docs/design.md §2.2 does not order them.
		return []errClass{errTerminal, errSuperseded}, false
	case s.Status.Terminal():
		return []errClass{errTerminal}, false
	case s.Epoch != epoch:
		return []errClass{errSuperseded}, false
	}
	return nil, true
}

func applyPatch(v RunView, p runPatch) RunView {
	if p.Status != "" {
		v.Status = p.Status
	}
	switch {
	case p.SetDetached:
		v.HasDetached, v.Detached = true, p.Detached
	case p.ClearDetached:
		v.HasDetached, v.Detached = false, 0
	}
	switch {
	case p.SetCancel:
		v.Cancel = p.Cancel
	case p.ClearCancel:
		v.Cancel = false
	}
	switch {
	case p.SetEpoch:
		v.Epoch = p.Epoch
	case p.ClearEpoch:
		v.Epoch = 0
	}
	switch {
	case p.SetKey:
		v.Key = p.Key
	case p.ClearKey:
		v.Key = ""
	}
	return v
}

// outcomes returns every state the register may be in after in was applied to s, each
// with the output the caller would then have seen (Created/View/Err). A call may also
// return several outcomes (a claim burning 1..MaxBurn epochs).
func outcomes(s regState, in RunInput) []struct {
	next regState
	out  RunOutput
} {
	type oc = struct {
		next regState
		out  RunOutput
	}
	ok := func(n regState) oc { return oc{n, RunOutput{View: n.RunView}} }
	refuse := func(errs ...errClass) []oc {
		var r []oc
		for _, e := range errs {
			r = append(r, oc{s, RunOutput{Err: e}})
		}
		return r
	}
	switch in.Op {
	case runState, runGet:
		return []oc{ok(s)}
	case runCreate:
		if !s.Exists {
			n := regState{RunView: RunView{Exists: true, Epoch: 1, Status: contract.StatusRunning, Lease: in.Lease,
				Key: in.Key, Psid: in.Psid}, CreateToken: in.Token, Token: in.Token}
			o := ok(n)
			o.out.Created = true
			return []oc{o}
		}
		var r []oc
		if s.CreateToken == in.Token {
			o := ok(s)
			o.out.Created = true
			r = append(r, o)
		}
		if s.Token != in.Token {
			r = append(r, ok(s))
		}
		return r
	case runClaim:
		var r []oc
		if s.Exists && s.Token == in.Token {
			r = append(r, ok(s)) // my retried claim met its own landed attempt
		}
		if !s.Exists {
			return append(r, refuse(errUnknown)...)
		}
		condFails := in.CondDetached && (!s.HasDetached || s.Detached != in.Detached) ||
			in.CondCutoff && (!s.HasDetached || s.Detached > in.Cutoff) ||
			in.CondCancelled && !s.Cancel ||
			in.CondUnheld && !s.HasDetached && s.Lease > in.Unheld
		switch {
		case s.Status.Terminal() && condFails:
			return append(r, refuse(errTerminal, errConflict)...)
		case s.Status.Terminal():
			return append(r, refuse(errTerminal)...)
		case condFails:
			return append(r, refuse(errConflict)...)
		}
		for k := int64(1); k <= MaxBurn; k++ {
			n := s
			n.Epoch += k
			n.Lease = in.Lease
			n.Token = in.Token
			if n.Status == contract.StatusInterrupted {
				n.Status = contract.StatusRunning
			}
			if in.ClearDetached {
				n.HasDetached, n.Detached, n.Lapsed = false, 0, false
			}
			r = append(r, ok(n))
		}
		return r
	case runUpdate:
		if errs, applies := fenced(s, in.Epoch); !applies {
			r := refuse(errs...)
			if s.Exists && s.Status.Terminal() && s.Epoch == in.Epoch && in.Patch.Status == s.Status {
				r = append(r, ok(s)) // a retried terminal write that already landed
			}
			return r
		}
		n := s
		n.RunView = applyPatch(s.RunView, in.Patch)
		return []oc{ok(n)}
	case runRecord:
		if errs, applies := fenced(s, in.Epoch); !applies {
			return refuse(errs...)
		}
		n := s
		n.Psid = in.Psid
		return []oc{ok(n)}
	case runHeartbeat:
		if errs, applies := fenced(s, in.Epoch); !applies {
			return refuse(errs...)
		}
		n := s
		n.Lease = in.Lease
		if n.Lapsed {
			n.Lapsed, n.HasDetached, n.Detached = false, false, 0
		}
		return []oc{ok(n)}
	case runDetach:
		if errs, applies := fenced(s, in.Epoch); !applies {
			return refuse(errs...)
		}
		n := s
		if !n.HasDetached {
			n.HasDetached, n.Detached = true, in.Now
		}
		n.Key = in.Key
		return []oc{ok(n)}
	case runLapse:
		if !s.Exists {
			return refuse(errUnknown, errConflict)
		}
		if s.Epoch != in.Epoch || s.Lease != in.Lease || s.HasDetached {
			r := refuse(errConflict)
			if s.Epoch == in.Epoch && s.Lease == in.Lease && s.Lapsed && s.HasDetached && s.Detached == in.Lease {
				// A retried lapse meeting its own landed stamp (docs/design.md §2.1: every
				// conditional write recognises its own retried attempt).
				r = append(r, oc{s, RunOutput{}})
			}
			return r
		}
		n := s
		n.HasDetached, n.Detached, n.Lapsed = true, in.Lease, true
		r := []oc{{n, RunOutput{}}}
		if s.Status.Terminal() {
			r = append(r, refuse(errConflict, errTerminal)...) // the spec is silent on terminal runs
		}
		return r
	case runCancel:
		if !s.Exists {
			return refuse(errUnknown)
		}
		if s.Status.Terminal() {
			return []oc{ok(s)}
		}
		n := s
		n.Cancel = true
		return []oc{ok(n)}
	case runPlain:
		if !s.Exists {
			return []oc{{s, RunOutput{}}}
		}
		n := s
		n.RunView = applyPatch(s.RunView, in.Patch)
		return []oc{{n, RunOutput{}}}
	}
	panic(fmt.Sprintf("faultrun: unknown run op %q", in.Op))
}

// agrees reports whether an observed output is the outcome o: the same refusal, or
// success with the same view (and created flag for a create).
func agrees(in RunInput, o RunOutput, got RunOutput, next regState) bool {
	if got.Err != o.Err {
		return false
	}
	if got.Err != errNone {
		return true
	}
	switch in.Op {
	case runLapse, runPlain:
		return true
	case runCreate:
		if got.Created != o.Created {
			return false
		}
	}
	return next.matches(got.View)
}

// runStep is the nondeterministic step of the register.
func runStep(state, input, output any) []any {
	s := state.(regState)
	in := unkey(input).(RunInput)
	got := output.(RunOutput)
	var next []any
	if got.Err == errOther {
		// Ambiguous: it may not have applied, or applied with any successful outcome.
		next = append(next, s)
		for _, o := range outcomes(s, in) {
			if o.out.Err == errNone {
				next = append(next, o.next)
			}
		}
		return next
	}
	for _, o := range outcomes(s, in) {
		if agrees(in, o.out, got, o.next) {
			next = append(next, o.next)
		}
	}
	return next
}

// RunModel is the run's fenced register of docs/design.md §2.2 as a porcupine model, partitioned by
// run: create-claimed, claim (1..MaxBurn epochs), update-fenced, record, heartbeat,
// detach, lapse, request-cancel and consistent reads, each checked against what it
// returned; ambiguous calls may or may not have applied.
func RunModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{regState{}} },
		Step:      runStep,
		Equal:     func(a, b any) bool { return a.(regState) == b.(regState) },
		DescribeOperation: func(input, output any) string {
			return fmt.Sprintf("%+v -> %+v", unkey(input), output)
		},
	}
	return nm.ToModel()
}
