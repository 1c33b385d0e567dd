package store_test

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// errExhausted stands for a caller's exhaustion error (the keeper's ErrUnavailable).
var errExhausted = errors.New("exhausted")

// calls is one call of every single-call method of the contract, through the layer's views,
// by the FaultBackend's name for it. Arguments are merely valid: after the injected
// failures the backend answers whatever it answers (a sentinel included).
func calls(s store.Store) map[string]func(ctx context.Context) error {
	rows, runs, lg, in, rp := s.Instances(), s.Runs(), s.Log(), s.Intents(), s.Reaper()
	rec := contract.InstanceRecord{Key: "k", Provider: "p", ProviderSandboxID: "sb", ThreadID: "t", UpdatedAt: 1}
	at := contract.Cursor{Epoch: 1, Next: 1}
	ev := []contract.Event{{Data: []byte(`{}`)}}
	return map[string]func(ctx context.Context) error{
		"Instances.GetRow":            func(ctx context.Context) error { _, err := rows.GetRow(ctx, "k"); return err },
		"Instances.CreateRow":         func(ctx context.Context) error { return rows.CreateRow(ctx, rec, "i1") },
		"Instances.ReplaceRow":        func(ctx context.Context) error { return rows.ReplaceRow(ctx, rec, "i1", "i2") },
		"Instances.Touch":             func(ctx context.Context) error { return rows.Touch(ctx, "k", "sb", "r", 2) },
		"Instances.SetSnapshot":       func(ctx context.Context) error { return rows.SetSnapshot(ctx, "k", "sb", "", "s1", 2) },
		"Instances.MarkReclaiming":    func(ctx context.Context) error { return rows.MarkReclaiming(ctx, "k", "sb", 1, 1, "t1") },
		"Instances.DeleteReclaimed":   func(ctx context.Context) error { return rows.DeleteReclaimed(ctx, "k", "t1") },
		"Instances.DeferReclaim":      func(ctx context.Context) error { return rows.DeferReclaim(ctx, "k", "sb", 5) },
		"Instances.DropStaleSnapshot": func(ctx context.Context) error { return rows.DropStaleSnapshot(ctx, "k", "s0") },
		"Instances.MarkStopping":      func(ctx context.Context) error { return rows.MarkStopping(ctx, "k", "sb", 1, "st", 2) },
		"Instances.SettleStop": func(ctx context.Context) error {
			return rows.SettleStop(ctx, "k", "st", contract.LifecycleStopped, 3)
		},
		"Instances.DeferStop": func(ctx context.Context) error { return rows.DeferStop(ctx, "k", "sb", 3) },
		"Runs.State":          func(ctx context.Context) error { _, err := runs.State(ctx, "r"); return err },
		"Runs.FindActiveRun":  func(ctx context.Context) error { _, err := runs.FindActiveRun(ctx, "t"); return err },
		"Runs.RunsUsingKey":   func(ctx context.Context) error { _, err := runs.RunsUsingKey(ctx, "k"); return err },
		"Runs.CreateClaimed": func(ctx context.Context) error {
			_, _, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
				NewRun: contract.NewRun{RunID: "r", ThreadID: "t", StartedAt: 1}, SandboxKey: "k", LeaseUntil: 10, Token: "c1"})
			return err
		},
		"Runs.Claim": func(ctx context.Context) error {
			_, err := runs.Claim(ctx, "r", contract.Claim{Token: "c2", LeaseUntil: 20})
			return err
		},
		"Runs.UpdateFenced": func(ctx context.Context) error {
			_, err := runs.UpdateFenced(ctx, "r", 2, contract.RunPatch{})
			return err
		},
		"Runs.RecordSandbox": func(ctx context.Context) error { _, err := runs.RecordSandbox(ctx, "r", 2, "sb"); return err },
		"Runs.Heartbeat":     func(ctx context.Context) error { _, err := runs.Heartbeat(ctx, "r", 2, 30); return err },
		"Runs.Detach":        func(ctx context.Context) error { _, err := runs.Detach(ctx, "r", 2, "", 4); return err },
		"Runs.Lapse":         func(ctx context.Context) error { return runs.Lapse(ctx, "r", 2, 30) },
		"Runs.RequestCancel": func(ctx context.Context) error { _, err := runs.RequestCancel(ctx, "r"); return err },
		"Runs.ClearLaunch":   func(ctx context.Context) error { _, err := runs.ClearLaunch(ctx, "r"); return err },
		"Log.Append":         func(ctx context.Context) error { _, err := lg.Append(ctx, "r", at, ev); return err },
		"Log.Fence":          func(ctx context.Context) error { _, err := lg.Fence(ctx, "r", 1); return err },
		"Log.Read":           func(ctx context.Context) error { _, _, _, err := lg.Read(ctx, "r", 0, 10); return err },
		"Log.Close":          func(ctx context.Context) error { return lg.Close(ctx, "r", at) },
		"Log.MarkCancel":     func(ctx context.Context) error { return lg.MarkCancel(ctx, "r") },
		"Log.MarkWatch":      func(ctx context.Context) error { return lg.MarkWatch(ctx, "r") },
		"Intents.Put":        func(ctx context.Context) error { return in.Put(ctx, "k", 1, 1) },
		"Intents.Record":     func(ctx context.Context) error { return in.Record(ctx, "k", 1, "sb") },
		"Intents.Get":        func(ctx context.Context) error { _, err := in.Get(ctx, "k"); return err },
		"Intents.Drop":       func(ctx context.Context) error { return in.Drop(ctx, "k", 1) },
		"Reaper.ReclaimCandidates": func(ctx context.Context) error {
			_, err := rp.ReclaimCandidates(ctx, 1, 10)
			return err
		},
		"Reaper.PendingReclaims": func(ctx context.Context) error { _, err := rp.PendingReclaims(ctx, 10); return err },
		"Reaper.IdleInstances":   func(ctx context.Context) error { _, err := rp.IdleInstances(ctx, 1, 10); return err },
		"Reaper.StopCandidates":  func(ctx context.Context) error { _, err := rp.StopCandidates(ctx, 1, 10); return err },
		"Reaper.StaleIntents":    func(ctx context.Context) error { _, err := rp.StaleIntents(ctx, 1, 10); return err },
	}
}

// contractMethods names every method of the backend contract's views but WithLock (which
// the layer hands on, see TestWithLockNotRepeated), as "View.Method".
func contractMethods() []string {
	views := map[string]reflect.Type{
		"Instances": reflect.TypeFor[contract.InstanceRows](),
		"Runs":      reflect.TypeFor[contract.FencedRuns](),
		"Log":       reflect.TypeFor[contract.EventLog](),
		"Intents":   reflect.TypeFor[contract.IntentStore](),
		"Reaper":    reflect.TypeFor[contract.ReaperSource](),
	}
	var out []string
	for v, t := range views {
		for i := range t.NumMethod() {
			out = append(out, v+"."+t.Method(i).Name)
		}
	}
	sort.Strings(out)
	return out
}

// backends are the two backends, fresh per call.
var backends = map[string]func(t *testing.T) contract.Backend{
	"memstore": func(*testing.T) contract.Backend { return memstore.New() },
	"dynamostore": func(t *testing.T) contract.Backend {
		client := dynamotest.Client(t)
		return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
	},
}

// TestEveryCallRetried proves the layer applies the policy to every single call of the
// contract, over both backends: a call failing Attempts-1 times with an infrastructure
// error is answered by its last attempt; one failing every time is made exactly Attempts
// times and answers the caller's exhaustion error; a sentinel answer is never repeated.
func TestEveryCallRetried(t *testing.T) {
	t.Parallel()
	for name, newBackend := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := storetest.NewFaultBackend(newBackend(t))
			s := store.New(f, storecall.Policy{Exhausted: errExhausted})
			ctx := contract.WithTenant(context.Background(), "t1")
			cs := calls(s)
			want := contractMethods()
			var got []string
			for m := range cs {
				got = append(got, m)
			}
			sort.Strings(got)
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("the test calls %v,\nthe contract has %v", got, want)
			}
			for _, m := range want {
				call := cs[m]
				before := f.Calls(m)
				f.Fail(m, storecall.Attempts-1)
				if err := call(ctx); errors.Is(err, storetest.ErrInjected) {
					t.Errorf("%s: failed %d times, then %v: the layer gave up early", m, storecall.Attempts-1, err)
				}
				if n := f.Calls(m) - before; n != storecall.Attempts {
					t.Errorf("%s: %d calls for %d injected failures, want %d", m, n, storecall.Attempts-1, storecall.Attempts)
				}
				before = f.Calls(m)
				f.Fail(m, storecall.Attempts+1)
				err := call(ctx)
				if !errors.Is(err, errExhausted) || !errors.Is(err, storetest.ErrInjected) {
					t.Errorf("%s: always failing answered %v, want the exhaustion error wrapping the failure", m, err)
				}
				if n := f.Calls(m) - before; n != storecall.Attempts {
					t.Errorf("%s: %d calls while always failing, want %d", m, n, storecall.Attempts)
				}
				f.Fail(m, 0)
			}
			// A sentinel is the store's answer: one call, never repeated.
			before := f.Calls("Runs.Claim")
			if _, err := s.Runs().Claim(ctx, "no-such-run", contract.Claim{Token: "c9", LeaseUntil: 1}); !errors.Is(err, contract.ErrUnknownRun) {
				t.Fatalf("claim of an unknown run: %v, want ErrUnknownRun", err)
			}
			if n := f.Calls("Runs.Claim") - before; n != 1 {
				t.Errorf("a sentinel answer was asked %d times, want 1", n)
			}
		})
	}
}

// TestWithLockNotRepeated: WithLock runs the caller's function, so the layer never repeats
// it whole; a failing function is run once.
func TestWithLockNotRepeated(t *testing.T) {
	t.Parallel()
	s := store.New(memstore.New(), storecall.Policy{})
	ctx := contract.WithTenant(context.Background(), "t1")
	runs := 0
	boom := errors.New("infrastructure")
	err := s.Locks().WithLock(ctx, "k", func(context.Context) error { runs++; return boom })
	if !errors.Is(err, boom) || runs != 1 {
		t.Fatalf("WithLock: %v after %d runs of fn, want the error after 1", err, runs)
	}
}
