package testkit

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// RunIntentStoreConformance proves the resolve intents (docs/design.md §2.7): Put replaces only a lower
// token, Record and Drop act only under the intent's token, every same-token retry after a
// lost response succeeds, and intents are tenant-scoped.
func RunIntentStoreConformance(t *testing.T, newBackend NewBackend) {
	t.Helper()
	cfRunCases(t, newBackend, itCases())
}

const itTenant = "tenant-a"

// itStore returns the intent store; fresh fails a case whose backend has none.
func itStore(t *testing.T, b contract.Backend) contract.IntentStore {
	t.Helper()
	return b.Intents()
}

// itWant fails unless the open intent of key is exactly want (nil = none).
func itWant(t *testing.T, s contract.IntentStore, tenant, key string, want *contract.Intent, what string) {
	t.Helper()
	got, err := s.Get(ctxFor(t, tenant), key)
	cfNoErr(t, err, "Get intent "+key)
	switch {
	case want == nil && got != nil:
		t.Fatalf("%s: intent %q = %s, want none", what, key, cfJSON(got))
	case want != nil && got == nil:
		t.Fatalf("%s: intent %q = none, want %s", what, key, cfJSON(want))
	case want != nil && *got != *want:
		t.Fatalf("%s: intent %q = %s, want %s", what, key, cfJSON(got), cfJSON(want))
	}
}

func itCases() []cfCase {
	return []cfCase{
		{"Get of a key without an intent returns nil", func(t *testing.T, b contract.Backend) {
			itWant(t, itStore(t, b), itTenant, "k", nil, "no intent yet")
		}},
		{"Put opens an intent and Get returns it", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			cfNoErr(t, s.Put(ctxFor(t, itTenant), "k", 7, 100), "Put")
			itWant(t, s, itTenant, "k", &contract.Intent{Key: "k", Token: 7, CreatedAt: 100}, "after Put")
			itWant(t, s, itTenant, "other", nil, "another key")
		}},
		{"Put retried with the same token succeeds and changes nothing", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			ctx := ctxFor(t, itTenant)
			cfNoErr(t, s.Put(ctx, "k", 7, 100), "Put")
			cfNoErr(t, s.Put(ctx, "k", 7, 100), "retried Put")
			itWant(t, s, itTenant, "k", &contract.Intent{Key: "k", Token: 7, CreatedAt: 100}, "after the retry")
		}},
		{"Put with a higher token replaces the intent", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			ctx := ctxFor(t, itTenant)
			cfNoErr(t, s.Put(ctx, "k", 7, 100), "Put 7")
			cfNoErr(t, s.Record(ctx, "k", 7, "sb-7"), "Record 7")
			cfNoErr(t, s.Put(ctx, "k", 8, 200), "Put 8")
			itWant(t, s, itTenant, "k", &contract.Intent{Key: "k", Token: 8, CreatedAt: 200}, "after the replacing Put")
			cfIs(t, s.Record(ctx, "k", 7, "sb-late"), contract.ErrConflict, "Record by the replaced token")
			cfIs(t, s.Drop(ctx, "k", 7), contract.ErrConflict, "Drop by the replaced token")
			itWant(t, s, itTenant, "k", &contract.Intent{Key: "k", Token: 8, CreatedAt: 200}, "after the replaced token's writes")
		}},
		{"Put with a lower token is refused", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			ctx := ctxFor(t, itTenant)
			cfNoErr(t, s.Put(ctx, "k", 8, 200), "Put 8")
			cfNoErr(t, s.Record(ctx, "k", 8, "sb-8"), "Record 8")
			cfIs(t, s.Put(ctx, "k", 7, 300), contract.ErrConflict, "Put 7 over 8")
			itWant(t, s, itTenant, "k", &contract.Intent{Key: "k", Token: 8, ProviderSandboxID: "sb-8", CreatedAt: 200}, "after the refused Put")
		}},
		{"Record sets the sandbox id only under the intent's token", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			ctx := ctxFor(t, itTenant)
			cfIs(t, s.Record(ctx, "k", 7, "sb-1"), contract.ErrConflict, "Record without an intent")
			itWant(t, s, itTenant, "k", nil, "a refused Record creates nothing")
			cfNoErr(t, s.Put(ctx, "k", 7, 100), "Put")
			cfIs(t, s.Record(ctx, "k", 6, "sb-x"), contract.ErrConflict, "Record with a lower token")
			cfIs(t, s.Record(ctx, "k", 8, "sb-x"), contract.ErrConflict, "Record with a higher token")
			itWant(t, s, itTenant, "k", &contract.Intent{Key: "k", Token: 7, CreatedAt: 100}, "after the refused Records")
			cfNoErr(t, s.Record(ctx, "k", 7, "sb-1"), "Record")
			want := contract.Intent{Key: "k", Token: 7, ProviderSandboxID: "sb-1", CreatedAt: 100}
			itWant(t, s, itTenant, "k", &want, "after Record")
			cfNoErr(t, s.Record(ctx, "k", 7, "sb-1"), "retried Record")
			itWant(t, s, itTenant, "k", &want, "after the retried Record")
		}},
		{"Drop removes the intent only under its token", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			ctx := ctxFor(t, itTenant)
			cfNoErr(t, s.Put(ctx, "k", 7, 100), "Put")
			cfNoErr(t, s.Record(ctx, "k", 7, "sb-1"), "Record")
			want := contract.Intent{Key: "k", Token: 7, ProviderSandboxID: "sb-1", CreatedAt: 100}
			cfIs(t, s.Drop(ctx, "k", 6), contract.ErrConflict, "Drop with a lower token")
			cfIs(t, s.Drop(ctx, "k", 8), contract.ErrConflict, "Drop with a higher token")
			itWant(t, s, itTenant, "k", &want, "after the refused Drops")
			cfNoErr(t, s.Drop(ctx, "k", 7), "Drop")
			itWant(t, s, itTenant, "k", nil, "after Drop")
			cfNoErr(t, s.Drop(ctx, "k", 7), "retried Drop")
			itWant(t, s, itTenant, "k", nil, "after the retried Drop")
			cfNoErr(t, s.Put(ctx, "k", 7, 300), "Put again after Drop")
			itWant(t, s, itTenant, "k", &contract.Intent{Key: "k", Token: 7, CreatedAt: 300}, "a new intent after Drop")
		}},
		{"Drop of a missing intent succeeds", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			cfNoErr(t, s.Drop(ctxFor(t, itTenant), "absent", 1), "Drop absent")
			itWant(t, s, itTenant, "absent", nil, "after Drop absent")
		}},
		{"intents are tenant-scoped", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			ctxA, ctxB := ctxFor(t, "tenant-a"), ctxFor(t, "tenant-b")
			cfNoErr(t, s.Put(ctxA, "k", 9, 100), "Put in A")
			itWant(t, s, "tenant-b", "k", nil, "B sees no intent")
			cfNoErr(t, s.Put(ctxB, "k", 1, 200), "Put a lower token in B")
			cfIs(t, s.Record(ctxB, "k", 9, "sb-b"), contract.ErrConflict, "Record in B with A's token")
			cfNoErr(t, s.Record(ctxB, "k", 1, "sb-b"), "Record in B")
			cfNoErr(t, s.Drop(ctxB, "k", 1), "Drop in B")
			itWant(t, s, "tenant-a", "k", &contract.Intent{Key: "k", Token: 9, CreatedAt: 100}, "A after B's writes")
			itWant(t, s, "tenant-b", "k", nil, "B after its Drop")
			cfNoErr(t, s.Drop(ctxFor(t, "tenant-c"), "k", 9), "Drop in C (missing there)")
			itWant(t, s, "tenant-a", "k", &contract.Intent{Key: "k", Token: 9, CreatedAt: 100}, "A after C's Drop")
		}},
		{"an invalid tenant is ErrInvalid", func(t *testing.T, b contract.Backend) {
			s := itStore(t, b)
			for _, bad := range cfBadTenants() {
				ctx := ctxFor(t, bad)
				_, err := s.Get(ctx, "k")
				cfIs(t, err, contract.ErrInvalid, "Get under "+bad)
				cfIs(t, s.Put(ctx, "k", 1, 1), contract.ErrInvalid, "Put under "+bad)
				cfIs(t, s.Record(ctx, "k", 1, "sb"), contract.ErrInvalid, "Record under "+bad)
				cfIs(t, s.Drop(ctx, "k", 1), contract.ErrInvalid, "Drop under "+bad)
			}
		}},
	}
}
