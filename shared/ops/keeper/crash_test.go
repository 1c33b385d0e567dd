package keeper_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// The SIGKILL crash proof of docs/design.md §12 (intents and conditional row writes: no
// crash leaves a sandbox nobody knows about): a lock holder in a separate process (this test binary
// re-executed in child mode) is killed with SIGKILL in the middle of a create, and the
// parent proves the lock comes free within lease + skew (+ one backoff step), the intent
// is resolved without a second create, and a reaper sweep leaves no orphan on disk.

// crashEnv carries the child's instructions (JSON in this variable selects child mode).
const crashEnv = "SANDKEEP_CRASH_CHILD"

// crashPoint is the line the child prints when it is parked at its crash point.
const crashPoint = "SANDKEEP-CRASH-POINT"

// Short lock timing so the test waits seconds, not the production 15 s.
var crashLock = contract.LockTiming{Lease: 2 * time.Second, Renew: 500 * time.Millisecond, Skew: 250 * time.Millisecond}

// crashChild is what the child does: start RunID on Thread and park at Point.
type crashChild struct {
	Endpoint, Table, Dir, Tenant string
	RunID, Thread                string
	// Point: "row" parks at the instance row write (the sandbox is created and its id
	// recorded on the intent); "record" parks after the create, before the id is recorded.
	Point string
}

func crashSetup() keeper.Setup {
	return keeper.Setup{ID: "default", Provider: "local-process", Workspace: json.RawMessage(`{"repo":"crash"}`)}
}

func crashStore(client *dynamodb.Client, table string) *dynamostore.Store {
	return dynamostore.New(dynamostore.Config{Client: client, Table: table, Lock: crashLock})
}

// TestCrashChild is the child process's body; it is skipped unless the parent set
// crashEnv. It never returns normally: it parks at its crash point until killed.
func TestCrashChild(t *testing.T) {
	raw := os.Getenv(crashEnv)
	if raw == "" {
		t.Skip("child mode of TestCrashSIGKILL; runs only when re-executed by it")
	}
	var c crashChild
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatal(err)
	}
	fb := storetest.NewFaultBackend(crashStore(dynamotest.NewClient(c.Endpoint), c.Table))
	method := map[string]string{"row": "Instances.CreateRow", "record": "Intents.Record"}[c.Point]
	fb.Hook(method, func(ctx context.Context, call int) {
		// Parked while the lock's renewals go on; the parent's SIGKILL ends the process.
		// A parent that died without killing us must not leave us behind forever.
		fmt.Fprintln(os.Stdout, crashPoint, c.Point)
		_ = os.Stdout.Sync()
		time.Sleep(2 * time.Minute)
		os.Exit(3)
	})
	k := newKeeper(t, keeper.Config{Backend: fb, Providers: []contract.Provider{localprocess.New(c.Dir)},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := contract.WithTenant(context.Background(), c.Tenant)
	_, err := k.Start(ctx, keeper.StartInput{RunID: c.RunID, ThreadID: c.Thread, Sandbox: crashSetup()})
	t.Fatalf("the child's start returned (%v) instead of parking at %s", err, method)
}

// countingLocal counts creates and restores of the local-process provider (every other
// capability is the embedded provider's).
type countingLocal struct {
	*localprocess.Provider
	creates atomic.Int32
}

func (p *countingLocal) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	p.creates.Add(1)
	return p.Provider.Create(ctx, in)
}

func (p *countingLocal) Restore(ctx context.Context, in contract.CreateInput) (string, error) {
	p.creates.Add(1)
	return p.Provider.Restore(ctx, in)
}

// timedBackend is the store with a lock view that stamps when fn first runs per key.
type timedBackend struct {
	*dynamostore.Store
	mu      sync.Mutex
	entered map[string]time.Time
}

func (b *timedBackend) Locks() contract.LockStore { return timedLocks{b} }

func (b *timedBackend) enteredAt(key string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	at, ok := b.entered[key]
	return at, ok
}

type timedLocks struct{ b *timedBackend }

func (l timedLocks) WithLock(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	return l.b.Store.Locks().WithLock(ctx, key, func(lctx context.Context) error {
		l.b.mu.Lock()
		if _, ok := l.b.entered[key]; !ok {
			l.b.entered[key] = time.Now()
		}
		l.b.mu.Unlock()
		return fn(lctx)
	})
}

// blindBackend hides every open intent from its reader: the negative control's keeper.
type blindBackend struct{ *dynamostore.Store }

func (b blindBackend) Intents() contract.IntentStore { return blindIntents{b.Store.Intents()} }

// GetRowAndIntent shadows the store's batch read (contract.RowIntentReader) the same way.
func (b blindBackend) GetRowAndIntent(ctx context.Context, key string) (*contract.InstanceRow, *contract.Intent, error) {
	row, _, err := b.Store.GetRowAndIntent(ctx, key)
	return row, nil, err
}

type blindIntents struct{ contract.IntentStore }

func (blindIntents) Get(context.Context, string) (*contract.Intent, error) { return nil, nil }

// runChild starts the child and returns once it is parked at its crash point.
func runChild(t *testing.T, c crashChild) *exec.Cmd {
	t.Helper()
	raw, _ := json.Marshal(c)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+string(raw))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	parked := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var seen []string
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), crashPoint) {
				parked <- nil
				_, _ = io.Copy(io.Discard, out)
				return
			}
			seen = append(seen, sc.Text())
		}
		parked <- fmt.Errorf("child exited before its crash point: %s", strings.Join(seen, "\n"))
	}()
	select {
	case err := <-parked:
		if err != nil {
			t.Fatalf("%v\nstderr: %s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("child did not reach its crash point within 60 s; stderr: %s", stderr.String())
	}
	return cmd
}

// sandboxDirs lists the sandboxes on disk (work directories and snapshots excluded).
func sandboxDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

// lockExpiresAt reads the wall-clock expiry (ms) of the lease item on sandbox:<key>.
func lockExpiresAt(t *testing.T, client *dynamodb.Client, table, tenant, key string) int64 {
	t.Helper()
	out, err := client.GetItem(t.Context(), &dynamodb.GetItemInput{
		TableName:      aws.String(table),
		ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: tenant + "#LOCK#sandbox:" + key},
			"sk": &types.AttributeValueMemberS{Value: "LOCK"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	n, ok := out.Item["expiresAt"].(*types.AttributeValueMemberN)
	if !ok {
		t.Fatalf("no held lease item for sandbox:%s: %v", key, out.Item)
	}
	v, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCrashSIGKILL kills a lock holder mid-create and proves what docs/design.md §12 promises.
func TestCrashSIGKILL(t *testing.T) {
	endpoint := dynamotest.Endpoint(t)
	client := dynamotest.NewClient(endpoint)
	table := dynamotest.FreshTable(t, client)
	dir := t.TempDir()
	const tenant = "crash"
	ctx := contract.WithTenant(t.Context(), tenant)
	store := crashStore(client, table)
	tb := &timedBackend{Store: store, entered: map[string]time.Time{}}
	prov := &countingLocal{Provider: localprocess.New(dir)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	k := newKeeper(t, keeper.Config{Backend: tb, Providers: []contract.Provider{prov}, Logger: quiet})
	keyOf := func(thread string) string {
		ws, _ := json.Marshal(map[string]any{"repo": "crash"})
		key, err := contract.SandboxKey(contract.KeyInput{ThreadID: thread, SetupID: "default", Provider: "local-process",
			Workspace: json.RawMessage(ws), Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	// orphans: the sandbox directories under dir that no instance row of keys names.
	orphans := func(t *testing.T, dir string, keys ...string) (orphans, dirs []string) {
		t.Helper()
		named := map[string]bool{}
		for _, key := range keys {
			row, err := store.Instances().GetRow(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if row != nil {
				named[row.ProviderSandboxID] = true
			}
		}
		dirs = sandboxDirs(t, dir)
		for _, d := range dirs {
			if !named[d] {
				orphans = append(orphans, d)
			}
		}
		return orphans, dirs
	}

	type figure struct {
		point               string
		sinceKill, overSkew time.Duration
	}
	var figures []figure

	// crashThenStart: a child parks at point holding sandbox:<key>; SIGKILL; the parent's
	// start on the same thread waits out the lease, adopts the child's sandbox (no second
	// create) and writes the row.
	crashThenStart := func(t *testing.T, point, thread string) {
		key := keyOf(thread)
		child := runChild(t, crashChild{Endpoint: endpoint, Table: table, Dir: dir, Tenant: tenant,
			RunID: "child-" + thread, Thread: thread, Point: point})
		before := sandboxDirs(t, dir)
		in, err := store.Intents().Get(ctx, key)
		if err != nil || in == nil {
			t.Fatalf("the parked child has no open intent on %s: %v", key, err)
		}
		var childSandbox string
		switch point {
		case "row":
			childSandbox = in.ProviderSandboxID
			if childSandbox == "" {
				t.Fatalf("the intent has no recorded id at the row write: %+v", in)
			}
		case "record":
			if in.ProviderSandboxID != "" {
				t.Fatalf("the intent already has an id before Record: %+v", in)
			}
			id, found, err := prov.Lookup(ctx, key)
			if err != nil || !found {
				t.Fatalf("the child's sandbox is not on disk: %v", err)
			}
			childSandbox = id
		}
		if !slices.Contains(before, childSandbox) {
			t.Fatalf("the child's sandbox %s is not on disk: %v", childSandbox, before)
		}
		if row, _ := store.Instances().GetRow(ctx, key); row != nil {
			t.Fatalf("a row exists before the crash: %+v", row)
		}

		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		_ = child.Wait()
		// Read after the kill: the dead child renews no more, so this is its last lease.
		expiresAt := lockExpiresAt(t, client, table, tenant, key)
		creates := prov.creates.Load()
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		res, err := k.Start(sctx, keeper.StartInput{RunID: "parent-" + thread, ThreadID: thread, Sandbox: crashSetup()})
		if err != nil {
			t.Fatalf("the parent's start after the crash: %v", err)
		}
		entered, ok := tb.enteredAt("sandbox:" + key)
		if !ok {
			t.Fatal("the parent never took sandbox:<key>: the crash was not on the locked path")
		}
		// Safety: the parent got in only after the child's lease (as last renewed) plus the
		// skew had passed on the wall clock the lease is written in.
		earliest := time.UnixMilli(expiresAt + crashLock.Skew.Milliseconds())
		if entered.Before(earliest.Add(-50 * time.Millisecond)) {
			t.Fatalf("the parent entered at %s, before the child's lease expired (+skew) at %s",
				entered.Format(time.StampMilli), earliest.Format(time.StampMilli))
		}
		f := figure{point, entered.Sub(killed), entered.Sub(earliest)}
		figures = append(figures, f)
		t.Logf("%s: lock free %v after SIGKILL (lease %v, skew %v, renew %v); %v after expiresAt+skew",
			point, f.sinceKill.Round(time.Millisecond), crashLock.Lease, crashLock.Skew, crashLock.Renew, f.overSkew.Round(time.Millisecond))
		// Liveness, generously bounded (the figure is reported; a loaded machine is slow):
		// lease + skew + one backoff step, plus slack.
		if bound := crashLock.Lease + crashLock.Skew + time.Second + 5*time.Second; f.sinceKill > bound {
			t.Errorf("the lock came free only %v after SIGKILL (bound %v)", f.sinceKill, bound)
		}

		// The intent was resolved: the same sandbox, no second create, the row names it.
		if res.Sandbox.ProviderSandboxID != childSandbox || res.Outcome != keeper.OutcomeResumed {
			t.Fatalf("the parent got %s (%s), want the child's %s resumed", res.Sandbox.ProviderSandboxID, res.Outcome, childSandbox)
		}
		if n := prov.creates.Load() - creates; n != 0 {
			t.Fatalf("the parent created %d sandboxes after the crash, want 0", n)
		}
		row, err := store.Instances().GetRow(ctx, key)
		if err != nil || row == nil || row.ProviderSandboxID != childSandbox {
			t.Fatalf("row after the parent's start: %+v, %v", row, err)
		}
		if in, err := store.Intents().Get(ctx, key); err != nil || in != nil {
			t.Fatalf("the intent is still open after the parent resolved it: %+v, %v", in, err)
		}
		st, err := store.Runs().State(ctx, "parent-"+thread)
		if err != nil || st == nil || st.ProviderSandboxID != childSandbox {
			t.Fatalf("the parent's run did not record the sandbox: %+v, %v", st, err)
		}
	}

	t.Run("killed at the row write, start resumes", func(t *testing.T) { crashThenStart(t, "row", "thread-row") })
	t.Run("killed before the id is recorded, start finds it by name", func(t *testing.T) { crashThenStart(t, "record", "thread-record") })

	// A crash nobody comes back for: the reaper's stale-intent sweep resolves it under the
	// lock (the child's lease must expire first) and destroys the orphan.
	orphanKey := keyOf("thread-orphan")
	t.Run("killed at the row write, nobody returns: the reaper destroys the orphan", func(t *testing.T) {
		child := runChild(t, crashChild{Endpoint: endpoint, Table: table, Dir: dir, Tenant: tenant,
			RunID: "child-orphan", Thread: "thread-orphan", Point: "row"})
		in, err := store.Intents().Get(ctx, orphanKey)
		if err != nil || in == nil || in.ProviderSandboxID == "" {
			t.Fatalf("no recorded intent: %+v %v", in, err)
		}
		orphan := in.ProviderSandboxID
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
		if !slices.Contains(sandboxDirs(t, dir), orphan) {
			t.Fatalf("the orphan %s is not on disk before the sweep", orphan)
		}
		sweeps, destroyed := 0, 0
		deadline := time.Now().Add(60 * time.Second)
		for {
			rk := newKeeper(t, keeper.Config{Backend: store, Providers: []contract.Provider{prov}, Logger: quiet})
			rp, err := reaper.New(reaper.Config{Keeper: rk,
				DetachedRunTTL: time.Hour, LockLease: crashLock.Lease, LockWait: crashLock.Lease + crashLock.Skew + time.Second,
				InstanceRetention: -1})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := rp.Sweep(t.Context())
			sweeps++
			if err != nil {
				t.Fatalf("sweep %d: %v", sweeps, err)
			}
			destroyed += rep.Swept.OrphansDestroyed
			if in, _ := store.Intents().Get(ctx, orphanKey); in == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the stale intent is still open after %d sweeps (last report %+v)", sweeps, rep.Swept)
			}
			time.Sleep(250 * time.Millisecond) // bounded polling: the intent ages past the lease
		}
		if destroyed != 1 || slices.Contains(sandboxDirs(t, dir), orphan) {
			t.Fatalf("after %d sweeps: %d orphans destroyed, %s still on disk: %v", sweeps, destroyed, orphan, sandboxDirs(t, dir))
		}
		t.Logf("the reaper destroyed the orphan after %d sweep(s)", sweeps)
	})

	// Negative control: a parent blind to intents (as a keeper without docs/design.md §2.7 would be)
	// creates a second sandbox and orphans the child's — the checks above would catch it.
	t.Run("negative control: a start blind to intents orphans the sandbox", func(t *testing.T) {
		dir2 := t.TempDir()
		prov2 := &countingLocal{Provider: localprocess.New(dir2)}
		blind := newKeeper(t, keeper.Config{Backend: blindBackend{store}, Providers: []contract.Provider{prov2}, Logger: quiet})
		child := runChild(t, crashChild{Endpoint: endpoint, Table: table, Dir: dir2, Tenant: tenant,
			RunID: "child-blind", Thread: "thread-blind", Point: "row"})
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		res, err := blind.Start(sctx, keeper.StartInput{RunID: "parent-blind", ThreadID: "thread-blind", Sandbox: crashSetup()})
		if err != nil {
			t.Fatal(err)
		}
		orph, _ := orphans(t, dir2, keyOf("thread-blind"))
		if prov2.creates.Load() != 1 || res.Outcome != keeper.OutcomeCreated || len(orph) != 1 {
			t.Fatalf("the blind start: outcome %s, %d creates, orphans %v; want created, 1, one orphan",
				res.Outcome, prov2.creates.Load(), orph)
		}
		_ = prov2.Destroy(ctx, orph[0])
	})

	// Finally one more sweep over everything: no open intent, no orphan on disk.
	rk := newKeeper(t, keeper.Config{Backend: store, Providers: []contract.Provider{prov}, Logger: quiet})
	rp, err := reaper.New(reaper.Config{Keeper: rk, DetachedRunTTL: time.Hour,
		LockLease: crashLock.Lease, InstanceRetention: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rp.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	keys := []string{keyOf("thread-row"), keyOf("thread-record"), orphanKey}
	for _, key := range keys {
		if in, err := store.Intents().Get(ctx, key); err != nil || in != nil {
			t.Errorf("open intent on %s after the sweep: %+v %v", key, in, err)
		}
	}
	orph, dirs := orphans(t, dir, keys...)
	if len(orph) != 0 {
		t.Errorf("orphan sandboxes on disk after the sweep: %v", orph)
	}
	if len(dirs) != 2 {
		t.Errorf("%d sandboxes on disk, want the 2 the rows name: %v", len(dirs), dirs)
	}
	for _, f := range figures {
		t.Logf("figure %s: SIGKILL → lock %v; expiresAt+skew → lock %v", f.point,
			f.sinceKill.Round(time.Millisecond), f.overSkew.Round(time.Millisecond))
	}
	if len(figures) != 2 {
		t.Errorf("%d crash figures, want 2", len(figures))
	}
}
