package faultrun

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Event-log operations (docs/design.md §2.4).
const (
	logAppend = "append"
	logFence  = "fence"
	logClose  = "close"
	logCancel = "mark-cancel"
	logWatch  = "mark-watch"
	logRead   = "read" // only reads from offset 0 are modelled
)

// LogInput is one recorded event-log call.
type LogInput struct {
	Op    string
	Epoch int64  // the cursor's (or fence's) epoch
	Batch string // append: the batch's event ids, each followed by ';'
	Src   int64  // append: the batch's highest Src
}

// LogOutput is what an event-log call returned.
type LogOutput struct {
	Err         errClass
	CursorEpoch int64
	Src         int64
	Cancel      bool
	Events      string // read: the ids of the events returned, each followed by ';'
	Closed      bool   // read
}

// anySrc in a modelled outcome accepts any Src.
const anySrc = -1

// logState is the model's log: the events stored (ids in order), the owner (highest epoch
// that fenced, appended or closed), whether a close item and a cancel marker exist, and the
// highest Src stored.
type logState struct {
	Events string
	Owner  int64
	Closed bool
	Cancel bool
	MaxSrc int64
}

// EventID is how the workload names an event in the log models: "<epoch>.<seq>".
func EventID(epoch, seq int64) string { return fmt.Sprintf("%d.%d", epoch, seq) }

// eventData is the JSON the workload's drivers append: run id, epoch and sequence.
type eventData struct {
	Run   string `json:"r"`
	Epoch int64  `json:"e"`
	Seq   int64  `json:"s"`
}

// encodeEvents returns the model ids of events appended by the workload ("" when an event
// is not one of its own).
func encodeEvents(evs []contract.Event) string {
	var b strings.Builder
	for _, e := range evs {
		var d eventData
		if json.Unmarshal(e.Data, &d) != nil || d.Epoch == 0 {
			b.WriteString("?;")
			continue
		}
		b.WriteString(EventID(d.Epoch, d.Seq))
		b.WriteByte(';')
	}
	return b.String()
}

// logStep is the nondeterministic step of the log.
func logStep(state, input, output any) []any {
	s := state.(logState)
	in := unkey(input).(LogInput)
	got := output.(LogOutput)
	type oc struct {
		next logState
		out  LogOutput
	}
	var ocs []oc
	refuse := func(errs ...errClass) {
		for _, e := range errs {
			ocs = append(ocs, oc{s, LogOutput{Err: e}})
		}
	}
	// stale refuses a write of an epoch the log no longer takes (closed, superseded, or
	// both: either may be reported), true when it did.
	stale := func() bool {
		switch {
		case s.Closed && in.Epoch < s.Owner:
			refuse(errClosed, errSuperseded)
		case s.Closed:
			refuse(errClosed)
		case in.Epoch < s.Owner:
			refuse(errSuperseded)
		default:
			return false
		}
		return true
	}
	switch in.Op {
	case logAppend:
		stored := in.Batch != "" && strings.Contains(";"+s.Events, ";"+in.Batch)
		if stored {
			// A retry meeting its own landed batch stores nothing again and answers from its
			// own item (Src as of that item: anySrc), whatever was stored after it.
			ocs = append(ocs, oc{s, LogOutput{CursorEpoch: in.Epoch, Src: anySrc, Cancel: s.Cancel}})
			refuse(errSuperseded, errClosed)
			break
		}
		if !stale() {
			n := s
			n.Events += in.Batch
			n.Owner = in.Epoch
			n.MaxSrc = max(n.MaxSrc, in.Src)
			ocs = append(ocs, oc{n, LogOutput{CursorEpoch: in.Epoch, Src: n.MaxSrc, Cancel: n.Cancel}})
		}
	case logFence:
		if !stale() {
			n := s
			n.Owner = in.Epoch
			ocs = append(ocs, oc{n, LogOutput{CursorEpoch: in.Epoch, Src: n.MaxSrc, Cancel: n.Cancel}})
		}
	case logClose:
		switch {
		case in.Epoch < s.Owner:
			refuse(errSuperseded)
			if s.Closed {
				refuse(errClosed)
			}
		case s.Closed:
			// A retried close of the owner: success or log-closed.
			ocs = append(ocs, oc{s, LogOutput{}})
			refuse(errClosed)
		default:
			n := s
			n.Closed, n.Owner = true, in.Epoch
			ocs = append(ocs, oc{n, LogOutput{}})
		}
	case logCancel:
		if s.Closed {
			refuse(errClosed)
			break
		}
		n := s
		n.Cancel = true
		ocs = append(ocs, oc{n, LogOutput{}})
	case logWatch:
		// A watch marker stores no event and no cancel: only a closed log refuses it.
		if s.Closed {
			refuse(errClosed)
			break
		}
		ocs = append(ocs, oc{s, LogOutput{}})
	case logRead:
		// Reads from 0 return a non-empty prefix (whole items) when anything is stored;
		// closed = everything was returned and a close item follows, which the reader
		// itself may have put (a terminal run's log, docs/design.md §2.4).
		ocs = append(ocs, oc{s, LogOutput{}})
		if !s.Closed {
			n := s
			n.Closed = true
			ocs = append(ocs, oc{n, LogOutput{Closed: true}})
		}
	default:
		panic(fmt.Sprintf("faultrun: unknown log op %q", in.Op))
	}
	var next []any
	if got.Err == errOther {
		next = append(next, s)
		for _, o := range ocs {
			if o.out.Err == errNone {
				next = append(next, o.next)
			}
		}
		return next
	}
	for _, o := range ocs {
		if o.out.Err != got.Err {
			continue
		}
		if got.Err != errNone {
			next = append(next, o.next)
			continue
		}
		switch in.Op {
		case logAppend, logFence:
			// The cancel flag reports a marker seen on the way: never one that is not there.
			if got.CursorEpoch != o.out.CursorEpoch || o.out.Src != anySrc && got.Src != o.out.Src || got.Cancel && !o.next.Cancel {
				continue
			}
		case logRead:
			if !strings.HasPrefix(s.Events, got.Events) || s.Events != "" && got.Events == "" {
				continue
			}
			if got.Closed && (got.Events != s.Events || !o.next.Closed) {
				continue
			}
			if !got.Closed && o.next.Closed != s.Closed {
				continue
			}
		}
		next = append(next, o.next)
	}
	return next
}

// LogModel is a run's event log of docs/design.md §2.4 as a porcupine model, partitioned by run:
// appends are fenced by the highest epoch that fenced, appended or closed; an ambiguous
// retry stores a batch once; nothing follows a close; reads from 0 see a prefix of what
// was stored, in order.
func LogModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{logState{}} },
		Step:      logStep,
		Equal:     func(a, b any) bool { return a.(logState) == b.(logState) },
		DescribeOperation: func(input, output any) string {
			return fmt.Sprintf("%+v -> %+v", unkey(input), output)
		},
	}
	return nm.ToModel()
}

// Lock operations.
const (
	lockAcquire = "acquire"
	lockRelease = "release"
)

// LockInput is an acquire or a release by the holder (one id per WithLock call).
type LockInput struct {
	Op     string
	Holder int64
}

// LockOutput is the fence an acquire returned (0 for a release).
type LockOutput struct{ Fence int64 }

type lockState struct {
	Holder int64
	Fence  int64
}

// LockModel is the lock of docs/design.md §2.3 as a porcupine model partitioned by key: a mutex
// whose every acquire returns a fence greater than any before it. A holder that lost its
// lease releases at an unknown moment after its acquire (the recorder's interval says so).
func LockModel() porcupine.Model {
	return porcupine.Model{
		Partition: partition,
		Init:      func() any { return lockState{} },
		Step: func(state, input, output any) (bool, any) {
			s := state.(lockState)
			in := unkey(input).(LockInput)
			switch in.Op {
			case lockAcquire:
				f := output.(LockOutput).Fence
				if s.Holder != 0 || f <= s.Fence {
					return false, s
				}
				return true, lockState{Holder: in.Holder, Fence: f}
			case lockRelease:
				if s.Holder != in.Holder {
					return false, s
				}
				return true, lockState{Fence: s.Fence}
			}
			return false, s
		},
		DescribeOperation: func(input, output any) string {
			return fmt.Sprintf("%+v -> %+v", unkey(input), output)
		},
	}
}
