package dynamostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"golang.org/x/sync/errgroup"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// The property tests of the run-state rules: every fenced primitive of dynamostore (its
// single-call fast path where the condition holds, its read-then-write general path
// otherwise), applied to random stored states and random inputs, ends exactly where the
// plain rule of shared/contract/runrules.go says: the same answer, the same error class,
// the same stored state and tokens, and index helpers derived from that state.

// casesPerOp is the number of random cases of each primitive (SANDKEEP_RULES_CASES overrides).
const casesPerOp = 100

// pathLog records the calls of one case, so the test knows which path the primitive took.
type pathLog struct {
	mu    sync.Mutex
	calls []string // "UpdateItem", or "UpdateItem!" when its condition failed
}

type pathKey struct{}

// pathClient is the store's client wrapped at the Client seam to log each case's calls.
type pathClient struct{ dynamostore.Client }

func logCall(ctx context.Context, op string, err error) {
	l, _ := ctx.Value(pathKey{}).(*pathLog)
	if l == nil {
		return
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		op += "!"
	}
	l.mu.Lock()
	l.calls = append(l.calls, op)
	l.mu.Unlock()
}

func (c pathClient) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	out, err := c.Client.GetItem(ctx, in, o...)
	logCall(ctx, "GetItem", err)
	return out, err
}

func (c pathClient) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	out, err := c.Client.PutItem(ctx, in, o...)
	logCall(ctx, "PutItem", err)
	return out, err
}

func (c pathClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := c.Client.UpdateItem(ctx, in, o...)
	logCall(ctx, "UpdateItem", err)
	return out, err
}

// propCase is one random case: the stored run (nil: absent) and its tokens, and the input.
type propCase struct {
	op                  *propOp
	runID               string
	cur                 *contract.RunState
	createTok, claimTok string
	in                  any
}

func (c propCase) String() string {
	b, _ := json.Marshal(c.cur)
	return fmt.Sprintf("%s on %s (createToken %q, claimToken %q), input %+v", c.op.name, b, c.createTok, c.claimTok, c.in)
}

// verdict is what a rule decides for a case (created only for CreateClaimed).
type verdict struct {
	next    contract.RunState
	write   bool
	created bool
	err     error
}

// observed is what the store did in a case.
type observed struct {
	state               contract.RunState // the answer (when the primitive returns one)
	created             bool
	err                 error
	stored              *contract.RunState // the run after the call (nil: absent)
	createTok, claimTok string
	path                string // the calls, e.g. "UpdateItem" (fast path)
	helpers             string // the stored helpers that differ from those its state derives
}

// propOp is one primitive: a random input for a state, the store call, and the rule.
type propOp struct {
	name    string
	answers bool // the primitive returns the run
	gen     func(r *rand.Rand, cur *contract.RunState) any
	call    func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error)
	rule    func(c propCase) verdict
}

func ptrTo[T any](v T) *T { return &v }

// pick returns one of vs, uniformly.
func pick[T any](r *rand.Rand, vs ...T) T { return vs[r.IntN(len(vs))] }

func randStatus(r *rand.Rand) contract.RunStatus {
	return pick(r, contract.StatusRunning, contract.StatusRunning, contract.StatusInterrupted,
		contract.StatusCompleted, contract.StatusFailed, contract.StatusAborted)
}

// randState is a random stored run: every field the rules read, over small value sets so
// that inputs often match it.
func randState(r *rand.Rand, runID string) *contract.RunState {
	st := &contract.RunState{RunRecord: contract.RunRecord{RunID: runID, ThreadID: "th", Status: randStatus(r), StartedAt: 10}}
	if r.IntN(5) > 0 {
		st.DriverEpoch = ptrTo(int64(r.IntN(4)))
	}
	st.LeaseUntil = pick(r, int64(0), 100, 200, 300)
	if r.IntN(3) == 0 {
		st.DetachedSince = ptrTo(pick(r, int64(100), 200, st.LeaseUntil))
	}
	st.Lapsed = r.IntN(3) == 0
	switch r.IntN(4) {
	case 0:
		st.CancelRequested = ptrTo(true)
	case 1:
		st.CancelRequested = ptrTo(false)
	}
	if r.IntN(2) == 0 {
		st.SandboxKey = ptrTo(pick(r, "k1", "k2"))
	}
	st.ProviderSandboxID = pick(r, "", "p1")
	if r.IntN(3) == 0 {
		st.FinishedAt = ptrTo(int64(50))
	}
	if r.IntN(4) == 0 {
		st.Error = &contract.RunError{Message: "boom", Code: pick(r, "", "E1")}
	}
	if r.IntN(4) == 0 {
		st.Usage = json.RawMessage(`{"tokens":3}`)
	}
	if r.IntN(3) == 0 { // a live run, as the hot primitives mostly meet it
		st.Status, st.CancelRequested, st.Lapsed, st.DetachedSince = contract.StatusRunning, nil, false, nil
	}
	return st
}

// randEpoch is the fence an input carries: mostly the run's own.
func randEpoch(r *rand.Rand, cur *contract.RunState) int64 {
	if cur != nil && r.IntN(3) > 0 {
		return cur.Epoch()
	}
	return int64(r.IntN(4))
}

func randPatch(r *rand.Rand) contract.RunPatch {
	var p contract.RunPatch
	field := func(n int) int { return r.IntN(n) } // 0: leave alone
	if field(2) == 0 {
		p.Status = contract.Set(randStatus(r))
	}
	switch field(4) {
	case 1:
		p.FinishedAt = contract.Set(int64(70))
	case 2:
		p.FinishedAt = contract.Clear[int64]()
	}
	switch field(4) {
	case 1:
		p.Error = contract.Set(contract.RunError{Message: "m"})
	case 2:
		p.Error = contract.Clear[contract.RunError]()
	}
	switch field(4) {
	case 1:
		p.Usage = contract.Set(json.RawMessage(`[1]`))
	case 2:
		p.Usage = contract.Clear[json.RawMessage]()
	}
	// The durable fields send a patch to the general path: rarer, so fast paths dominate.
	switch field(10) {
	case 1:
		p.SandboxKey = contract.Set("k3")
	case 2:
		p.SandboxKey = contract.Clear[string]()
	}
	switch field(10) {
	case 1:
		p.DetachedSince = contract.Set(int64(400))
	case 2:
		p.DetachedSince = contract.Clear[int64]()
	}
	switch field(10) {
	case 1:
		p.CancelRequested = contract.Set(true)
	case 2:
		p.CancelRequested = contract.Clear[bool]()
	}
	switch field(8) {
	case 1:
		p.DriverEpoch = contract.Set(int64(7))
	case 2:
		p.DriverEpoch = contract.Clear[int64]()
	}
	return p
}

type fencedIn struct {
	Epoch int64
	Patch contract.RunPatch
	PSID  string
	Lease int64
	Key   string
	Now   int64
}

// fencedVerdict turns a rule's (next, write, err) into a verdict.
func fencedVerdict(next contract.RunState, write bool, err error) verdict {
	return verdict{next: next, write: write, err: err}
}

// The primitives under test and their rules (the rules are shared/contract's own).
var propOps = []*propOp{
	{
		name: "Claim", answers: true,
		gen: func(r *rand.Rand, cur *contract.RunState) any {
			c := contract.Claim{Token: pick(r, "", "t1", "t2", "t3"), LeaseUntil: pick(r, int64(300), 400), ClearDetached: r.IntN(2) == 0}
			if r.IntN(4) == 0 {
				c.If.DetachedSince = ptrTo(pick(r, int64(100), 200))
			}
			if r.IntN(4) == 0 {
				c.If.Cutoff = ptrTo(pick(r, int64(150), 250))
			}
			c.If.Cancelled = r.IntN(4) == 0
			if r.IntN(4) == 0 {
				c.If.Unheld = ptrTo(pick(r, int64(0), 150, 300, 350))
			}
			return c
		},
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error) {
			st, err := runs.Claim(ctx, runID, in.(contract.Claim))
			return st, false, err
		},
		rule: func(c propCase) verdict {
			return fencedVerdict(contract.ClaimNext(c.cur, c.claimTok, c.in.(contract.Claim)))
		},
	},
	{
		name: "UpdateFenced", answers: true,
		gen: func(r *rand.Rand, cur *contract.RunState) any {
			p := randPatch(r)
			if cur != nil && r.IntN(4) == 0 { // a retried terminal write, when cur is terminal
				p.Status = contract.Set(cur.Status)
			}
			return fencedIn{Epoch: randEpoch(r, cur), Patch: p}
		},
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error) {
			st, err := runs.UpdateFenced(ctx, runID, in.(fencedIn).Epoch, in.(fencedIn).Patch)
			return st, false, err
		},
		rule: func(c propCase) verdict {
			in := c.in.(fencedIn)
			return fencedVerdict(contract.UpdateFencedNext(c.cur, in.Epoch, in.Patch))
		},
	},
	{
		name: "RecordSandbox", answers: true,
		gen: func(r *rand.Rand, cur *contract.RunState) any {
			return fencedIn{Epoch: randEpoch(r, cur), PSID: pick(r, "p1", "p2")}
		},
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error) {
			st, err := runs.RecordSandbox(ctx, runID, in.(fencedIn).Epoch, in.(fencedIn).PSID)
			return st, false, err
		},
		rule: func(c propCase) verdict {
			in := c.in.(fencedIn)
			return fencedVerdict(contract.RecordSandboxNext(c.cur, in.Epoch, in.PSID))
		},
	},
	{
		name: "Heartbeat", answers: true,
		gen: func(r *rand.Rand, cur *contract.RunState) any {
			// 60_300 lies a whole driver lease (the store's default 60 s, reclaimAt's step) past
			// every stored lease: its reclaimAt moves.
			return fencedIn{Epoch: randEpoch(r, cur), Lease: pick(r, int64(300), 400, 60_300)}
		},
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error) {
			st, err := runs.Heartbeat(ctx, runID, in.(fencedIn).Epoch, in.(fencedIn).Lease)
			return st, false, err
		},
		rule: func(c propCase) verdict {
			in := c.in.(fencedIn)
			return fencedVerdict(contract.HeartbeatNext(c.cur, in.Epoch, in.Lease))
		},
	},
	{
		name: "Detach", answers: true,
		gen: func(r *rand.Rand, cur *contract.RunState) any {
			return fencedIn{Epoch: randEpoch(r, cur), Key: pick(r, "", "k1", "k2"), Now: 500}
		},
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error) {
			i := in.(fencedIn)
			st, err := runs.Detach(ctx, runID, i.Epoch, i.Key, i.Now)
			return st, false, err
		},
		rule: func(c propCase) verdict {
			in := c.in.(fencedIn)
			return fencedVerdict(contract.DetachNext(c.cur, in.Epoch, in.Key, in.Now))
		},
	},
	{
		name: "Lapse",
		gen: func(r *rand.Rand, cur *contract.RunState) any {
			lease := pick(r, int64(100), 200)
			if cur != nil && r.IntN(3) > 0 {
				lease = cur.LeaseUntil
			}
			return fencedIn{Epoch: randEpoch(r, cur), Lease: lease}
		},
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error) {
			return contract.RunState{}, false, runs.Lapse(ctx, runID, in.(fencedIn).Epoch, in.(fencedIn).Lease)
		},
		rule: func(c propCase) verdict {
			in := c.in.(fencedIn)
			return fencedVerdict(contract.LapseNext(c.cur, in.Epoch, in.Lease))
		},
	},
	{
		name: "RequestCancel", answers: true,
		gen: func(*rand.Rand, *contract.RunState) any { return struct{}{} },
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, _ any) (contract.RunState, bool, error) {
			st, err := runs.RequestCancel(ctx, runID)
			return st, false, err
		},
		rule: func(c propCase) verdict { return fencedVerdict(contract.CancelNext(c.cur)) },
	},
	{
		name: "CreateClaimed", answers: true,
		gen: func(r *rand.Rand, _ *contract.RunState) any {
			return contract.CreateClaimedRun{
				NewRun:     contract.NewRun{ThreadID: "th", StartedAt: 20, Status: pick(r, "", contract.StatusRunning, contract.StatusInterrupted)},
				SandboxKey: "k9", ProviderSandboxID: pick(r, "", "p9"), LeaseUntil: 900, Token: pick(r, "", "c1", "c2"),
			}
		},
		call: func(ctx context.Context, runs contract.FencedRuns, runID string, in any) (contract.RunState, bool, error) {
			cc := in.(contract.CreateClaimedRun)
			cc.RunID = runID
			return runs.CreateClaimed(ctx, cc)
		},
		rule: func(c propCase) verdict {
			in := c.in.(contract.CreateClaimedRun)
			in.RunID = c.runID
			if c.cur != nil {
				return verdict{next: *c.cur, created: contract.CreatedBy(c.createTok, in.Token)}
			}
			st, err := in.State()
			return verdict{next: st, write: true, created: true, err: err}
		},
	},
}

// errClass names the refusal an error is (sandbox's run-state sentinels), "" for none.
func errClass(err error) string {
	for _, s := range []error{contract.ErrUnknownRun, contract.ErrTerminalRun, contract.ErrSuperseded, contract.ErrConflict} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return ""
}

// mismatch compares what the store did with what rule decides; "" when they agree.
func mismatch(c propCase, got observed, v verdict) string {
	var diffs []string
	if got.helpers != "" {
		diffs = append(diffs, got.helpers)
	}
	if a, b := errClass(got.err), errClass(v.err); a != b {
		diffs = append(diffs, fmt.Sprintf("error %q, rule %q", a, b))
	}
	if v.err == nil && got.err == nil && c.op.answers && !reflect.DeepEqual(got.state, v.next) {
		diffs = append(diffs, fmt.Sprintf("answered %+v, rule %+v", got.state, v.next))
	}
	if got.created != v.created {
		diffs = append(diffs, fmt.Sprintf("created=%v, rule %v", got.created, v.created))
	}
	wantStored, wantCreate, wantClaim := c.cur, c.createTok, c.claimTok
	if v.err == nil && v.write {
		wantStored = &v.next
		switch in := c.in.(type) {
		case contract.Claim:
			wantClaim = in.Token
		case contract.CreateClaimedRun:
			wantCreate = in.Token
		}
	}
	if !reflect.DeepEqual(got.stored, wantStored) {
		g, _ := json.Marshal(got.stored)
		w, _ := json.Marshal(wantStored)
		diffs = append(diffs, fmt.Sprintf("stored %s, rule %s", g, w))
	}
	if got.createTok != wantCreate || got.claimTok != wantClaim {
		diffs = append(diffs, fmt.Sprintf("tokens (%q, %q), rule (%q, %q)", got.createTok, got.claimTok, wantCreate, wantClaim))
	}
	return strings.Join(diffs, "; ")
}

// propSeed is the seed of this run: SANDKEEP_RULES_SEED reproduces a failure.
func propSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SANDKEEP_RULES_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SANDKEEP_RULES_SEED: %v", err)
		}
		seed = n
	}
	t.Logf("seed %d (rerun with SANDKEEP_RULES_SEED=%d)", seed, seed)
	return seed
}

// runProperty applies every case to a store on a fresh dynalite table (its client wrapped by
// wrap, when not nil) and returns what the store did, case by case.
func runProperty(t *testing.T, seed uint64, perOp int, wrap func(dynamostore.Client) dynamostore.Client) ([]propCase, []observed) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var cases []propCase
	for _, op := range propOps {
		for i := range perOp {
			c := propCase{op: op, runID: fmt.Sprintf("%s-%d", op.name, i)}
			if r.IntN(8) > 0 {
				c.cur = randState(r, c.runID)
				c.createTok, c.claimTok = pick(r, "", "c1", "c2"), pick(r, "", "t1", "t2")
			}
			c.in = op.gen(r, c.cur)
			cases = append(cases, c)
		}
	}
	client := dynamotest.Client(t)
	table := dynamotest.FreshTable(t, client)
	clock := time.UnixMilli(1_800_000_000_000)
	var sc dynamostore.Client = pathClient{client}
	if wrap != nil {
		sc = wrap(sc)
	}
	store := dynamostore.New(dynamostore.Config{Client: sc, Table: table, Now: func() time.Time { return clock }})
	f := fixture{store: store, client: client, table: table}
	ctx := contract.WithTenant(t.Context(), "acme")
	got := make([]observed, len(cases))
	var g errgroup.Group
	g.SetLimit(4)
	for i, c := range cases {
		g.Go(func() error {
			if c.cur != nil {
				item := dynamostore.TokenRunItemForTest(store, "acme", *c.cur, c.createTok, c.claimTok)
				if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
					return err
				}
			}
			log := &pathLog{}
			st, created, err := c.op.call(context.WithValue(ctx, pathKey{}, log), store.Runs(), c.runID, c.in)
			o := observed{state: st, created: created, err: err, path: strings.Join(log.calls, " ")}
			if item := rawRun(t, f, "acme", c.runID); item != nil {
				s, ct, cl, err := dynamostore.DecodeRunForTest(item)
				if err != nil {
					return err
				}
				o.stored, o.createTok, o.claimTok = &s, ct, cl
				want, err := dynamostore.WantHelpersForTest(store, "acme", item)
				if err != nil {
					return err
				}
				for _, name := range dynamostore.HelperAttrs {
					if !reflect.DeepEqual(item[name], want[name]) {
						o.helpers += fmt.Sprintf("helper %s is %v, its state derives %v; ", name, item[name], want[name])
					}
				}
			}
			got[i] = o
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	return cases, got
}

func casesFor(t *testing.T) int {
	if s := os.Getenv("SANDKEEP_RULES_CASES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("SANDKEEP_RULES_CASES=%q", s)
		}
		return n
	}
	return casesPerOp
}

// TestFastPathsEqualRules: each primitive, fast path or general path, ends where its plain
// rule says, and the random cases exercised both paths of every primitive (a fast path
// that succeeded, and one whose condition failed and was classified by the rule). The
// seed is random (logged; SANDKEEP_RULES_SEED reproduces it).
func TestFastPathsEqualRules(t *testing.T) {
	seed := propSeed(t)
	cs, got := runProperty(t, seed, casesFor(t), nil)
	fastOK := map[string]int{}   // the single call did it
	fellBack := map[string]int{} // the single call's condition failed; the rule decided
	stepped := 0                 // a heartbeat whose reclaimAt moved: its second UpdateItem did it
	for i, c := range cs {
		if d := mismatch(c, got[i], c.op.rule(c)); d != "" {
			t.Errorf("seed %d: %s: path %q: %s", seed, c, got[i].path, d)
		}
		if c.op.name == "Heartbeat" && got[i].path == "UpdateItem! UpdateItem" {
			stepped++
		}
		first, _, _ := strings.Cut(got[i].path, " ")
		switch {
		case first == "UpdateItem" || first == "PutItem":
			fastOK[c.op.name]++
		case strings.HasSuffix(first, "!"):
			fellBack[c.op.name]++
		}
	}
	t.Logf("Heartbeat     moving reclaimAt by its second UpdateItem %3d", stepped)
	if stepped == 0 {
		t.Errorf("seed %d: no heartbeat took the UpdateItem that moves reclaimAt a step", seed)
	}
	for _, op := range propOps {
		t.Logf("%-13s fast path %3d, condition failed -> rule %3d", op.name, fastOK[op.name], fellBack[op.name])
		if fastOK[op.name] == 0 || fellBack[op.name] == 0 {
			t.Errorf("seed %d: %s: the cases hit the fast path %d times and its fallback %d times; both must be hit",
				seed, op.name, fastOK[op.name], fellBack[op.name])
		}
	}
}

// brokenRules are deliberately wrong rules, each a near-copy of a real one: the comparison
// of TestFastPathsEqualRules must tell every one of them from what dynamostore does.
var brokenRules = map[string]func(c propCase) verdict{
	"Claim bumps its own landed claim again": func(c propCase) verdict {
		return fencedVerdict(contract.ClaimNext(c.cur, "", c.in.(contract.Claim)))
	},
	"UpdateFenced ignores the epoch": func(c propCase) verdict {
		in := c.in.(fencedIn)
		if c.cur != nil {
			return fencedVerdict(contract.UpdateFencedNext(c.cur, c.cur.Epoch(), in.Patch))
		}
		return fencedVerdict(contract.UpdateFencedNext(c.cur, in.Epoch, in.Patch))
	},
	"UpdateFenced refuses its own landed terminal write": func(c propCase) verdict {
		in := c.in.(fencedIn)
		v := fencedVerdict(contract.UpdateFencedNext(c.cur, in.Epoch, in.Patch))
		if v.err == nil && !v.write {
			v.err = contract.ErrTerminalRun
		}
		return v
	},
	"Heartbeat leaves a lapse in place": func(c propCase) verdict {
		in := c.in.(fencedIn)
		v := fencedVerdict(contract.HeartbeatNext(c.cur, in.Epoch, in.Lease))
		if v.write && c.cur.Lapsed {
			v.next.Lapsed, v.next.DetachedSince = true, c.cur.DetachedSince
		}
		return v
	},
	"Detach pushes expiry back": func(c propCase) verdict {
		in := c.in.(fencedIn)
		v := fencedVerdict(contract.DetachNext(c.cur, in.Epoch, in.Key, in.Now))
		if v.write {
			v.next.DetachedSince = &in.Now
		}
		return v
	},
	"Lapse overwrites a detachment": func(c propCase) verdict {
		in := c.in.(fencedIn)
		if c.cur == nil || c.cur.Lapsed {
			return fencedVerdict(contract.LapseNext(c.cur, in.Epoch, in.Lease))
		}
		cur := c.cur.Clone()
		cur.DetachedSince = nil
		return fencedVerdict(contract.LapseNext(&cur, in.Epoch, in.Lease))
	},
	"RequestCancel cancels a terminal run": func(c propCase) verdict {
		if c.cur != nil && c.cur.Status.Terminal() && !c.cur.Cancelled() {
			next := c.cur.Clone()
			next.CancelRequested = ptrTo(true)
			return verdict{next: next, write: true}
		}
		return fencedVerdict(contract.CancelNext(c.cur))
	},
	"CreateClaimed takes any existing run for its own": func(c propCase) verdict {
		if c.cur != nil {
			return verdict{next: *c.cur, created: true}
		}
		return propOps[len(propOps)-1].rule(c)
	},
}

// negativeControlSeed fixes the negative control's cases, so it never depends on luck.
const negativeControlSeed = 13

// TestFastPathsEqualRulesNegativeControl: the comparison of TestFastPathsEqualRules catches
// a wrong rule. The store's outcomes are checked against each broken rule in place of the
// real one; every broken rule must disagree with dynamostore in at least one case.
func TestFastPathsEqualRulesNegativeControl(t *testing.T) {
	seed := uint64(negativeControlSeed)
	cs, got := runProperty(t, seed, casesPerOp, nil)
	for name, broken := range brokenRules {
		op, _, _ := strings.Cut(name, " ")
		caught, tried := 0, 0
		for i, c := range cs {
			if c.op.name != op {
				continue
			}
			tried++
			if mismatch(c, got[i], broken(c)) != "" {
				caught++
			}
		}
		t.Logf("%-50s caught in %d of %d cases", name, caught, tried)
		if tried == 0 || caught == 0 {
			t.Errorf("seed %d: the deliberately wrong rule %q agreed with dynamostore in all %d cases", seed, name, tried)
		}
	}
}

// unconditionalFastPaths is a deliberately broken store, built at the Client seam: every
// UpdateItem of a run (the fast paths) loses its condition but that the item exists.
type unconditionalFastPaths struct{ dynamostore.Client }

var placeholder = regexp.MustCompile(`[#:][A-Za-z0-9_]+`)

func (c unconditionalFastPaths) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if sk, ok := in.Key["sk"].(*types.AttributeValueMemberS); ok && sk.Value == "RUN" && in.ConditionExpression != nil {
		b := *in
		b.ConditionExpression = aws.String("attribute_exists(pk)")
		used := map[string]bool{}
		for _, p := range placeholder.FindAllString(aws.ToString(b.UpdateExpression), -1) {
			used[p] = true
		}
		b.ExpressionAttributeNames = maps.Clone(in.ExpressionAttributeNames)
		maps.DeleteFunc(b.ExpressionAttributeNames, func(k, _ string) bool { return !used[k] })
		b.ExpressionAttributeValues = maps.Clone(in.ExpressionAttributeValues)
		maps.DeleteFunc(b.ExpressionAttributeValues, func(k string, _ types.AttributeValue) bool { return !used[k] })
		if len(b.ExpressionAttributeValues) == 0 {
			b.ExpressionAttributeValues = nil
		}
		in = &b
	}
	return c.Client.UpdateItem(ctx, in, o...)
}

// TestFastPathsEqualRulesCatchesABrokenFastPath: the same comparison tells a store whose
// fast paths write without their conditions from the rules, for every primitive that has
// a fast path (CreateClaimed's is a plain conditional PutItem, left intact).
func TestFastPathsEqualRulesCatchesABrokenFastPath(t *testing.T) {
	seed := uint64(negativeControlSeed)
	cs, got := runProperty(t, seed, casesPerOp, func(c dynamostore.Client) dynamostore.Client {
		return unconditionalFastPaths{c}
	})
	caught := map[string]int{}
	for i, c := range cs {
		if got[i].err != nil && errClass(got[i].err) == "other: "+got[i].err.Error() {
			t.Fatalf("%s: the broken client made the call fail instead of write: %v", c, got[i].err)
		}
		if mismatch(c, got[i], c.op.rule(c)) != "" {
			caught[c.op.name]++
		}
	}
	for _, op := range propOps {
		t.Logf("%-13s unconditional fast path told from the rule in %d cases", op.name, caught[op.name])
		if op.name != "CreateClaimed" && caught[op.name] == 0 {
			t.Errorf("seed %d: %s without its fast-path condition agreed with its rule in every case", seed, op.name)
		}
	}
}
