package testkit

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// The negative controls of the lock and event-log suites: each case runs against a store
// broken in the one way it exists to catch, and must fail; against the correct version of
// the same toy it must pass (so a failure is the defect's, not the toy's).

// lkRecorder is an lkT that records instead of reporting; Fatalf and Skipf end the case's
// goroutine as testing.T does.
type lkRecorder struct {
	ctx     context.Context
	mu      sync.Mutex
	failed  bool
	skipped bool
	msgs    []string
}

func (r *lkRecorder) Helper()                  {}
func (r *lkRecorder) Context() context.Context { return r.ctx }

func (r *lkRecorder) Logf(format string, args ...any) { r.add(false, format, args...) }

func (r *lkRecorder) Errorf(format string, args ...any) { r.add(true, format, args...) }

func (r *lkRecorder) Fatalf(format string, args ...any) {
	r.add(true, format, args...)
	runtime.Goexit()
}

func (r *lkRecorder) Skipf(format string, args ...any) {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	r.add(false, "SKIP: "+format, args...)
	runtime.Goexit()
}

func (r *lkRecorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *lkRecorder) add(fail bool, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = r.failed || fail
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

// lkRecord runs one case body against b on its own goroutine and returns what it reported.
func lkRecord(t *testing.T, run func(lkT, contract.Backend), b contract.Backend) *lkRecorder {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel() // lets go of anything a failed case left waiting
	r := &lkRecorder{ctx: ctx}
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(r, b)
	}()
	<-done
	return r
}

// lkToyLocks is a small lease lock store in the shape of docs/design.md §2.3, with switchable defects.
type lkToyLocks struct {
	timing       contract.LockTiming
	noExclusion  bool // acquire ignores the holder
	releaseAny   bool // release frees the key whoever holds it
	mu           sync.Mutex
	items        map[string]*lkToyLease
	stalls       map[string]int
	ownerCounter int
}

type lkToyLease struct {
	owner   int // 0 = free
	expires time.Time
	fence   int64
}

func newToyLocks(timing contract.LockTiming) *lkToyLocks {
	return &lkToyLocks{timing: timing.WithDefaults(), items: map[string]*lkToyLease{}, stalls: map[string]int{}}
}

func (l *lkToyLocks) WithLock(ctx context.Context, key string, fn func(context.Context) error) error {
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return err
	}
	key = tenant + "#" + key
	l.mu.Lock()
	l.ownerCounter++
	owner := l.ownerCounter
	l.mu.Unlock()
	var fence int64
	var sent time.Time
	for {
		sent = time.Now()
		l.mu.Lock()
		it := l.items[key]
		if it == nil {
			it = &lkToyLease{}
			l.items[key] = it
		}
		if l.noExclusion || it.owner == 0 || sent.After(it.expires.Add(l.timing.Skew)) {
			it.owner, it.expires = owner, sent.Add(l.timing.Lease)
			it.fence++
			fence = it.fence
		}
		l.mu.Unlock()
		if fence > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("toy lock %q: %w", key, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	lctx, cancel := context.WithCancelCause(ctx)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		deadline := time.NewTimer(time.Until(sent.Add(l.timing.Lease - l.timing.Skew)))
		defer deadline.Stop()
		renew := time.NewTicker(l.timing.Renew)
		defer renew.Stop()
		for {
			select {
			case <-done:
				return
			case <-deadline.C:
				cancel(contract.ErrLeaseLost)
				return
			case <-renew.C:
				at := time.Now()
				l.mu.Lock()
				stalled, mine := l.stalls[strings.SplitN(key, "#", 2)[1]] > 0, l.items[key].owner == owner
				if !stalled && mine {
					l.items[key].expires = at.Add(l.timing.Lease)
				}
				l.mu.Unlock()
				if !stalled && mine {
					deadline.Reset(time.Until(at.Add(l.timing.Lease - l.timing.Skew)))
				}
			}
		}
	}()
	defer func() {
		close(done)
		<-stopped
		cancel(nil)
		l.mu.Lock()
		if it := l.items[key]; l.releaseAny || it.owner == owner {
			it.owner = 0
		}
		l.mu.Unlock()
	}()
	return fn(contract.WithLeaseFence(lctx, fence))
}

func (l *lkToyLocks) StallRenewals(key string) func() {
	l.mu.Lock()
	l.stalls[key]++
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.stalls[key]--
			l.mu.Unlock()
		})
	}
}

// lkSwapped is a memstore backend with its lock store or event log replaced.
type lkSwapped struct {
	contract.Backend
	locks contract.LockStore
	log   contract.EventLog
}

func (b lkSwapped) Locks() contract.LockStore {
	if b.locks != nil {
		return b.locks
	}
	return b.Backend.Locks()
}

func (b lkSwapped) Log() contract.EventLog {
	if b.log != nil {
		return b.log
	}
	return b.Backend.Log()
}

func lkCaseByName(cases []lkCase, name string) lkCase {
	for _, c := range cases {
		if c.name == name {
			return c
		}
	}
	panic("no case " + name)
}

func TestLockSuiteNegativeControls(t *testing.T) {
	for _, tc := range []struct {
		name        string
		noExclusion bool
		releaseAny  bool
		cases       []string
		wantFail    bool
	}{
		{"correct toy passes", false, false, []string{"NoOverlapUnderContention", "StalledHolderLosesLease", "StaleReleaseIsNoOp", "DeadlineBoundsWait", "FenceStrictlyIncreases"}, false},
		{"no exclusion", true, false, []string{"NoOverlapUnderContention", "StaleReleaseIsNoOp", "DeadlineBoundsWait"}, true},
		{"release by non-owner", false, true, []string{"StaleReleaseIsNoOp"}, true},
	} {
		for _, name := range tc.cases {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				c := lkCaseByName(lkCases(), name)
				toy := newToyLocks(c.opts.Lock)
				toy.noExclusion, toy.releaseAny = tc.noExclusion, tc.releaseAny
				r := lkRecord(t, c.run, lkSwapped{Backend: memstore.New(), locks: toy})
				if r.skipped || r.failed != tc.wantFail {
					t.Errorf("case %s: failed = %v, skipped = %v; want failed = %v. It reported:\n%s",
						name, r.failed, r.skipped, tc.wantFail, strings.Join(r.msgs, "\n"))
				}
			})
		}
	}
}

// evNaiveLog is an event log with none of the fences: it appends every valid batch at the
// tail whatever the cursor, and never stores a cancel marker.
type evNaiveLog struct {
	mu   sync.Mutex
	logs map[string]*evNaive
}

type evNaive struct {
	events []contract.Event
	closed bool
	src    int64
}

// toyKey is id's key under ctx's tenant; a context without a tenant (refused by every
// real store) gets a key no tenant has.
func toyKey(ctx context.Context, id string) string {
	t, err := contract.Tenant(ctx)
	if err != nil {
		return "!#" + id
	}
	return t + "#" + id
}

func (l *evNaiveLog) get(ctx context.Context, runID string) *evNaive {
	k := toyKey(ctx, runID)
	if l.logs[k] == nil {
		l.logs[k] = &evNaive{}
	}
	return l.logs[k]
}

func (l *evNaiveLog) Append(ctx context.Context, runID string, at contract.Cursor, events []contract.Event) (contract.AppendResult, error) {
	if err := contract.CheckEvents(events); err != nil {
		return contract.AppendResult{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.get(ctx, runID)
	if g.closed {
		return contract.AppendResult{}, contract.ErrLogClosed
	}
	for _, e := range events {
		e.Offset = int64(len(g.events)) + 1
		g.events = append(g.events, e)
	}
	g.src = contract.MaxSrc(g.src, events)
	last := int64(len(g.events))
	return contract.AppendResult{Cursor: contract.Cursor{Epoch: at.Epoch, Next: last + 1, Src: g.src}, Last: last, Src: g.src}, nil
}

func (l *evNaiveLog) Fence(ctx context.Context, runID string, epoch int64) (contract.AppendResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.get(ctx, runID)
	last := int64(len(g.events))
	return contract.AppendResult{Cursor: contract.Cursor{Epoch: epoch, Next: last + 1, Src: g.src}, Last: last, Src: g.src}, nil
}

func (l *evNaiveLog) Read(ctx context.Context, runID string, after int64, limit int) ([]contract.Event, int64, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.get(ctx, runID)
	end := min(int64(len(g.events)), after+int64(max(limit, 1)))
	if after >= end {
		return nil, after, g.closed, nil
	}
	out := append([]contract.Event(nil), g.events[after:end]...)
	return out, end, g.closed && end == int64(len(g.events)), nil
}

func (l *evNaiveLog) Close(ctx context.Context, runID string, at contract.Cursor) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.get(ctx, runID).closed = true
	return nil
}

func (l *evNaiveLog) MarkCancel(context.Context, string) error { return nil }

func (l *evNaiveLog) MarkWatch(context.Context, string) error { return nil }

func TestEventLogSuiteNegativeControls(t *testing.T) {
	for _, name := range []string{
		"SupersededAfterHigherFence", "AmbiguousRetryStoresOnce", "ConflictingBatchAtSameCursor",
		"CancelMarkerSeenInBand", "SupersededCloseChangesNothing",
		"RaceFenceAgainstAppender", "RaceSameCursor", "RaceCancelAgainstAppender", "RaceCloseAgainstFence",
		"RaceWatchAgainstAppender", "WatchMarkerOccupiesOneOffset",
	} {
		t.Run(name, func(t *testing.T) {
			c := lkCaseByName(evCases(), name)
			r := lkRecord(t, c.run, lkSwapped{Backend: memstore.New(), log: &evNaiveLog{logs: map[string]*evNaive{}}})
			if !r.failed || r.skipped {
				t.Errorf("case %s passed against a log without fences; it reported:\n%s", name, strings.Join(r.msgs, "\n"))
			}
		})
	}
}
