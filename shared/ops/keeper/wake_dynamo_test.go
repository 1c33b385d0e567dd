package keeper_test

import (
	"context"
	"sync"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/keepertest"
)

// tenantReads is dynamostore (polled: no contract.LogWaker) with its log's reads counted per
// tenant, and a channel closed when a tenant's next read has returned.
type tenantReads struct {
	*dynamostore.Store
	mu     sync.Mutex
	reads  map[string]int
	next   map[string]chan struct{}
	target map[string]int
}

type tenantReadLog struct {
	contract.EventLog
	s *tenantReads
}

func (s *tenantReads) Log() contract.EventLog { return tenantReadLog{s.Store.Log(), s} }

func (l tenantReadLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	evs, next, closed, err := l.EventLog.Read(ctx, runID, after, limit)
	t, terr := contract.Tenant(ctx)
	if terr != nil {
		return evs, next, closed, err
	}
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.reads[t]++
	if ch := l.s.next[t]; ch != nil && l.s.reads[t] >= l.s.target[t] {
		close(ch)
		delete(l.s.next, t)
	}
	return evs, next, closed, err
}

// count returns tenant's reads so far.
func (s *tenantReads) count(tenant string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[tenant]
}

// nextRead returns a channel closed when tenant's next read has returned (its reader,
// subscribed before it read, has its empty page and is about to wait).
func (s *tenantReads) nextRead(tenant string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	s.next[tenant], s.target[tenant] = ch, s.reads[tenant]+1
	return ch
}

// TestLongPollWokenBySameProcessDynamo: on DynamoDB, which cannot wake its readers and is
// polled every ReadPollEvery, a long poll is answered by an append this keeper lands at
// once. Each reader waits exactly one poll period, in which a poller reads once (a period's
// re-read would come at its deadline, which answers without reading): so an answer with
// the event after two reads is the wake's. The negative control, the keeper's wake
// disconnected at its seam, answers nothing after one read; tenant B's waiting reader of
// its own run-1 is not woken by tenant A's append to run-1 (one read, no event).
func TestLongPollWokenBySameProcessDynamo(t *testing.T) {
	client := dynamotest.Client(t)
	setup := func(t *testing.T, wake keeper.LogWake) (*keeper.Keeper, *tenantReads) {
		s := &tenantReads{
			Store: dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)}),
			reads: map[string]int{}, next: map[string]chan struct{}{}, target: map[string]int{},
		}
		if _, ok := any(s).(contract.LogWaker); ok {
			t.Fatal("dynamostore wakes its readers: this test needs a polled backend")
		}
		k := newKeeper(t, keeper.Config{Backend: s, Wake: wake, Providers: []contract.Provider{counting.New(keepertest.ProviderName)}})
		return k, s
	}
	start := func(t *testing.T, k *keeper.Keeper, tenant string) (context.Context, contract.Cursor) {
		ctx := contract.WithTenant(t.Context(), tenant)
		res, err := k.Start(ctx, keeper.StartInput{RunID: "run-1", ThreadID: "th", Sandbox: keeper.Setup{ID: "s", Provider: keepertest.ProviderName}})
		if err != nil {
			t.Fatal(err)
		}
		return ctx, res.Driver.Cursor
	}
	// waitAppend starts a reader of one period in tenant, appends in ctxA once it reads,
	// and returns the reader's answer and its reads.
	waitAppend := func(t *testing.T, k *keeper.Keeper, s *tenantReads, ctxA context.Context, at contract.Cursor, ctxR context.Context) (keeper.ReadResult, int) {
		tenant, err := contract.Tenant(ctxR)
		if err != nil {
			t.Fatal(err)
		}
		reached, before := s.nextRead(tenant), s.count(tenant)
		ch := make(chan readAnswer, 1)
		go func() {
			res, err := k.Read(ctxR, "run-1", 0, 10, keeper.ReadPollEvery)
			ch <- readAnswer{res, err}
		}()
		<-reached
		if _, err := k.Append(ctxA, "run-1", at, []contract.Event{{Data: []byte(`"line"`)}}); err != nil {
			t.Fatal(err)
		}
		a := awaitAnswer(t, ch, "the long poll")
		return a.res, s.count(tenant) - before
	}

	t.Run("woken by the same process", func(t *testing.T) {
		k, s := setup(t, nil)
		ctx, at := start(t, k, "wake-a")
		res, reads := waitAppend(t, k, s, ctx, at, ctx)
		if len(res.Events) != 1 || reads != 2 {
			t.Fatalf("long poll answered %d events after %d reads, want 1 after 2 (woken, not polled)", len(res.Events), reads)
		}
	})
	t.Run("negative control: the keeper's wake disconnected", func(t *testing.T) {
		k, s := setup(t, deafWake{})
		ctx, at := start(t, k, "wake-a")
		res, reads := waitAppend(t, k, s, ctx, at, ctx)
		if len(res.Events) != 0 || reads != 1 {
			t.Fatalf("an unwoken long poll answered %d events after %d reads, want 0 after 1: the wake is not what delivers", len(res.Events), reads)
		}
	})
	t.Run("tenants never cross", func(t *testing.T) {
		k, s := setup(t, nil)
		ctxA, at := start(t, k, "wake-a")
		ctxB, _ := start(t, k, "wake-b") // tenant B's own run-1
		res, reads := waitAppend(t, k, s, ctxA, at, ctxB)
		if len(res.Events) != 0 || reads != 1 {
			t.Fatalf("tenant B's long poll answered %d events after %d reads, want 0 after 1 (not woken by tenant A)", len(res.Events), reads)
		}
		if page, err := k.Read(ctxA, "run-1", 0, 10, 0); err != nil || len(page.Events) != 1 {
			t.Fatalf("tenant A's log: %+v, %v", page, err)
		}
	})
}
