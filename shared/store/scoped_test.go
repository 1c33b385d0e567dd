package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// nilViews is a view of every store whose methods all panic (nil interfaces): a call that
// reaches one shows the face let it through.
type nilViews struct {
	contract.InstanceRows
	contract.FencedRuns
	contract.EventLog
	contract.IntentStore
	LockView
	contract.RunWriter
	contract.RunLister
	contract.ThreadLister
	contract.ReclaimableLister
}

// faceCall is one face method, called with id where it names one; bad calls it with each
// of its other arguments invalid in turn.
type faceCall struct {
	name string
	call func(ctx context.Context, id string) error
	bad  []func(ctx context.Context) error
}

func faceCalls(asked *[]string) []faceCall {
	of := func(t string) nilViews { *asked = append(*asked, t); return nilViews{} }
	in, runs, log := ScopedInstances(of), ScopedRuns(of), ScopedLog(of)
	ints, locks := ScopedIntents(of), ScopedLocks(of).(contract.LeaseLocks)
	w, l, tl, rl := ScopedRunWriter(of), ScopedRunLister(of), ScopedThreadLister(of), ScopedReclaimableLister(of)
	lockStore := ScopedLocks(of)
	ev := []contract.Event{{Data: json.RawMessage(`{}`)}}
	at := contract.Cursor{Epoch: 1, Next: 1}
	patch := contract.RunPatch{FinishedAt: contract.Set(int64(1))}
	rec := func(id string) contract.InstanceRecord { return contract.InstanceRecord{Key: id} }
	e2 := func(_ any, err error) error { return err }
	e3 := func(_, _ any, err error) error { return err }
	e4 := func(_, _, _ any, err error) error { return err }
	fn := func(context.Context) error { return nil }
	return []faceCall{
		{"GetRow", func(c context.Context, id string) error { return e2(in.GetRow(c, id)) }, nil},
		{"CreateRow", func(c context.Context, id string) error { return in.CreateRow(c, rec(id), "i") },
			[]func(context.Context) error{func(c context.Context) error { return in.CreateRow(c, rec("k"), "") }}},
		{"ReplaceRow", func(c context.Context, id string) error { return in.ReplaceRow(c, rec(id), "p", "n") },
			[]func(context.Context) error{
				func(c context.Context) error { return in.ReplaceRow(c, rec("k"), "", "n") },
				func(c context.Context) error { return in.ReplaceRow(c, rec("k"), "p", "") }}},
		{"Touch", func(c context.Context, id string) error { return in.Touch(c, id, "p", "r", 1) }, nil},
		{"SetSnapshot", func(c context.Context, id string) error { return in.SetSnapshot(c, id, "p", "", "s", 1) },
			[]func(context.Context) error{func(c context.Context) error { return in.SetSnapshot(c, "k", "p", "", "", 1) }}},
		{"MarkReclaiming", func(c context.Context, id string) error { return in.MarkReclaiming(c, id, "p", 1, 2, "t") },
			[]func(context.Context) error{func(c context.Context) error { return in.MarkReclaiming(c, "k", "p", 1, 2, "") }}},
		{"DeleteReclaimed", func(c context.Context, id string) error { return in.DeleteReclaimed(c, id, "t") },
			[]func(context.Context) error{func(c context.Context) error { return in.DeleteReclaimed(c, "k", "") }}},
		{"DeferReclaim", func(c context.Context, id string) error { return in.DeferReclaim(c, id, "p", 0) },
			[]func(context.Context) error{func(c context.Context) error { return in.DeferReclaim(c, "k", "p", -1) }}},
		{"DropStaleSnapshot", func(c context.Context, id string) error { return in.DropStaleSnapshot(c, id, "s") },
			[]func(context.Context) error{func(c context.Context) error { return in.DropStaleSnapshot(c, "k", "") }}},
		{"MarkStopping", func(c context.Context, id string) error { return in.MarkStopping(c, id, "p", 1, "t", 2) },
			[]func(context.Context) error{func(c context.Context) error { return in.MarkStopping(c, "k", "p", 1, "", 2) }}},
		{"SettleStop", func(c context.Context, id string) error {
			return in.SettleStop(c, id, "t", contract.LifecycleStopped, 1)
		}, []func(context.Context) error{func(c context.Context) error { return in.SettleStop(c, "k", "t", "asleep", 1) }}},
		{"DeferStop", func(c context.Context, id string) error { return in.DeferStop(c, id, "p", 1) },
			[]func(context.Context) error{func(c context.Context) error { return in.DeferStop(c, "k", "p", 0) }}},

		{"State", func(c context.Context, id string) error { return e2(runs.State(c, id)) }, nil},
		{"FindActiveRun", func(c context.Context, id string) error { return e2(runs.FindActiveRun(c, id)) }, nil},
		{"RunsUsingKey", func(c context.Context, id string) error { return e2(runs.RunsUsingKey(c, id)) }, nil},
		{"CreateClaimed", func(c context.Context, id string) error {
			return e3(runs.CreateClaimed(c, contract.CreateClaimedRun{NewRun: contract.NewRun{RunID: id}}))
		}, nil},
		{"Claim", func(c context.Context, id string) error { return e2(runs.Claim(c, id, contract.Claim{})) }, nil},
		{"UpdateFenced", func(c context.Context, id string) error { return e2(runs.UpdateFenced(c, id, 1, patch)) },
			[]func(context.Context) error{func(c context.Context) error {
				return e2(runs.UpdateFenced(c, "r", 1, contract.RunPatch{Status: contract.Clear[contract.RunStatus]()}))
			}}},
		{"RecordSandbox", func(c context.Context, id string) error { return e2(runs.RecordSandbox(c, id, 1, "p")) },
			[]func(context.Context) error{func(c context.Context) error { return e2(runs.RecordSandbox(c, "r", 1, "")) }}},
		{"Heartbeat", func(c context.Context, id string) error { return e2(runs.Heartbeat(c, id, 1, 2)) }, nil},
		{"Detach", func(c context.Context, id string) error { return e2(runs.Detach(c, id, 1, "", 2)) },
			[]func(context.Context) error{func(c context.Context) error { return e2(runs.Detach(c, "r", 1, "a\x00b", 2)) }}},
		{"Lapse", func(c context.Context, id string) error { return runs.Lapse(c, id, 1, 2) }, nil},
		{"RequestCancel", func(c context.Context, id string) error { return e2(runs.RequestCancel(c, id)) }, nil},
		{"ClearLaunch", func(c context.Context, id string) error { return e2(runs.ClearLaunch(c, id)) }, nil},

		{"Append", func(c context.Context, id string) error { return e2(log.Append(c, id, at, ev)) },
			[]func(context.Context) error{
				func(c context.Context) error { return e2(log.Append(c, "r", contract.Cursor{Epoch: 1}, ev)) },
				func(c context.Context) error { return e2(log.Append(c, "r", at, nil)) }}},
		{"Fence", func(c context.Context, id string) error { return e2(log.Fence(c, id, 1)) },
			[]func(context.Context) error{func(c context.Context) error { return e2(log.Fence(c, "r", 0)) }}},
		{"Read", func(c context.Context, id string) error { return e4(log.Read(c, id, 0, 10)) },
			[]func(context.Context) error{func(c context.Context) error { return e4(log.Read(c, "r", -1, 10)) }}},
		{"Close", func(c context.Context, id string) error { return log.Close(c, id, at) },
			[]func(context.Context) error{func(c context.Context) error { return log.Close(c, "r", contract.Cursor{}) }}},
		{"MarkCancel", func(c context.Context, id string) error { return log.MarkCancel(c, id) }, nil},
		{"MarkWatch", func(c context.Context, id string) error { return log.MarkWatch(c, id) }, nil},

		{"Intents.Put", func(c context.Context, id string) error { return ints.Put(c, id, 1, 2) }, nil},
		{"Intents.Record", func(c context.Context, id string) error { return ints.Record(c, id, 1, "p") },
			[]func(context.Context) error{func(c context.Context) error { return ints.Record(c, "k", 1, "") }}},
		{"Intents.Get", func(c context.Context, id string) error { return e2(ints.Get(c, id)) }, nil},
		{"Intents.Drop", func(c context.Context, id string) error { return ints.Drop(c, id, 1) }, nil},

		{"WithLock", func(c context.Context, id string) error { return lockStore.WithLock(c, id, fn) },
			[]func(context.Context) error{func(c context.Context) error { return lockStore.WithLock(c, "k", nil) }}},
		{"TryAcquire", func(c context.Context, id string) error { return e3(locks.TryAcquire(c, id, "o")) },
			[]func(context.Context) error{func(c context.Context) error { return e3(locks.TryAcquire(c, "k", "")) }}},
		{"Renew", func(c context.Context, id string) error { return e2(locks.Renew(c, id, "o")) },
			[]func(context.Context) error{func(c context.Context) error { return e2(locks.Renew(c, "k", "o#")) }}},
		{"Release", func(c context.Context, id string) error { return locks.Release(c, id, "o") },
			[]func(context.Context) error{func(c context.Context) error { return locks.Release(c, "k", "") }}},

		{"CreateOrResume", func(c context.Context, id string) error {
			return e2(w.CreateOrResume(c, contract.NewRun{RunID: id}))
		}, nil},
		{"Update", func(c context.Context, id string) error { return w.Update(c, id, patch) },
			[]func(context.Context) error{func(c context.Context) error {
				return w.Update(c, "r", contract.RunPatch{Status: contract.Clear[contract.RunStatus]()})
			}}},
		{"ListByThread", func(c context.Context, id string) error { return e2(tl.ListByThread(c, id)) }, nil},
		// The tenant's listings name no id: any id but the valid "x" stands for a bad one.
		{"ListRuns", func(c context.Context, id string) error {
			if id != "x" {
				return contract.Invalid("id", "none to check")
			}
			return e2(l.ListRuns(c, contract.RunFilter{}, nil, 10))
		}, []func(context.Context) error{func(c context.Context) error { return e2(l.ListRuns(c, contract.RunFilter{}, nil, 0)) }}},
		{"ListReclaimable", func(c context.Context, id string) error {
			if id != "x" {
				return contract.Invalid("id", "none to check")
			}
			return e2(rl.ListReclaimable(c, 1, 2))
		}, nil},
	}
}

// reaches reports whether call got past the face to a view (which panics), and its error.
func reaches(call func() error) (reached bool, err error) {
	defer func() {
		if recover() != nil {
			reached = true
		}
	}()
	return false, call()
}

// TestScopedFacesCheckBeforeTheView: every face method refuses a context without a
// tenant, an invalid tenant, an invalid id and each invalid argument before any view is
// asked, and a valid call reaches the view of the context's tenant.
func TestScopedFacesCheckBeforeTheView(t *testing.T) {
	var asked []string
	good := contract.WithTenant(context.Background(), "acme")
	refusals := []struct {
		name string
		ctx  context.Context
		id   string
		want error
	}{
		{"no tenant", context.Background(), "x", contract.ErrNoTenant},
		{"invalid tenant", contract.WithTenant(context.Background(), "a#b"), "x", contract.ErrInvalid},
		{"empty id", good, "", contract.ErrInvalid},
		{"id with NUL", good, "a\x00b", contract.ErrInvalid},
	}
	for _, c := range faceCalls(&asked) {
		t.Run(c.name, func(t *testing.T) {
			for _, r := range refusals {
				asked = nil
				reached, err := reaches(func() error { return c.call(r.ctx, r.id) })
				if reached || !errors.Is(err, r.want) {
					t.Errorf("%s: reached the view %v, err %v; want %v before any view", r.name, reached, err, r.want)
				}
			}
			for i, bad := range c.bad {
				if reached, err := reaches(func() error { return bad(good) }); reached || !errors.Is(err, contract.ErrInvalid) {
					t.Errorf("invalid argument %d: reached the view %v, err %v; want ErrInvalid", i, reached, err)
				}
			}
			asked = nil
			if reached, err := reaches(func() error { return c.call(good, "x") }); !reached {
				t.Errorf("a valid call did not reach the view: %v", err)
			}
			if len(asked) != 1 || asked[0] != "acme" {
				t.Errorf("views asked for %q; want the context's tenant once", asked)
			}
		})
	}
}
