package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/contract/refstore"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore/callcount"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// BenchmarkStoreRoutes measures the store routes (docs/bench.md, docs/design.md §8) over
// real HTTP (loopback TCP, the handler `sandkeep dev` serves) on dynamostore against the
// local DynamoDB, beside the same operations on the Go stores directly: p50/p99 per
// operation and DynamoDB calls per operation. Run:
//
//	go test -run '^$' -bench StoreRoutes -benchtime 200x ./shared/api/httpapi/
func BenchmarkStoreRoutes(b *testing.B) {
	counter := callcount.New()
	client := dynamotest.Client(b, func(o *dynamodb.Options) { counter.Attach(o) })
	store := dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(b, client)})
	k, err := keeper.New(keeper.Config{Backend: store, Providers: []contract.Provider{localprocess.New(b.TempDir())}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(New(Config{Keeper: k, Auth: DevAuth{}, CursorKey: []byte("bench cursor key, 32 bytes long!"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	defer srv.Close()
	hc := srv.Client()
	call := func(method, path, body string, want int) {
		r, err := http.NewRequest(method, srv.URL+path, bytes.NewBufferString(body))
		if err != nil {
			b.Fatal(err)
		}
		if body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(r)
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, out)
		}
	}
	ctx := contract.WithTenant(context.Background(), DefaultDevTenant)
	inst := refstore.Instances(store.Instances())
	runs := refstore.Runs(store.Runs())
	locks := store.Locks().(contract.LeaseLocks)
	rec := contract.InstanceRecord{Key: "bench-key", Provider: "p", ProviderSandboxID: "sb", ThreadID: "t", UpdatedAt: 1}
	if err := inst.Upsert(ctx, rec); err != nil {
		b.Fatal(err)
	}
	if _, err := runs.CreateOrResume(ctx, contract.NewRun{RunID: "bench-run", ThreadID: "t", StartedAt: 1, AppDriven: true}); err != nil {
		b.Fatal(err)
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	type op struct {
		name         string
		http, direct func(i int)
	}
	instBody := `{"provider":"p","providerSandboxId":"sb","threadId":"t","updatedAt":2,"latestSnapshotId":"s"}`
	ops := []op{
		{"instance get",
			func(int) { call("GET", "/v1/store/instances/bench-key", "", 200) },
			func(int) { _, err := inst.Get(ctx, "bench-key"); must(err) }},
		{"instance upsert",
			func(int) { call("PUT", "/v1/store/instances/bench-key", instBody, 204) },
			func(int) { must(inst.Upsert(ctx, rec)) }},
		{"run createOrResume (new run)",
			func(i int) {
				call("POST", "/v1/store/runs", fmt.Sprintf(`{"runId":"h-%d","threadId":"t","startedAt":1}`, i), 200)
			},
			func(i int) {
				_, err := runs.CreateOrResume(ctx, contract.NewRun{RunID: fmt.Sprintf("d-%d", i), ThreadID: "t", StartedAt: 1, AppDriven: true})
				must(err)
			}},
		{"run update (durable fields)",
			func(i int) {
				call("PATCH", "/v1/store/runs/bench-run", fmt.Sprintf(`{"detachedSince":%d,"driverEpoch":%d}`, i, i), 204)
			},
			func(i int) {
				must(runs.Update(ctx, "bench-run", contract.RunPatch{DetachedSince: contract.Set(int64(i)), DriverEpoch: contract.Set(int64(i))}))
			}},
		{"lock acquire+release",
			func(int) {
				r, err := hc.Post(srv.URL+"/v1/store/locks/bench-lock/acquire", "application/json", bytes.NewBufferString(`{}`))
				must(err)
				var tok struct{ Token string }
				body, _ := io.ReadAll(r.Body)
				r.Body.Close()
				if r.StatusCode != 200 {
					b.Fatalf("acquire: %d %s", r.StatusCode, body)
				}
				must(json.Unmarshal(body, &tok))
				call("POST", "/v1/store/locks/bench-lock/release", `{"token":"`+tok.Token+`"}`, 204)
			},
			func(i int) {
				owner := fmt.Sprintf("owner-%d", i)
				_, ok, err := locks.TryAcquire(ctx, "bench-lock", owner)
				must(err)
				if !ok {
					b.Fatal("direct acquire refused")
				}
				must(locks.Release(ctx, "bench-lock", owner))
			}},
	}
	for _, o := range ops {
		for _, side := range []struct {
			name string
			fn   func(int)
		}{{"http", o.http}, {"direct", o.direct}} {
			b.Run(o.name+"/"+side.name, func(b *testing.B) {
				for i := range 10 { // warm-up: connections, the engine
					side.fn(1_000_000_000 + i)
				}
				counter.Reset()
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					side.fn(i + b.N*1000) // distinct ids across runs of b.N
					lat = append(lat, time.Since(t0))
				}
				b.StopTimer()
				slices.Sort(lat)
				pct := func(p float64) float64 {
					return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
				}
				b.ReportMetric(pct(0.50), "p50-ms")
				b.ReportMetric(pct(0.99), "p99-ms")
				b.ReportMetric(float64(counter.Total())/float64(b.N), "ddb-calls/op")
			})
		}
	}
}
