package testkit

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
)

// RunTenantConformance proves the tenant rule (docs/design.md §2.0): a context that never
// got a tenant is refused with contract.ErrNoTenant by every tenant-scoped call — every
// method of Instances, Runs, Locks, Log and Intents and of each optional capability the
// backend has — and writes nothing anywhere; the empty tenant, chosen with
// contract.WithTenant(ctx, ""), is a tenant like any other and never crosses another.
// Reaper() is cross-tenant by design and takes no tenant.
func RunTenantConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, tnCases())
}

// tnCall is one tenant-scoped call, made under ctx with valid arguments.
type tnCall struct {
	name string // "<accessor or capability>.<method>"
	call func(ctx context.Context, b contract.Backend) (applicable bool, err error)
}

// tnOptional are the optional capabilities whose methods are tenant-scoped, with where
// each is found.
var tnOptional = []struct {
	name string
	typ  reflect.Type
	on   func(b contract.Backend) any
}{
	{"RowIntentReader", reflect.TypeFor[contract.RowIntentReader](), func(b contract.Backend) any { return b }},
	{"StateRowReader", reflect.TypeFor[contract.StateRowReader](), func(b contract.Backend) any { return b }},
	{"RowsReader", reflect.TypeFor[contract.RowsReader](), func(b contract.Backend) any { return b }},
	{"LogWaker", reflect.TypeFor[contract.LogWaker](), func(b contract.Backend) any { return b }},
	{"RunLister", reflect.TypeFor[contract.RunLister](), func(b contract.Backend) any { return b.Runs() }},
	{"RunWriter", reflect.TypeFor[contract.RunWriter](), func(b contract.Backend) any { return b.Runs() }},
}

// tnAlways wraps a call of the contract (always applicable).
func tnAlways(f func(ctx context.Context, b contract.Backend) error) func(context.Context, contract.Backend) (bool, error) {
	return func(ctx context.Context, b contract.Backend) (bool, error) { return true, f(ctx, b) }
}

// tnIf wraps a call of an optional capability C, found by on.
func tnIf[C any](on func(b contract.Backend) any, f func(ctx context.Context, c C) error) func(context.Context, contract.Backend) (bool, error) {
	return func(ctx context.Context, b contract.Backend) (bool, error) {
		c, ok := on(b).(C)
		if !ok {
			return false, nil
		}
		return true, f(ctx, c)
	}
}

// tnCalls lists every tenant-scoped method once; tnCovered proves the list complete.
func tnCalls(ran *bool) []tnCall {
	const k, r = "k", "r"
	onB := func(b contract.Backend) any { return b }
	onRuns := func(b contract.Backend) any { return b.Runs() }
	rec := instBase(k)
	at := contract.Cursor{Epoch: 1, Next: 1}
	e := func(f func(ctx context.Context, b contract.Backend) error) func(context.Context, contract.Backend) (bool, error) {
		return tnAlways(f)
	}
	return []tnCall{
		{"Instances.GetRow", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Instances().GetRow(ctx, k)
			return err
		})},
		{"Instances.CreateRow", e(func(ctx context.Context, b contract.Backend) error { return b.Instances().CreateRow(ctx, rec, "inc") })},
		{"Instances.ReplaceRow", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().ReplaceRow(ctx, rec, "inc", "inc-2")
		})},
		{"Instances.Touch", e(func(ctx context.Context, b contract.Backend) error { return b.Instances().Touch(ctx, k, "sb-1", r, 2) })},
		{"Instances.SetSnapshot", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().SetSnapshot(ctx, k, "sb-1", "", "snap", 2)
		})},
		{"Instances.DropStaleSnapshot", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().DropStaleSnapshot(ctx, k, "snap")
		})},
		{"Instances.MarkReclaiming", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().MarkReclaiming(ctx, k, "sb-1", 1, 1, "tok")
		})},
		{"Instances.DeleteReclaimed", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().DeleteReclaimed(ctx, k, "tok")
		})},
		{"Instances.DeferReclaim", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().DeferReclaim(ctx, k, "sb-1", 5)
		})},
		{"Instances.MarkStopping", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().MarkStopping(ctx, k, "sb-1", 1, "stop", 2)
		})},
		{"Instances.SettleStop", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().SettleStop(ctx, k, "stop", contract.LifecycleStopped, 2)
		})},
		{"Instances.DeferStop", e(func(ctx context.Context, b contract.Backend) error {
			return b.Instances().DeferStop(ctx, k, "sb-1", 5)
		})},

		{"Runs.FindActiveRun", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().FindActiveRun(ctx, "t")
			return err
		})},
		{"Runs.State", e(func(ctx context.Context, b contract.Backend) error { _, err := b.Runs().State(ctx, r); return err })},
		{"Runs.CreateClaimed", e(func(ctx context.Context, b contract.Backend) error {
			_, _, err := b.Runs().CreateClaimed(ctx, fxInput(r))
			return err
		})},
		{"Runs.Claim", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().Claim(ctx, r, contract.Claim{Token: "c", LeaseUntil: fxLease})
			return err
		})},
		{"Runs.UpdateFenced", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().UpdateFenced(ctx, r, 1, contract.RunPatch{Status: contract.Set(contract.StatusAborted)})
			return err
		})},
		{"Runs.ClearLaunch", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().ClearLaunch(ctx, r)
			return err
		})},
		{"Runs.RecordSandbox", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().RecordSandbox(ctx, r, 1, "sb-1")
			return err
		})},
		{"Runs.Heartbeat", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().Heartbeat(ctx, r, 1, fxLease)
			return err
		})},
		{"Runs.Detach", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().Detach(ctx, r, 1, fxKey, 5)
			return err
		})},
		{"Runs.Lapse", e(func(ctx context.Context, b contract.Backend) error { return b.Runs().Lapse(ctx, r, 1, fxLease) })},
		{"Runs.RequestCancel", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().RequestCancel(ctx, r)
			return err
		})},
		{"Runs.RunsUsingKey", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Runs().RunsUsingKey(ctx, fxKey)
			return err
		})},

		{"Locks.WithLock", e(func(ctx context.Context, b contract.Backend) error {
			return b.Locks().WithLock(ctx, k, func(context.Context) error { *ran = true; return nil })
		})},

		{"Log.Append", e(func(ctx context.Context, b contract.Backend) error {
			_, err := b.Log().Append(ctx, r, at, evBatch("x"))
			return err
		})},
		{"Log.Fence", e(func(ctx context.Context, b contract.Backend) error { _, err := b.Log().Fence(ctx, r, 1); return err })},
		{"Log.Read", e(func(ctx context.Context, b contract.Backend) error {
			_, _, _, err := b.Log().Read(ctx, r, 0, 10)
			return err
		})},
		{"Log.Close", e(func(ctx context.Context, b contract.Backend) error { return b.Log().Close(ctx, r, at) })},
		{"Log.MarkCancel", e(func(ctx context.Context, b contract.Backend) error { return b.Log().MarkCancel(ctx, r) })},
		{"Log.MarkWatch", e(func(ctx context.Context, b contract.Backend) error { return b.Log().MarkWatch(ctx, r) })},

		{"Intents.Put", e(func(ctx context.Context, b contract.Backend) error { return b.Intents().Put(ctx, k, 1, 1) })},
		{"Intents.Record", e(func(ctx context.Context, b contract.Backend) error { return b.Intents().Record(ctx, k, 1, "sb-1") })},
		{"Intents.Get", e(func(ctx context.Context, b contract.Backend) error { _, err := b.Intents().Get(ctx, k); return err })},
		{"Intents.Drop", e(func(ctx context.Context, b contract.Backend) error { return b.Intents().Drop(ctx, k, 1) })},

		{"RowIntentReader.GetRowAndIntent", tnIf(onB, func(ctx context.Context, c contract.RowIntentReader) error {
			_, _, err := c.GetRowAndIntent(ctx, k)
			return err
		})},
		{"StateRowReader.GetStateAndRow", tnIf(onB, func(ctx context.Context, c contract.StateRowReader) error {
			_, _, err := c.GetStateAndRow(ctx, r, k)
			return err
		})},
		{"RowsReader.GetRows", tnIf(onB, func(ctx context.Context, c contract.RowsReader) error {
			_, err := c.GetRows(ctx, []string{k})
			return err
		})},
		{"LogWaker.LogChanged", tnIf(onB, func(ctx context.Context, c contract.LogWaker) error {
			_, stop, err := c.LogChanged(ctx, r)
			if err == nil {
				stop()
			}
			return err
		})},
		{"RunWriter.CreateOrResume", tnIf(onRuns, func(ctx context.Context, c contract.RunWriter) error {
			_, err := c.CreateOrResume(ctx, contract.NewRun{RunID: r, ThreadID: "t", StartedAt: fxStart})
			return err
		})},
		{"RunWriter.Update", tnIf(onRuns, func(ctx context.Context, c contract.RunWriter) error {
			return c.Update(ctx, r, contract.RunPatch{Status: contract.Set(contract.StatusAborted)})
		})},
		{"RunLister.ListRuns", tnIf(onRuns, func(ctx context.Context, c contract.RunLister) error {
			_, err := c.ListRuns(ctx, contract.RunFilter{}, nil, 10)
			return err
		})},
	}
}

// tnCovered fails the test unless calls names every tenant-scoped method exactly once: each
// method of the interfaces Backend's accessors return (but Reaper, cross-tenant) and of
// tnOptional, so a method added to the contract without a tenant case is caught here.
func tnCovered(t *testing.T, calls []tnCall) {
	t.Helper()
	var want []string
	bt := reflect.TypeFor[contract.Backend]()
	for i := range bt.NumMethod() {
		m := bt.Method(i)
		if m.Name == "Reaper" || m.Type.NumOut() != 1 || m.Type.Out(0).Kind() != reflect.Interface {
			continue
		}
		it := m.Type.Out(0)
		for j := range it.NumMethod() {
			want = append(want, m.Name+"."+it.Method(j).Name)
		}
	}
	for _, o := range tnOptional {
		for j := range o.typ.NumMethod() {
			want = append(want, o.name+"."+o.typ.Method(j).Name)
		}
	}
	var got []string
	for _, c := range calls {
		got = append(got, c.name)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("the tenant cases cover %v;\nthe contract's tenant-scoped methods are %v", got, want)
	}
}

func tnCases() []cfCase {
	return []cfCase{
		{"a context without a tenant is ErrNoTenant on every call and writes nothing", func(t *testing.T, b contract.Backend) {
			var ran bool
			calls := tnCalls(&ran)
			tnCovered(t, calls)
			none := t.Context() // never given a tenant
			for _, c := range calls {
				applicable, err := c.call(none, b)
				if !applicable {
					t.Logf("%s: the backend lacks the capability", c.name)
					continue
				}
				cfIs(t, err, contract.ErrNoTenant, c.name+" without a tenant")
				if errors.Is(err, contract.ErrInvalid) {
					t.Fatalf("%s: a missing tenant is the caller's bug, not invalid input: %v", c.name, err)
				}
			}
			if ran {
				t.Fatal("WithLock ran fn without a tenant")
			}
			// Nothing landed in the empty tenant (nor anywhere a reader of "" could see it).
			instWant(t, refstore.Instances(b.Instances()), "", "k", nil, "the empty tenant after tenant-less writes")
			instRowWant(t, instRows(t, b), "", "k", nil, "the empty tenant's row after tenant-less writes")
			fxWant(t, fxRuns(t, b), "", "r", nil, "the empty tenant's run after tenant-less writes")
			in, err := b.Intents().Get(ctxFor(t, ""), "k")
			cfNoErr(t, err, `Intents.Get in ""`)
			if in != nil {
				t.Fatalf("the empty tenant holds intent %+v after tenant-less writes", *in)
			}
			evs, _, _, err := b.Log().Read(ctxFor(t, ""), "r", 0, 10)
			cfNoErr(t, err, `Log.Read in ""`)
			if len(evs) > 0 {
				t.Fatalf("the empty tenant's log holds %s after tenant-less writes", evShow(evs))
			}
		}},
		{"the explicit empty tenant works and never crosses another", func(t *testing.T, b contract.Backend) {
			ce, ca := ctxFor(t, ""), ctxFor(t, "tenant-a")
			tnEmptyInstances(t, b, ce, ca)
			tnEmptyRuns(t, b, ce, ca)
			tnEmptyIntents(t, b, ce, ca)
			tnEmptyLog(t, b, ce, ca)
			tnEmptyLocks(t, b, ce, ca)
		}},
	}
}

// tnEmptyInstances: the same key in "" and in tenant-a are two records and two rows.
func tnEmptyInstances(t *testing.T, b contract.Backend, ce, ca context.Context) {
	inE, inA := instBase("k"), instBase("k")
	inE.ProviderSandboxID, inA.ProviderSandboxID = "sb-empty", "sb-a"
	inst := refstore.Instances(b.Instances())
	cfNoErr(t, inst.Upsert(ce, inE), `Upsert in ""`)
	instWant(t, refstore.Instances(b.Instances()), "tenant-a", "k", nil, `tenant-a after "" wrote k`)
	cfNoErr(t, inst.Upsert(ca, inA), "Upsert in tenant-a")
	instWant(t, refstore.Instances(b.Instances()), "", "k", &inE, `""`)
	instWant(t, refstore.Instances(b.Instances()), "tenant-a", "k", &inA, "tenant-a")
	cfNoErr(t, inst.Delete(ce, "k"), `Delete in ""`)
	instWant(t, refstore.Instances(b.Instances()), "", "k", nil, `"" after its Delete`)
	instWant(t, refstore.Instances(b.Instances()), "tenant-a", "k", &inA, `tenant-a after ""'s Delete`)

	rows := instRows(t, b)
	rowE := instBase("row")
	cfNoErr(t, rows.CreateRow(ce, rowE, "inc-empty"), `CreateRow in ""`)
	instRowWant(t, rows, "tenant-a", "row", nil, `tenant-a after "" created row`)
	cfNoErr(t, rows.CreateRow(ca, instBase("row"), "inc-a"), "CreateRow in tenant-a")
	instRowWant(t, rows, "", "row", ptr(contract.FullRow(rowE, "inc-empty")), `"" after tenant-a created row`)
}

// tnEmptyRuns: run r in "" and in tenant-a are two runs; a claim in one leaves the other.
func tnEmptyRuns(t *testing.T, b contract.Backend, ce, ca context.Context) {
	runs := fxRuns(t, b)
	st, created, err := runs.CreateClaimed(ce, fxInput("r"))
	if err != nil || !created {
		t.Fatalf(`CreateClaimed in "" = %v, created %v`, err, created)
	}
	fxWant(t, runs, "tenant-a", "r", nil, `tenant-a after "" created r`)
	_, err = runs.Claim(ca, "r", contract.Claim{Token: "claim-a", LeaseUntil: fxLease})
	cfIs(t, err, contract.ErrUnknownRun, `Claim in tenant-a of ""'s run`)
	if _, created, err := runs.CreateClaimed(ca, fxInput("r")); err != nil || !created {
		t.Fatalf("CreateClaimed in tenant-a = %v, created %v; want its own new run", err, created)
	}
	claimed, err := runs.Claim(ca, "r", contract.Claim{Token: "claim-a", LeaseUntil: fxLease})
	cfNoErr(t, err, "Claim in tenant-a")
	if claimed.Epoch() != 2 {
		t.Fatalf("tenant-a's claim took epoch %d, want 2", claimed.Epoch())
	}
	fxWant(t, runs, "", "r", &st, `"" after tenant-a claimed its r`)

	ref := refstore.Runs(runs)
	rec, err := ref.CreateOrResume(ce, contract.NewRun{RunID: "plain", ThreadID: "t", StartedAt: fxStart})
	if errors.Is(err, errors.ErrUnsupported) {
		return // no RunWriter: the fenced runs above are the whole run store
	}
	cfNoErr(t, err, `CreateOrResume in ""`)
	if got, err := ref.Get(ca, "plain"); err != nil || got != nil {
		t.Fatalf(`Get in tenant-a of ""'s run = %+v, %v; want none`, got, err)
	}
	if got, err := ref.Get(ce, "plain"); err != nil || got == nil || got.RunID != rec.RunID {
		t.Fatalf(`Get in "" = %+v, %v; want its run`, got, err)
	}
}

// tnEmptyIntents: an intent in "" is not tenant-a's, and the reverse.
func tnEmptyIntents(t *testing.T, b contract.Backend, ce, ca context.Context) {
	cfNoErr(t, b.Intents().Put(ce, "k", 7, 1), `Intents.Put in ""`)
	if in, err := b.Intents().Get(ca, "k"); err != nil || in != nil {
		t.Fatalf(`Intents.Get in tenant-a after "" put = %+v, %v; want none`, in, err)
	}
	cfNoErr(t, b.Intents().Put(ca, "k", 9, 1), "Intents.Put in tenant-a")
	in, err := b.Intents().Get(ce, "k")
	if err != nil || in == nil || in.Token != 7 {
		t.Fatalf(`Intents.Get in "" = %+v, %v; want its token 7`, in, err)
	}
}

// tnEmptyLog: run "log" has one log in "" and another in tenant-a.
func tnEmptyLog(t *testing.T, b contract.Backend, ce, ca context.Context) {
	re := evAppend(t, b, ce, "log", evNewRun(t, b, ce, "log"), evBatch("e1", "e2"))
	evAppend(t, b, ca, "log", evNewRun(t, b, ca, "log"), evBatch("a1"))
	got, _, _ := evReadAll(t, b, ce, "log", 100)
	evSameData(t, got, evBatch("e1", "e2"), `""'s log`)
	cfNoErr(t, b.Log().Close(ce, "log", re.Cursor), `Close in ""`)
	got, closed, _ := evReadAll(t, b, ca, "log", 100)
	evSameData(t, got, evBatch("a1"), "tenant-a's log")
	if closed {
		t.Fatal(`closing ""'s log closed tenant-a's`)
	}
}

// tnEmptyLocks: key k held in "" does not hold it in tenant-a, nor the reverse.
func tnEmptyLocks(t *testing.T, b contract.Backend, ce, ca context.Context) {
	ls := b.Locks()
	for _, p := range [][2]context.Context{{ce, ca}, {ca, ce}} {
		h := lkHold(p[0], ls, "k")
		lkAwait(t, h.entered, "the first tenant to acquire")
		ctx, cancel := context.WithTimeout(p[1], 5*time.Second) // bounds a failure only
		ran := false
		err := ls.WithLock(ctx, "k", func(context.Context) error { ran = true; return nil })
		cancel()
		close(h.release)
		if err != nil || !ran {
			t.Fatalf("the other tenant could not take the key held: WithLock = %v, fn ran = %v", err, ran)
		}
		if err := <-h.done; err != nil {
			t.Fatalf("holder's WithLock = %v", err)
		}
	}
}
