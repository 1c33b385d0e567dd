package keeper_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// guard bounds every wait on a signal in these tests; reaching it means a hang.
const guard = 20 * time.Second

// readCounter is an EventLog counting Reads and calling onRead (if set) before each.
type readCounter struct {
	contract.EventLog
	reads  *atomic.Int64
	onRead func(n int64)
}

// Read counts the read, and calls onRead once it returned: a test told "the first read
// happened" then writes after it, never into it (an append racing the read's query would
// be seen without any wake).
func (l readCounter) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	n := l.reads.Add(1)
	evs, next, closed, err := l.EventLog.Read(ctx, runID, after, limit)
	if l.onRead != nil {
		l.onRead(n)
	}
	return evs, next, closed, err
}

// wakingStore is memstore (so a contract.LogWaker) with its log's reads counted.
type wakingStore struct {
	*memstore.Store
	reads  atomic.Int64
	onRead atomic.Pointer[func(int64)]
}

func (s *wakingStore) Log() contract.EventLog {
	return readCounter{EventLog: s.Store.Log(), reads: &s.reads, onRead: func(n int64) {
		if f := s.onRead.Load(); f != nil {
			(*f)(n)
		}
	}}
}

// hook makes fn run before every later read (with the read's number); nil removes it.
func (s *wakingStore) hook(fn func(int64)) {
	if fn == nil {
		s.onRead.Store(nil)
		return
	}
	s.onRead.Store(&fn)
}

// deafStore is a deliberately broken waker (the negative control): it never wakes.
type deafStore struct{ *wakingStore }

func (deafStore) LogChanged(context.Context, string) (<-chan struct{}, func(), error) {
	return make(chan struct{}), func() {}, nil
}

// deafWake is a keeper wake disconnected at its seam (a negative control): it never wakes.
type deafWake struct{}

func (deafWake) Wait(keeper.RunKey) (<-chan struct{}, func()) { return make(chan struct{}), func() {} }
func (deafWake) Wake(keeper.RunKey)                           {}

func newWakeKeeper(t *testing.T, b contract.Backend) (*keeper.Keeper, context.Context, contract.Cursor) {
	return newWakeKeeperWith(t, b, nil)
}

// newWakeKeeperWith is newWakeKeeper with the keeper's own wake (nil: the default).
func newWakeKeeperWith(t *testing.T, b contract.Backend, wake keeper.LogWake) (*keeper.Keeper, context.Context, contract.Cursor) {
	t.Helper()
	k := newKeeper(t, keeper.Config{Backend: b, Wake: wake, Providers: []contract.Provider{counting.New(keepertest.ProviderName)}})
	ctx := contract.WithTenant(t.Context(), "wake")
	res, err := k.Start(ctx, keeper.StartInput{RunID: "run-1", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}})
	if err != nil {
		t.Fatal(err)
	}
	return k, ctx, res.Driver.Cursor
}

// longPoll runs k.Read in the background and returns the channel of its answer.
func longPoll(ctx context.Context, k *keeper.Keeper, after int64, wait time.Duration) <-chan readAnswer {
	ch := make(chan readAnswer, 1)
	go func() {
		res, err := k.Read(ctx, "run-1", after, 10, wait)
		ch <- readAnswer{res, err}
	}()
	return ch
}

type readAnswer struct {
	res keeper.ReadResult
	err error
}

func awaitAnswer(t *testing.T, ch <-chan readAnswer, what string) readAnswer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a
	case <-time.After(guard):
		t.Fatalf("%s: no answer within %v", what, guard)
	}
	return readAnswer{}
}

// firstRead returns a channel closed when the log's next read begins (the reader is then
// subscribed: the keeper subscribes before it reads).
func firstRead(s *wakingStore) <-chan struct{} {
	reached := make(chan struct{})
	base := s.reads.Load()
	s.hook(func(n int64) {
		if n == base+1 {
			close(reached)
		}
	})
	return reached
}

// TestLongPollWokenNotPolled: on a backend that wakes its readers (memstore), a waiting
// reader never polls — an idle wait costs exactly one read — and an append, or the run
// turning terminal, wakes it at once (the in-process wake). The negative control,
// a waker that never fires, delivers nothing before the deadline.
func TestLongPollWokenNotPolled(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		s := &wakingStore{Store: memstore.New()}
		k, ctx, _ := newWakeKeeper(t, s)
		before := s.reads.Load()
		res, err := k.Read(ctx, "run-1", 0, 10, 1500*time.Millisecond) // a poller reads 3 times
		if err != nil || len(res.Events) != 0 || res.Closed {
			t.Fatalf("idle long poll: %+v, %v", res, err)
		}
		if n := s.reads.Load() - before; n != 1 {
			t.Fatalf("an idle long poll read the log %d times, want 1 (no polling)", n)
		}
	})
	t.Run("append", func(t *testing.T) {
		s := &wakingStore{Store: memstore.New()}
		k, ctx, at := newWakeKeeper(t, s)
		reached := firstRead(s)
		before := s.reads.Load()
		ch := longPoll(ctx, k, 0, time.Minute)
		<-reached
		if _, err := k.Append(ctx, "run-1", at, []contract.Event{{Data: []byte(`"late"`)}}); err != nil {
			t.Fatal(err)
		}
		a := awaitAnswer(t, ch, "the woken long poll")
		if len(a.res.Events) != 1 || s.reads.Load()-before != 2 {
			t.Fatalf("woken long poll: %d events after %d reads, want 1 after 2", len(a.res.Events), s.reads.Load()-before)
		}
	})
	t.Run("terminal without a close", func(t *testing.T) {
		s := &wakingStore{Store: memstore.New()}
		k, ctx, at := newWakeKeeper(t, s)
		reached := firstRead(s)
		ch := longPoll(ctx, k, 0, time.Minute)
		<-reached
		// The terminal write of a finish whose close never came: the woken reader closes it.
		if _, err := s.Runs().UpdateFenced(ctx, "run-1", at.Epoch, contract.RunPatch{
			Status: contract.Set(contract.StatusCompleted), FinishedAt: contract.Set(time.Now().UnixMilli())}); err != nil {
			t.Fatal(err)
		}
		if a := awaitAnswer(t, ch, "the long poll of a run turned terminal"); !a.res.Closed {
			t.Fatalf("the woken reader's page is not closed: %+v", a.res)
		}
	})
	t.Run("negative control: a waker that never fires", func(t *testing.T) {
		s := deafStore{&wakingStore{Store: memstore.New()}}
		k, ctx, at := newWakeKeeperWith(t, s, deafWake{}) // the keeper's own wake too
		reached := firstRead(s.wakingStore)
		ch := longPoll(ctx, k, 0, 300*time.Millisecond)
		<-reached
		if _, err := k.Append(ctx, "run-1", at, []contract.Event{{Data: []byte(`"late"`)}}); err != nil {
			t.Fatal(err)
		}
		if a := awaitAnswer(t, ch, "the unwoken long poll"); len(a.res.Events) != 0 {
			t.Fatalf("a reader nobody woke got %d events: the wake is not what delivers", len(a.res.Events))
		}
	})
}

// TestDrainWakesLongPolls: Drain ends a waiting long poll at once with the (empty) page it
// has, on a waking backend and on a polled one, and later long polls answer at once.
func TestDrainWakesLongPolls(t *testing.T) {
	for name, polled := range map[string]bool{"woken": false, "polled": true} {
		t.Run(name, func(t *testing.T) {
			s := &wakingStore{Store: memstore.New()}
			var b contract.Backend = s
			if polled {
				b = storetest.NewFaultBackend(s) // not a LogWaker: the keeper polls it
			}
			k, ctx, _ := newWakeKeeper(t, b)
			reached := firstRead(s)
			ch := longPoll(ctx, k, 0, time.Minute)
			<-reached
			k.Drain()
			if a := awaitAnswer(t, ch, "the drained long poll"); len(a.res.Events) != 0 || a.res.Closed {
				t.Fatalf("drained long poll answered %+v", a.res)
			}
			before := s.reads.Load()
			if a := awaitAnswer(t, longPoll(ctx, k, 0, time.Minute), "a long poll after Drain"); len(a.res.Events) != 0 {
				t.Fatalf("long poll after Drain answered %+v", a.res)
			}
			if n := s.reads.Load() - before; n != 1 {
				t.Fatalf("a long poll after Drain read %d times, want 1", n)
			}
		})
	}
}
