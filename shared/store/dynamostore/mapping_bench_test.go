package dynamostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// replay is a client option recording, then replaying, the results of DynamoDB calls at
// the first step of the SDK's stack: while recording, every call goes to the engine and
// its result is kept; while replaying, the calls return the recorded results in order
// without a request. A store primitive measured in replay costs what it spends outside its
// calls (item and expression mapping, decoding, its own logic) plus the SDK's per-call
// set-up, which no change of the store's mapping alters.
type replay struct {
	mu        sync.Mutex
	replaying bool
	calls     []replayed
	next      int
}

type replayed struct {
	op  string
	out any
	err error
}

func (r *replay) attach(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(s *middleware.Stack) error {
		return s.Initialize.Add(middleware.InitializeMiddlewareFunc("sandkeepReplay",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				op := middleware.GetOperationName(ctx)
				r.mu.Lock()
				defer r.mu.Unlock()
				if !r.replaying {
					out, md, err := next.HandleInitialize(ctx, in)
					r.calls = append(r.calls, replayed{op: op, out: out.Result, err: err})
					return out, md, err
				}
				if len(r.calls) == 0 {
					return middleware.InitializeOutput{}, middleware.Metadata{}, errors.New("replay: nothing recorded")
				}
				c := r.calls[r.next%len(r.calls)]
				r.next++
				if c.op != op {
					return middleware.InitializeOutput{}, middleware.Metadata{}, fmt.Errorf("replay: %s called where %s was recorded", op, c.op)
				}
				return middleware.InitializeOutput{Result: c.out}, middleware.Metadata{}, c.err
			}), middleware.Before)
	})
}

// BenchmarkMapping measures each store primitive's cost outside its DynamoDB calls: the
// state is set up on the engine, one invocation of the primitive is recorded, and the
// measured invocations replay its calls' results (the per-operation figure of the
// DynamoDB mapping; docs/bench.md). Run it with
//
//	go test -run '^$' -bench Mapping -benchmem ./shared/store/dynamostore/
func BenchmarkMapping(b *testing.B) {
	rec := &replay{}
	client := dynamotest.Client(b, rec.attach)
	table := dynamotest.FreshTable(b, client)
	store := dynamostore.New(dynamostore.Config{Client: client, Table: table})
	ctx := contract.WithTenant(context.Background(), "bench")
	now := time.Now().UnixMilli()
	runs, inst, intents, log := store.Runs(), store.Instances(), store.Intents(), store.Log()
	n := 0
	fresh := func(prefix string) string { n++; return fmt.Sprintf("%s-%d", prefix, n) }
	event := []contract.Event{{Src: 1, Data: []byte(`"` + strings.Repeat("x", 1022) + `"`)}} // 1 KiB
	claimedRun := func(id string) contract.CreateClaimedRun {
		return contract.CreateClaimedRun{
			NewRun: contract.NewRun{RunID: id, ThreadID: "thread-1", StartedAt: now}, SandboxKey: "key-1",
			ProviderSandboxID: "sb-1", LeaseUntil: now + 60_000, Token: "tok-" + id,
		}
	}
	claimed := func(b *testing.B) (string, int64) {
		id := fresh("run")
		st, _, err := runs.CreateClaimed(ctx, claimedRun(id))
		if err != nil {
			b.Fatal(err)
		}
		return id, st.Epoch()
	}
	row := func(b *testing.B) string {
		key := fresh("key")
		if err := inst.CreateRow(ctx, contract.InstanceRecord{
			Key: key, Provider: "local", ProviderSandboxID: "sb-1", LatestSnapshotID: "snap-1",
			ThreadID: "thread-1", LatestRunID: "run-0", UpdatedAt: now,
		}, "inc-"+key); err != nil {
			b.Fatal(err)
		}
		return key
	}

	cases := []struct {
		name string
		// setup prepares the engine's state and returns the primitive to measure.
		setup func(b *testing.B) func() error
	}{
		// The SDK's own per-call set-up, for scale: one bare GetItem, no store code.
		{"sdk/GetItem(bare)", func(b *testing.B) func() error {
			key := row(b)
			in := &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true), Key: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: "bench#INST#" + key}, "sk": &types.AttributeValueMemberS{Value: "INST"},
			}}
			return func() error { _, err := client.GetItem(ctx, in); return err }
		}},
		{"instances/CreateRow", func(b *testing.B) func() error {
			key := fresh("key")
			return func() error {
				return inst.CreateRow(ctx, contract.InstanceRecord{Key: key, Provider: "local", ProviderSandboxID: "sb-1",
					ThreadID: "thread-1", LatestRunID: "run-1", UpdatedAt: now}, "inc-"+key)
			}
		}},
		{"instances/GetRow", func(b *testing.B) func() error {
			key := row(b)
			return func() error { _, err := inst.GetRow(ctx, key); return err }
		}},
		{"instances/Touch", func(b *testing.B) func() error {
			key := row(b)
			return func() error { return inst.Touch(ctx, key, "sb-1", "run-2", now+1) }
		}},
		{"intents/Put", func(b *testing.B) func() error {
			key := fresh("key")
			return func() error { return intents.Put(ctx, key, 7, now) }
		}},
		{"intents/Get", func(b *testing.B) func() error {
			key := fresh("key")
			if err := intents.Put(ctx, key, 7, now); err != nil {
				b.Fatal(err)
			}
			return func() error { _, err := intents.Get(ctx, key); return err }
		}},
		{"locks/WithLock", func(b *testing.B) func() error {
			key := fresh("key")
			return func() error { return store.Locks().WithLock(ctx, key, func(context.Context) error { return nil }) }
		}},
		{"runs/CreateClaimed", func(b *testing.B) func() error {
			id := fresh("run")
			return func() error {
				_, _, err := runs.CreateClaimed(ctx, claimedRun(id))
				return err
			}
		}},
		{"runs/State", func(b *testing.B) func() error {
			id, _ := claimed(b)
			return func() error { _, err := runs.State(ctx, id); return err }
		}},
		{"runs/Claim", func(b *testing.B) func() error {
			id, _ := claimed(b)
			return func() error {
				_, err := runs.Claim(ctx, id, contract.Claim{Token: "claim-" + id, LeaseUntil: now + 90_000, ClearDetached: true})
				return err
			}
		}},
		{"runs/Heartbeat", func(b *testing.B) func() error {
			id, epoch := claimed(b)
			return func() error { _, err := runs.Heartbeat(ctx, id, epoch, now+120_000); return err }
		}},
		{"runs/Detach", func(b *testing.B) func() error {
			id, epoch := claimed(b)
			return func() error { _, err := runs.Detach(ctx, id, epoch, "key-2", now+1); return err }
		}},
		{"runs/UpdateFenced(finish)", func(b *testing.B) func() error {
			id, epoch := claimed(b)
			p := contract.RunPatch{
				Status:     contract.Set(contract.StatusCompleted),
				FinishedAt: contract.Set(now + 5),
				Usage:      contract.Set(json.RawMessage(`{"tokens":12}`)),
			}
			return func() error { _, err := runs.UpdateFenced(ctx, id, epoch, p); return err }
		}},
		// A patch setting detachedSince takes the general path: GetItem, then a PutItem of
		// the whole item conditioned on its version.
		{"runs/UpdateFenced(general)", func(b *testing.B) func() error {
			id, epoch := claimed(b)
			p := contract.RunPatch{DetachedSince: contract.Set(now + 1)}
			return func() error { _, err := runs.UpdateFenced(ctx, id, epoch, p); return err }
		}},
		{"log/Fence", func(b *testing.B) func() error {
			id := fresh("run")
			return func() error { _, err := log.Fence(ctx, id, 1); return err }
		}},
		{"log/Append(1KiB)", func(b *testing.B) func() error {
			id := fresh("run")
			res, err := log.Fence(ctx, id, 1)
			if err != nil {
				b.Fatal(err)
			}
			return func() error { _, err := log.Append(ctx, id, res.Cursor, event); return err }
		}},
		{"log/Read(from next)", func(b *testing.B) func() error {
			id := fresh("run")
			res, err := log.Fence(ctx, id, 1)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := log.Append(ctx, id, res.Cursor, event); err != nil {
				b.Fatal(err)
			}
			return func() error { _, _, _, err := log.Read(ctx, id, res.Last, 100); return err }
		}},
		{"batch/GetStateAndRow", func(b *testing.B) func() error {
			id, _ := claimed(b)
			key := row(b)
			return func() error { _, _, err := store.GetStateAndRow(ctx, id, key); return err }
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			rec.mu.Lock()
			rec.replaying, rec.calls, rec.next = false, nil, 0
			rec.mu.Unlock()
			op := c.setup(b)
			rec.mu.Lock()
			rec.calls = nil // only the measured primitive's calls are replayed
			rec.mu.Unlock()
			if err := op(); err != nil {
				b.Fatal(err)
			}
			rec.mu.Lock()
			rec.replaying = true
			rec.mu.Unlock()
			b.ReportAllocs()
			for b.Loop() {
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			rec.mu.Lock()
			rec.replaying = false
			rec.mu.Unlock()
		})
	}
}
