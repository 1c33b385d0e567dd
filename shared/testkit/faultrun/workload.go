package faultrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/push"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// ProviderName is the workload's provider in every sandbox setup.
const ProviderName = "faultrun"

// Config configures a workload run.
type Config struct {
	Seed uint64
	// Tenant every call runs under.
	Tenant string
	// Replicas are the backends the replicas drive, one per replica (each its own store
	// over its own client, so faults of one connection never touch another's).
	Replicas []contract.Backend
	// Faults, when set, has one entry per replica (nil entries: none): memstore's
	// injected failures and lost responses beneath the recorder.
	Faults []*Faults
	// Clean is a fault-free view of the same data, for the in-use check and the final
	// reads.
	Clean contract.Backend
	// Ops is how many operations the workers run between them (default 1,000).
	Ops int
	// Workers run operations concurrently (default 2 × replicas).
	Workers int
	// Threads is how many threads runs are started on (default 6).
	Threads int
	// OpTimeout bounds each operation (default 30 s).
	OpTimeout time.Duration
	// Sweep, when set, is a reaper sweep over backend b (a replica's recorded backend)
	// with provider p and the workload's clock; the workers run it now and then.
	Sweep func(ctx context.Context, b contract.Backend, p contract.Provider, now func() time.Time) error
	// Step, when set, makes the keepers' (and the sweeps') clock virtual: it advances by
	// Step per operation executed, so leases lapse and TTLs pass within a short run.
	Step time.Duration
	// DriverLease is the keepers' driver lease (default 60 s).
	DriverLease time.Duration
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
	// Push, when set, runs the push items (push.go): the replicas' keepers push what they
	// store through the deployed push, and watchers subscribe, drop and resume. Every
	// replica backend and Clean must keep push items (contract.PushStore).
	Push bool
	// PushPoster, when set, wraps the replicas' push poster (the seam a negative control
	// breaks the deliverer at); the final fault-free resume posts unwrapped.
	PushPoster func(push.Poster) push.Poster
}

// Result is what a workload run did and what its invariant checks found.
type Result struct {
	Ops       int            // operations executed
	ByAction  map[string]int // action → count
	ByOutcome map[string]int // action/outcome → count
	// Slowest is the longest operation of each action (wall clock, for the report only).
	Slowest    map[string]time.Duration
	Recorder   *Recorder
	Provider   *Provider
	Duration   time.Duration
	Violations []string
	// Dangerous paths hit: refusals of superseded drivers, take-overs, lock contention.
	Superseded, TakeOvers, Ambiguous, LockWaits int64
	Runs                                        int
	Events                                      int // events in the final logs
	Push                                        PushStats
}

// runInfo is what the workload knows of one run.
type runInfo struct {
	id, thread string
	setup      keeper.Setup

	mu        sync.Mutex
	key       string
	acked     map[int64]int64 // epoch → highest acknowledged seq
	attempted map[int64]int64 // epoch → highest attempted seq
	epochs    map[int64]bool  // epochs handed to drivers
	handed    map[string]bool // provider sandbox ids handed to the run by Start/Attach
	lastRead  []string        // the last complete read from 0
	lastAt    int64           // when it completed (recorder clock)
}

// driver is a worker's hold on a run at one epoch.
type driver struct {
	run    *runInfo
	epoch  int64
	cursor contract.Cursor
	seq    int64
	key    string
}

type workload struct {
	cfg   Config
	now   func() time.Time
	rec   *Recorder
	prov  *Provider
	reps  []*Backend
	keeps []*keeper.Keeper
	// The push items (Config.Push): the hub and each replica's routes.
	hub    *pushHub
	routes []*push.Routes

	mu         sync.Mutex
	runs       []*runInfo
	byID       map[string]*runInfo
	byAction   map[string]int
	byOutcome  map[string]int
	slowest    map[string]time.Duration
	violations []string

	done                                        atomic.Int64
	nextRun                                     atomic.Int64
	superseded, takeOvers, ambiguous, lockWaits atomic.Int64
	inSection                                   sync.Map // key → *atomic.Int64
}

// Run drives the workload of cfg to completion and checks its invariants. It fails only
// on a setup error; what the checks found is in Result.Violations.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if len(cfg.Replicas) == 0 || cfg.Clean == nil {
		return nil, errors.New("faultrun: replicas and a clean backend are required")
	}
	if cfg.Ops <= 0 {
		cfg.Ops = 1000
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2 * len(cfg.Replicas)
	}
	if cfg.Threads <= 0 {
		cfg.Threads = 6
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 30 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	ctx = contract.WithTenant(ctx, cfg.Tenant)
	w := &workload{cfg: cfg, rec: NewRecorder(), prov: NewProvider(ProviderName), byID: map[string]*runInfo{},
		byAction: map[string]int{}, byOutcome: map[string]int{}, slowest: map[string]time.Duration{}}
	w.prov.setBeforeDestroy(w.checkDestroy)
	w.now = time.Now
	if cfg.Step > 0 {
		base := time.Now()
		w.now = func() time.Time { return base.Add(time.Duration(w.done.Load()) * cfg.Step) }
	}
	for i, b := range cfg.Replicas {
		var f *Faults
		if i < len(cfg.Faults) {
			f = cfg.Faults[i]
		}
		rb := NewBackend(b, w.rec, i, f)
		rb.lockSection = w.enterSection
		kc := keeper.Config{Backend: rb, Providers: []contract.Provider{w.prov},
			DriverLease: cfg.DriverLease, Now: w.now, Logger: slog.New(slog.DiscardHandler)}
		var (
			d  *push.Deliverer
			ps contract.PushStore
		)
		if cfg.Push {
			if w.hub == nil {
				w.hub = newPushHub()
			}
			var err error
			if d, ps, err = newDeliverer(b, w.poster()); err != nil {
				return nil, err
			}
			kc.Push = d
		}
		k, err := keeper.New(kc)
		if err != nil {
			return nil, err
		}
		if cfg.Push {
			w.routes = append(w.routes, newRoutes(k, ps, d))
		}
		w.reps = append(w.reps, rb)
		w.keeps = append(w.keeps, k)
	}
	began := time.Now()
	var wg sync.WaitGroup
	for i := range cfg.Workers {
		wg.Go(func() { w.worker(ctx, i) })
	}
	wg.Wait()
	took := time.Since(began)
	w.finalChecks(ctx)
	res := &Result{Ops: int(w.done.Load()), ByAction: w.byAction, ByOutcome: w.byOutcome, Slowest: w.slowest, Recorder: w.rec,
		Provider: w.prov, Duration: took, Violations: w.violations, Superseded: w.superseded.Load(),
		TakeOvers: w.takeOvers.Load(), Ambiguous: w.ambiguous.Load(), LockWaits: w.lockWaits.Load(), Runs: len(w.runs)}
	for _, r := range w.runs {
		res.Events += len(r.lastRead)
	}
	if w.hub != nil {
		res.Push = w.hub.stats
	}
	return res, nil
}

func (w *workload) violate(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

func (w *workload) count(action, outcome string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.byAction[action]++
	w.byOutcome[action+"/"+outcome]++
}

// outcome names err for the counters.
func outcome(err error) string {
	switch c := classify(err); {
	case err == nil:
		return "ok"
	case c == errOther && errors.Is(err, keeper.ErrUnavailable):
		return "unavailable"
	case c == errOther && errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case c == errOther:
		return "error"
	default:
		if errors.Is(err, contract.ErrSandboxGone) {
			return "sandbox-gone"
		}
		return string(c)
	}
}

// enterSection counts the holders inside a lock section of key: two at once is a
// violation (every section is far shorter than a lease).
func (w *workload) enterSection(key string) func() {
	v, _ := w.inSection.LoadOrStore(key, new(atomic.Int64))
	n := v.(*atomic.Int64)
	if n.Add(1) > 1 {
		w.violate("lock %s: two holders inside the section at once", key)
	}
	return func() { n.Add(-1) }
}

func (w *workload) newRun(thread int, rng *rand.Rand) *runInfo {
	n := w.nextRun.Add(1)
	r := &runInfo{id: fmt.Sprintf("run-%04d", n), thread: fmt.Sprintf("thread-%d", thread),
		setup: keeper.Setup{ID: "setup", Provider: ProviderName, Reuse: keeper.ReuseThread},
		acked: map[int64]int64{}, attempted: map[int64]int64{}, epochs: map[int64]bool{}, handed: map[string]bool{}}
	if rng.IntN(5) == 0 {
		r.setup.Reuse = keeper.ReuseNone
	}
	w.mu.Lock()
	w.runs = append(w.runs, r)
	w.byID[r.id] = r
	w.mu.Unlock()
	return r
}

func (w *workload) anyRun(rng *rand.Rand) *runInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.runs) == 0 {
		return nil
	}
	// Favour recent runs: they are the ones still running.
	n := len(w.runs)
	lo := max(0, n-12)
	if rng.IntN(4) == 0 {
		lo = 0
	}
	return w.runs[lo+rng.IntN(n-lo)]
}

// hold registers a driver's epoch and sandbox on its run.
func (r *runInfo) hold(epoch int64, key, psid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epochs[epoch] = true
	if key != "" {
		r.key = key
	}
	if psid != "" {
		r.handed[psid] = true
	}
}

const maxDrivers = 3

// worker runs operations until the workload's budget is spent.
func (w *workload) worker(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(id)+1))
	var drivers []*driver
	drop := func(d *driver) {
		drivers = slices.DeleteFunc(drivers, func(x *driver) bool { return x == d })
	}
	for w.done.Add(1) <= int64(w.cfg.Ops) {
		rep := rng.IntN(len(w.reps))
		k := w.keeps[rep]
		octx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
		opStart := time.Now()
		roll := rng.IntN(100)
		var d *driver
		if len(drivers) > 0 {
			d = drivers[rng.IntN(len(drivers))]
		}
		switch {
		case roll < 14 || d == nil && roll < 60:
			if len(drivers) >= maxDrivers {
				w.appendOp(octx, k, d, rng, drop)
				break
			}
			if nd := w.startOp(octx, k, w.newRun(rng.IntN(w.cfg.Threads), rng), "start"); nd != nil {
				drivers = append(drivers, nd)
			}
		case roll < 18 || roll < 28:
			r := w.anyRun(rng)
			if r == nil || len(drivers) >= maxDrivers {
				w.appendOp(octx, k, d, rng, drop)
				break
			}
			var nd *driver
			if roll < 18 {
				nd = w.startOp(octx, k, r, "restart")
			} else {
				nd = w.attachOp(octx, k, r)
			}
			if nd != nil {
				drivers = append(drivers, nd)
			}
		case roll < 58 && d != nil:
			w.appendOp(octx, k, d, rng, drop)
		case roll < 65 && d != nil:
			_, err := k.Heartbeat(octx, d.run.id, d.epoch)
			w.note("heartbeat", err)
			if err != nil {
				drop(d)
			}
		case roll < 71 && d != nil:
			_, err := k.DetachWithKey(octx, d.run.id, d.epoch, d.key)
			w.note("detach", err)
			if err != nil {
				drop(d)
			}
		case roll < 79 && d != nil:
			w.finishOp(octx, k, d, rng)
			drop(d)
		case roll < 84:
			if r := w.anyRun(rng); r != nil {
				_, err := k.Cancel(octx, r.id)
				w.note("cancel", err)
			}
		case roll < 90 && w.hub != nil:
			w.watchOp(octx, rep, w.anyRun(rng), rng)
		case roll < 93:
			if r := w.anyRun(rng); r != nil {
				w.readOp(octx, k, r)
			}
		case roll < 96 || w.cfg.Sweep == nil:
			w.lockOp(octx, rep, rng)
		default:
			err := w.cfg.Sweep(octx, w.reps[rep], w.prov, w.now)
			w.note("sweep", err)
		}
		cancel()
		w.slow(opStart, roll)
		if n := w.done.Load(); n%200 == 0 {
			w.cfg.Logf("faultrun: %d ops", n)
		}
	}
}

// slow keeps the longest operation per roll band (the action a roll selects).
func (w *workload) slow(began time.Time, roll int) {
	band := fmt.Sprintf("roll<%02d", (roll/5+1)*5)
	d := time.Since(began)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.slowest[band] = max(w.slowest[band], d)
}

// note counts an action's outcome and the dangerous paths it hit.
func (w *workload) note(action string, err error) {
	switch classify(err) {
	case errSuperseded:
		w.superseded.Add(1)
	case errOther:
		w.ambiguous.Add(1)
	}
	w.count(action, outcome(err))
}

func (w *workload) startOp(ctx context.Context, k *keeper.Keeper, r *runInfo, action string) *driver {
	res, err := k.Start(ctx, keeper.StartInput{RunID: r.id, ThreadID: r.thread, Sandbox: r.setup})
	if err == nil && res.Outcome == keeper.OutcomeTakenOver {
		w.takeOvers.Add(1)
		w.count(action, "taken-over")
	} else if err == nil {
		w.count(action, string(res.Outcome))
	} else {
		w.note(action, err)
		return nil
	}
	return w.held(r, res.Driver, res.Sandbox)
}

func (w *workload) attachOp(ctx context.Context, k *keeper.Keeper, r *runInfo) *driver {
	res, err := k.Attach(ctx, r.id)
	w.note("attach", err)
	if err != nil {
		return nil
	}
	w.takeOvers.Add(1)
	return w.held(r, res.Driver, res.Sandbox)
}

// held turns a start's or attach's answer into a driver, checking what it promised.
func (w *workload) held(r *runInfo, d keeper.Driver, sb keeper.Sandbox) *driver {
	if d.Cursor.Epoch != d.Epoch {
		w.violate("run %s: driver epoch %d handed a cursor of epoch %d", r.id, d.Epoch, d.Cursor.Epoch)
	}
	r.mu.Lock()
	dup := r.epochs[d.Epoch]
	r.mu.Unlock()
	if dup {
		w.violate("run %s: epoch %d handed to two drivers", r.id, d.Epoch)
	}
	r.hold(d.Epoch, sb.Key, sb.ProviderSandboxID)
	return &driver{run: r, epoch: d.Epoch, cursor: d.Cursor, key: sb.Key}
}

func (w *workload) appendOp(ctx context.Context, k *keeper.Keeper, d *driver, rng *rand.Rand, drop func(*driver)) {
	if d == nil {
		w.readOp(ctx, k, w.anyRun(rng))
		return
	}
	n := 1 + rng.IntN(3)
	evs := make([]contract.Event, n)
	for i := range evs {
		seq := d.seq + int64(i) + 1
		data, _ := json.Marshal(eventData{Run: d.run.id, Epoch: d.epoch, Seq: seq})
		evs[i] = contract.Event{Src: d.epoch<<20 | seq, Data: data}
	}
	d.run.mu.Lock()
	d.run.attempted[d.epoch] = d.seq + int64(n)
	d.run.mu.Unlock()
	var (
		res contract.AppendResult
		err error
	)
	// An ambiguous append is repeated with the same cursor and batch: it must store once.
	for try := 0; try < 3; try++ {
		res, err = k.Append(ctx, d.run.id, d.cursor, evs)
		if classify(err) != errOther || ctx.Err() != nil {
			break
		}
	}
	w.note("append", err)
	if err != nil {
		drop(d)
		return
	}
	if res.Cursor.Epoch != d.epoch || res.Cursor.Next < d.cursor.Next+int64(n) {
		w.violate("run %s epoch %d: append at %+v answered cursor %+v for %d events", d.run.id, d.epoch, d.cursor, res.Cursor, n)
	}
	d.cursor = res.Cursor
	d.seq += int64(n)
	d.run.mu.Lock()
	d.run.acked[d.epoch] = d.seq
	d.run.mu.Unlock()
}

func (w *workload) finishOp(ctx context.Context, k *keeper.Keeper, d *driver, rng *rand.Rand) {
	in := keeper.FinishInput{Status: contract.StatusCompleted}
	switch rng.IntN(5) {
	case 0:
		in = keeper.FinishInput{Status: contract.StatusFailed, Error: &contract.RunError{Message: "boom", Code: "x"}}
	case 1:
		in.Status = contract.StatusInterrupted
	}
	_, err := k.Finish(ctx, d.run.id, d.cursor, in)
	w.note("finish", err)
}

// readOp reads a run's whole log from 0 page by page, checking as it goes that offsets
// increase, and that a read never loses or reorders what an earlier complete read saw.
func (w *workload) readOp(ctx context.Context, k *keeper.Keeper, r *runInfo) {
	if r == nil {
		w.count("read", "no-run")
		return
	}
	start := w.rec.now()
	var ids []string
	after := int64(0)
	for page := 0; page < 50; page++ {
		res, err := k.Read(ctx, r.id, after, 40, 0)
		if err != nil {
			w.note("read", err)
			return
		}
		for _, e := range res.Events {
			if e.Offset <= after {
				w.violate("run %s: read after %d returned offset %d", r.id, after, e.Offset)
			}
			after = e.Offset
			ids = append(ids, strings.TrimSuffix(encodeEvents([]contract.Event{e}), ";"))
		}
		if res.Next < after {
			w.violate("run %s: read next %d precedes offset %d it returned", r.id, res.Next, after)
		}
		after = max(after, res.Next)
		if res.Closed || len(res.Events) == 0 {
			break
		}
	}
	w.count("read", "ok")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastAt != 0 && r.lastAt < start && !isPrefix(r.lastRead, ids) {
		w.violate("run %s: a read (%v) is not an extension of an earlier complete read (%v)", r.id, ids, r.lastRead)
	}
	if len(ids) >= len(r.lastRead) {
		r.lastRead, r.lastAt = ids, w.rec.now()
	}
}

func isPrefix(a, b []string) bool { return len(a) <= len(b) && slices.Equal(a, b[:len(a)]) }

// lockOp runs a short lock section on one of a few keys, reading a run inside so the
// section spans real store calls.
func (w *workload) lockOp(ctx context.Context, rep int, rng *rand.Rand) {
	key := fmt.Sprintf("section:%d", rng.IntN(3))
	b := w.reps[rep]
	r := w.anyRun(rng)
	began := time.Now()
	err := b.Locks().WithLock(ctx, key, func(lctx context.Context) error {
		if time.Since(began) > 5*time.Millisecond {
			w.lockWaits.Add(1)
		}
		if r != nil {
			_, err := b.inner.Runs().State(lctx, r.id)
			return err
		}
		return nil
	})
	w.note("lock", err)
}

// checkDestroy runs before every provider Destroy: a run the id was handed to that is
// not terminal right now is still using it.
func (w *workload) checkDestroy(ctx context.Context, id string) {
	w.mu.Lock()
	runs := slices.Clone(w.runs)
	w.mu.Unlock()
	ctx = contract.WithTenant(context.WithoutCancel(ctx), w.cfg.Tenant)
	for _, r := range runs {
		r.mu.Lock()
		handed := r.handed[id]
		r.mu.Unlock()
		if !handed {
			continue
		}
		st, err := w.cfg.Clean.Runs().State(ctx, r.id)
		if err != nil {
			w.violate("destroy %s: cannot read run %s: %v", id, r.id, err)
			continue
		}
		if st != nil && !st.Status.Terminal() {
			w.violate("destroy %s while run %s (status %s, epoch %d) uses it", id, r.id, st.Status, st.Epoch())
		}
	}
}

// finalChecks reads everything back through the clean backend and checks the invariants.
func (w *workload) finalChecks(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	clean := w.cfg.Clean
	logs, closedLogs := map[string][]string{}, map[string]bool{}
	for _, r := range w.runs {
		st, err := clean.Runs().State(ctx, r.id)
		if err != nil {
			w.violate("run %s: final state: %v", r.id, err)
			continue
		}
		ids, closed, err := readAll(ctx, clean.Log(), r.id)
		if err != nil {
			w.violate("run %s: final read: %v", r.id, err)
			continue
		}
		r.lastRead = ids
		logs[r.id], closedLogs[r.id] = ids, closed
		w.checkLog(r, st, ids, closed)
	}
	if w.hub != nil {
		w.checkPush(ctx, logs, closedLogs)
	}
	w.checkSandboxes(ctx)
	w.checkEpochs()
	w.checkFences()
	if dumpHook != nil {
		dumpHook(w.rec.Ops(), w.violations)
	}
}

// readAll reads a run's whole log from 0.
func readAll(ctx context.Context, log contract.EventLog, runID string) (ids []string, closed bool, err error) {
	after := int64(0)
	for {
		evs, next, cl, err := log.Read(ctx, runID, after, 100)
		if err != nil {
			return nil, false, err
		}
		for _, e := range evs {
			if e.Offset <= after {
				return nil, false, fmt.Errorf("offset %d after %d", e.Offset, after)
			}
			after = e.Offset
			ids = append(ids, strings.TrimSuffix(encodeEvents([]contract.Event{e}), ";"))
		}
		after = max(after, next)
		if cl || len(evs) == 0 {
			return ids, cl, nil
		}
	}
}

// checkLog checks one run's final log: no duplicate, no foreign event, epochs never go
// down, each epoch's events are 1..m in order with every acknowledged one present and
// nothing past what was attempted; a closed log belongs to a terminal run.
func (w *workload) checkLog(r *runInfo, st *contract.RunState, ids []string, closed bool) {
	seen := map[string]bool{}
	last := map[int64]int64{}
	var prevEpoch int64
	for i, id := range ids {
		var e, s int64
		if _, err := fmt.Sscanf(id, "%d.%d", &e, &s); err != nil {
			w.violate("run %s: event %d is not the workload's: %q", r.id, i, id)
			continue
		}
		if seen[id] {
			w.violate("run %s: event %s stored twice", r.id, id)
		}
		seen[id] = true
		if e < prevEpoch {
			w.violate("run %s: event %s of epoch %d after an event of epoch %d", r.id, id, e, prevEpoch)
		}
		prevEpoch = max(prevEpoch, e)
		if s != last[e]+1 {
			w.violate("run %s: event %s follows seq %d of its epoch (lost or reordered)", r.id, id, last[e])
		}
		last[e] = max(last[e], s)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for e, a := range r.acked {
		if last[e] < a {
			w.violate("run %s epoch %d: acknowledged seq %d but the log holds up to %d (lost)", r.id, e, a, last[e])
		}
	}
	for e, m := range last {
		if m > r.attempted[e] {
			w.violate("run %s epoch %d: log holds seq %d never attempted (max %d)", r.id, e, m, r.attempted[e])
		}
		if !r.epochs[e] && r.attempted[e] == 0 {
			w.violate("run %s: events of epoch %d no driver held", r.id, e)
		}
	}
	if closed && (st == nil || !st.Status.Terminal()) {
		w.violate("run %s: log closed but the run is not terminal (%+v)", r.id, st)
	}
}

// checkSandboxes checks one sandbox per key: every live provider sandbox is the one its
// key's row names, or is tracked by the key's open intent (its creator's crash is
// recovered from the intent); a row never names a destroyed sandbox unless tombstoned.
func (w *workload) checkSandboxes(ctx context.Context) {
	clean := w.cfg.Clean
	liveByKey := map[string][]string{}
	for _, id := range w.prov.Live() {
		liveByKey[w.prov.KeyOf(id)] = append(liveByKey[w.prov.KeyOf(id)], id)
	}
	keys := w.prov.Keys()
	sort.Strings(keys)
	for _, key := range keys {
		row, err := clean.Instances().GetRow(ctx, key)
		if err != nil {
			w.violate("key %s: read row: %v", key, err)
			continue
		}
		in, err := clean.Intents().Get(ctx, key)
		if err != nil {
			w.violate("key %s: read intent: %v", key, err)
			continue
		}
		if row != nil && row.Reclaiming == "" && !w.prov.Alive(row.ProviderSandboxID) {
			w.violate("key %s: row names %s, which was destroyed", key, row.ProviderSandboxID)
		}
		for _, id := range liveByKey[key] {
			switch {
			case row != nil && row.ProviderSandboxID == id:
			case in != nil && (in.ProviderSandboxID == id || in.ProviderSandboxID == ""):
			default:
				w.violate("key %s: sandbox %s is alive but no row or intent names it (duplicate/orphan; row %+v, intent %+v)", key, id, row, in)
			}
		}
	}
}

// checkEpochs checks the epochs successful claims and creates returned: distinct per run,
// and increasing in real time (a claim that began after another ended got a higher one).
func (w *workload) checkEpochs() {
	type claim struct {
		call, ret, epoch int64
		create           bool
	}
	by := map[string][]claim{}
	for _, op := range w.rec.Ops() {
		if op.Kind != KindRun {
			continue
		}
		in, out := op.Input.(RunInput), op.Output.(RunOutput)
		if out.Err != errNone || !(in.Op == runClaim || in.Op == runCreate && out.Created) {
			continue
		}
		epoch := out.View.Epoch
		if in.Op == runCreate {
			// A create hands out epoch 1; a retried create recognising its token after a
			// claim answers the record as it is now, whose epoch the creator does not hold.
			epoch = 1
		}
		by[op.Key] = append(by[op.Key], claim{op.Call, op.Ret, epoch, in.Op == runCreate})
	}
	for key, cs := range by {
		owner := map[int64]int{}
		for i, c := range cs {
			for j, d := range cs {
				// A create is left out: a retried create recognising its own landed attempt
				// answers late, after claims that followed the attempt.
				if i != j && !c.create && !d.create && c.ret < d.call && c.epoch >= d.epoch {
					w.violate("run %s: a claim ending at %d got epoch %d, a later one %d", key, c.ret, c.epoch, d.epoch)
				}
			}
			owner[c.epoch]++
		}
		// Every successful claim or create is one caller's: a retry that recognised its own
		// landed attempt is the same call, so two answers with one epoch are two owners.
		for e, n := range owner {
			if n > 1 {
				w.violate("run %s: epoch %d handed out by %d successful claims", key, e, n)
			}
		}
	}
}

// dumpHook is set by this package's tests to print histories.
var dumpHook func([]Op, []string)

// checkFences checks fencing in real time: once a claim (or a log fence) of epoch e' has
// returned, no write or append of a lower epoch that began afterwards may succeed.
func (w *workload) checkFences() {
	type fence struct{ ret, epoch int64 }
	byClaim, byFence := map[string][]fence{}, map[string][]fence{}
	// firstTry is when each batch was first attempted: a retry recognising its own landed
	// attempt succeeds after a fence that followed the attempt, and rightly so.
	firstTry := map[string]int64{}
	ops := w.rec.Ops()
	for _, op := range ops {
		if in, ok := op.Input.(LogInput); ok && in.Op == logAppend {
			k := op.Key + "|" + in.Batch
			if t, seen := firstTry[k]; !seen || op.Call < t {
				firstTry[k] = op.Call
			}
		}
		switch in := op.Input.(type) {
		case RunInput:
			if out := op.Output.(RunOutput); out.Err == errNone && in.Op == runClaim {
				byClaim[op.Key] = append(byClaim[op.Key], fence{op.Ret, out.View.Epoch})
			}
		case LogInput:
			if out := op.Output.(LogOutput); out.Err == errNone && in.Op == logFence {
				byFence[op.Key] = append(byFence[op.Key], fence{op.Ret, in.Epoch})
			}
		}
	}
	for _, op := range ops {
		switch in := op.Input.(type) {
		case RunInput:
			switch in.Op {
			case runUpdate, runRecord, runHeartbeat, runDetach:
			default:
				continue
			}
			if op.Output.(RunOutput).Err != errNone {
				continue
			}
			for _, f := range byClaim[op.Key] {
				if f.ret < op.Call && f.epoch > in.Epoch {
					w.violate("run %s: %s at epoch %d succeeded after epoch %d was claimed", op.Key, in.Op, in.Epoch, f.epoch)
					break
				}
			}
		case LogInput:
			if in.Op != logAppend || op.Output.(LogOutput).Err != errNone {
				continue
			}
			for _, f := range byFence[op.Key] {
				if f.ret < firstTry[op.Key+"|"+in.Batch] && f.epoch > in.Epoch {
					w.violate("run %s: append at epoch %d succeeded after epoch %d fenced the log", op.Key, in.Epoch, f.epoch)
					break
				}
			}
		}
	}
}
