package bench

import (
	"context"
	"strconv"
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// BenchmarkHot measures the hot operations through keeper on both backends:
//
//	go test -run '^$' -bench Hot ./cmd/sandkeep/internal/bench/                  # memstore (dynamostore skipped)
//	SANDKEEP_DYNAMODB_ENDPOINT=http://127.0.0.1:PORT go test ...  # dynamostore too
//
// `sandkeep bench` is the docs/design.md §11 report (percentiles, calls, bare calls); this is the quick
// per-op figure for profiling (-cpuprofile) and for comparing changes with benchstat.
func BenchmarkHot(b *testing.B) {
	b.Run("memstore", func(b *testing.B) {
		hot(b, func(*testing.B) contract.Backend { return memstore.New() })
	})
	b.Run("dynamostore", func(b *testing.B) {
		client := dynamotest.Client(b) // skips without an endpoint
		hot(b, func(b *testing.B) contract.Backend {
			return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(b, client)})
		})
	})
}

// hotEnv is a keeper on a fresh backend with one run started on a thread whose sandbox
// exists, so further starts on the thread take the fast path.
type hotEnv struct {
	ctx   context.Context
	k     *keeper.Keeper
	first keeper.StartResult
}

func newHotEnv(b *testing.B, backend func(*testing.B) contract.Backend) *hotEnv {
	b.Helper()
	k, err := keeper.New(keeper.Config{Backend: backend(b),
		Providers: []contract.Provider{counting.New(ProviderName)}})
	if err != nil {
		b.Fatal(err)
	}
	e := &hotEnv{ctx: contract.WithTenant(b.Context(), Tenant), k: k}
	if e.first, err = k.Start(e.ctx, hotStart("first")); err != nil {
		b.Fatal(err)
	}
	return e
}

func hotStart(run string) keeper.StartInput {
	return keeper.StartInput{RunID: run, ThreadID: "hot", Sandbox: keeper.Setup{ID: "bench", Provider: ProviderName}}
}

func hot(b *testing.B, backend func(*testing.B) contract.Backend) {
	b.Run("StartResumed", func(b *testing.B) {
		e := newHotEnv(b, backend)
		for i := 0; b.Loop(); i++ {
			res, err := e.k.Start(e.ctx, hotStart("r"+strconv.Itoa(i)))
			if err != nil || res.Outcome != keeper.OutcomeResumed {
				b.Fatalf("start: %v (outcome %s)", err, res.Outcome)
			}
		}
	})
	b.Run("Heartbeat", func(b *testing.B) {
		e := newHotEnv(b, backend)
		for b.Loop() {
			if _, err := e.k.Heartbeat(e.ctx, "first", e.first.Driver.Epoch); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Append", func(b *testing.B) {
		e := newHotEnv(b, backend)
		cur, ev := e.first.Driver.Cursor, []contract.Event{{Data: eventData(DefaultAppendBytes)}}
		for b.Loop() {
			res, err := e.k.Append(e.ctx, "first", cur, ev)
			if err != nil {
				b.Fatal(err)
			}
			cur = res.Cursor
		}
	})
	b.Run("ReadFromNext", func(b *testing.B) {
		e := newHotEnv(b, backend)
		ev := []contract.Event{{Data: eventData(DefaultAppendBytes)}}
		if _, err := e.k.Append(e.ctx, "first", e.first.Driver.Cursor, ev); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			page, err := e.k.Read(e.ctx, "first", 0, 0, 0)
			if err != nil || len(page.Events) != 1 {
				b.Fatalf("read: %v (%d events)", err, len(page.Events))
			}
		}
	})
	b.Run("Attach", func(b *testing.B) {
		e := newHotEnv(b, backend)
		for b.Loop() {
			if _, err := e.k.Attach(e.ctx, "first"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
