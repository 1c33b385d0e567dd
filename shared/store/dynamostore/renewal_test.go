package dynamostore_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// updateCall is one UpdateItem a store sent: the attributes its update expression names
// (what it may write; its condition is a separate expression), and whether that condition
// failed.
type updateCall struct {
	names   []string
	sets    []string // the attributes assigned (SET #a = …), the ones the call writes
	removes bool     // it has a REMOVE action (which writes the attributes it names)
	failed  bool
}

// updateRecorder is the store's client wrapped at the Client seam to record each
// UpdateItem's named attributes.
type updateRecorder struct {
	dynamostore.Client
	mu    sync.Mutex
	calls []updateCall
}

// namePlaceholder is an attribute name placeholder of an expression; setTarget one
// assigned by a SET action.
var (
	namePlaceholder = regexp.MustCompile(`#[0-9A-Za-z_]+`)
	setTarget       = regexp.MustCompile(`(#[0-9A-Za-z_]+)\s*=`)
)

func (c *updateRecorder) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := c.Client.UpdateItem(ctx, in, o...)
	var call updateCall
	for _, p := range namePlaceholder.FindAllString(aws.ToString(in.UpdateExpression), -1) {
		call.names = append(call.names, in.ExpressionAttributeNames[p])
	}
	call.removes = strings.Contains(aws.ToString(in.UpdateExpression), "REMOVE")
	for _, m := range setTarget.FindAllStringSubmatch(aws.ToString(in.UpdateExpression), -1) {
		call.sets = append(call.sets, in.ExpressionAttributeNames[m[1]])
	}
	var ccf *types.ConditionalCheckFailedException
	call.failed = errors.As(err, &ccf)
	c.mu.Lock()
	c.calls = append(c.calls, call)
	c.mu.Unlock()
	return out, err
}

// take returns the calls recorded since the last take.
func (c *updateRecorder) take() []updateCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	return out
}

// TestRenewalWritesNoReclaimIndex: a lease renewal whose reclaimAt stays in its step
// (a whole driver lease, contract.LeaseReclaimAt) is one UpdateItem that writes neither reclaim helper, so DynamoDB
// has no reclaimCandidates entry to rewrite whatever it does with a value SET unchanged;
// the renewal that crosses the step sets both, in one UpdateItem when the store left the
// run in the step before, else after the helper-free call's refusal; a stale memory costs
// a refused call, never a write; a detached run's renewals never write them. The stored
// reclaimAt follows.
func TestRenewalWritesNoReclaimIndex(t *testing.T) {
	client := dynamotest.Client(t)
	table := dynamotest.FreshTable(t, client)
	rec := &updateRecorder{Client: client}
	store := dynamostore.New(dynamostore.Config{Client: rec, Table: table})
	f := fixture{store: store, client: client, table: table}
	ctx := contract.WithTenant(t.Context(), "acme")
	runs := store.Runs()
	step := int64(contract.DefaultDriverLease)                    // the store's driver lease: reclaimAt's step
	base := contract.LeaseReclaimAt(time.Now().UnixMilli(), step) // a step's start
	_, _, err := runs.CreateClaimed(ctx, contract.CreateClaimedRun{
		NewRun: contract.NewRun{RunID: "r", ThreadID: "th", StartedAt: base}, SandboxKey: "sk_1", LeaseUntil: base + 1, Token: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	storedAt := func() int64 {
		t.Helper()
		v, ok := rawRun(t, f, "acme", "r")["reclaimAt"].(*types.AttributeValueMemberN)
		if !ok {
			t.Fatal("the running run has no reclaimAt")
		}
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	namesReclaim := func(c updateCall) bool {
		return slices.Contains(c.names, "reclaimAt") || slices.Contains(c.names, "reclaimShard")
	}
	beatBy := func(runs contract.FencedRuns, epoch, lease int64) []updateCall {
		t.Helper()
		rec.take()
		st, err := runs.Heartbeat(ctx, "r", epoch, lease)
		if err != nil || st.LeaseUntil != lease {
			t.Fatalf("Heartbeat to %d: %+v, %v", lease, st, err)
		}
		return rec.take()
	}
	beat := func(epoch, lease int64) []updateCall { t.Helper(); return beatBy(runs, epoch, lease) }

	for _, lease := range []int64{base + step/4, base + step/2, base + step} { // inside the step
		calls := beat(1, lease)
		if len(calls) != 1 || calls[0].failed || namesReclaim(calls[0]) || !slices.Contains(calls[0].names, "leaseUntil") {
			t.Fatalf("renewal to %d inside the step: calls %+v; want one UpdateItem writing leaseUntil and no reclaim helper", lease, calls)
		}
		if got := storedAt(); got != base+step {
			t.Fatalf("renewal to %d: stored reclaimAt %d, want %d", lease, got, base+step)
		}
	}
	// Past the step: this store left the run in the step before, so it sets the helpers at once.
	calls := beat(1, base+step+1)
	if len(calls) != 1 || calls[0].failed || !namesReclaim(calls[0]) {
		t.Fatalf("renewal crossing the step: calls %+v; want one UpdateItem setting the helpers", calls)
	}
	if got := storedAt(); got != base+2*step {
		t.Fatalf("renewal crossing the step: stored reclaimAt %d, want %d", got, base+2*step)
	}
	// A store that never wrote the run (another replica) cannot know: its crossing pays a
	// refused helper-free UpdateItem first.
	other := dynamostore.New(dynamostore.Config{Client: rec, Table: table}).Runs()
	calls = beatBy(other, 1, base+2*step+1)
	if len(calls) != 2 || !calls[0].failed || namesReclaim(calls[0]) || calls[1].failed || !namesReclaim(calls[1]) {
		t.Fatalf("a cold store's renewal crossing the step: calls %+v; want a refused helper-free UpdateItem, then one setting the helpers", calls)
	}
	if got := storedAt(); got != base+3*step {
		t.Fatalf("a cold store's crossing: stored reclaimAt %d, want %d", got, base+3*step)
	}
	// The first store's memory is stale now (step 2; the run is in 3): its renewal inside
	// step 3 tries the crossing first, which reclaimAt's own value refuses, and lands
	// without the helpers. A wrong memory costs a call, never a write.
	calls = beat(1, base+2*step+2)
	if len(calls) != 2 || !calls[0].failed || !namesReclaim(calls[0]) || calls[1].failed || namesReclaim(calls[1]) {
		t.Fatalf("a stale store's renewal inside the step: calls %+v; want a refused crossing, then one UpdateItem without the helpers", calls)
	}
	if got := storedAt(); got != base+3*step {
		t.Fatalf("a stale store's renewal: stored reclaimAt %d, want %d", got, base+3*step)
	}

	if _, err := runs.Detach(ctx, "r", 1, "", base+7); err != nil {
		t.Fatal(err)
	}
	for _, lease := range []int64{base + 3*step + 1, base + 5*step} {
		calls := beat(1, lease)
		if len(calls) != 1 || calls[0].failed || namesReclaim(calls[0]) {
			t.Fatalf("detached run renewed to %d: calls %+v; want one UpdateItem writing no reclaim helper", lease, calls)
		}
		if got := storedAt(); got != base+7 {
			t.Fatalf("detached run renewed to %d: stored reclaimAt %d, want its detachedSince %d", lease, got, base+7)
		}
	}
}

// TestRenewalWritesNoOtherIndex: the attributes a lease renewal's UpdateItem writes are in
// no index's key or projection but reclaimCandidates' (and that one only when the lease
// crosses a step), so a renewal costs the run item's write alone on every other index,
// runsByThread among them: it projects the run record, never leaseUntil or ver
// (docs/design.md §3.1). Read from CreateTableInput, which template.yaml is held to.
func TestRenewalWritesNoOtherIndex(t *testing.T) {
	client := dynamotest.Client(t)
	table := dynamotest.FreshTable(t, client)
	rec := &updateRecorder{Client: client}
	store := dynamostore.New(dynamostore.Config{Client: rec, Table: table})
	ctx := contract.WithTenant(t.Context(), "acme")
	step := int64(contract.DefaultDriverLease)
	base := contract.LeaseReclaimAt(time.Now().UnixMilli(), step)
	if _, _, err := store.Runs().CreateClaimed(ctx, contract.CreateClaimedRun{
		NewRun: contract.NewRun{RunID: "r", ThreadID: "th", StartedAt: base}, SandboxKey: "sk_1", LeaseUntil: base + 1, Token: "c1"}); err != nil {
		t.Fatal(err)
	}
	rec.take()
	for _, lease := range []int64{base + step/2, base + step + 1} { // inside the step, then across it
		if _, err := store.Runs().Heartbeat(ctx, "r", 1, lease); err != nil {
			t.Fatal(err)
		}
	}
	written := map[string]bool{}
	for _, c := range rec.take() {
		if c.removes {
			t.Fatalf("a renewal removes attributes: %+v", c)
		}
		for _, n := range c.sets {
			written[n] = true
		}
	}
	if !written["leaseUntil"] || !written["reclaimAt"] {
		t.Fatalf("the renewals wrote %v; want leaseUntil, and reclaimAt at the crossing", written)
	}
	for _, g := range dynamostore.CreateTableInput(table).GlobalSecondaryIndexes {
		name := aws.ToString(g.IndexName)
		if name == dynamostore.IndexReclaim {
			continue
		}
		if g.Projection.ProjectionType == types.ProjectionTypeAll {
			t.Errorf("index %s projects ALL: every renewal writes its copy", name)
			continue
		}
		in := slices.Clone(g.Projection.NonKeyAttributes)
		for _, k := range g.KeySchema {
			in = append(in, aws.ToString(k.AttributeName))
		}
		for _, a := range in {
			if written[a] {
				t.Errorf("index %s holds %s, which a renewal writes", name, a)
			}
		}
	}
}
