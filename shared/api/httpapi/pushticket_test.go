package httpapi

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// TestPushTicketRoute: POST /v1/push/ticket (docs/design.md §8.1). Where no push endpoint
// takes tickets (the dev server; an IAM deployment) it is 501 unsupported, as the other
// routes of a feature a server does not offer (GET /v1/reaper/sweeps). With one (a JWT
// deployment) it answers a ticket of the caller's own tenant, expiring within
// shiptoken.PushTicketTTL, for that endpoint; a body other than {} is 400 invalid and an
// unauthenticated caller 401, before anything is minted.
func TestPushTicketRoute(t *testing.T) {
	t.Parallel()
	dev := newEnv(t, DevAuth{}, memstore.New())
	dev.do(req{method: post, path: wire.PushTicketPath, tenant: "acme", body: map[string]any{}}).
		wantProblem(t, http.StatusNotImplemented, CodeUnsupported)

	const pushURL = "wss://push.example/dev"
	key := []byte("test cursor key, 32 bytes long!!")
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []sandboxProvider{localprocess.New(t.TempDir())}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, JWTAuth{}, nil)
	e.h = New(Config{Keeper: k, Auth: JWTAuth{}, CursorKey: key, Logger: slog.New(slog.DiscardHandler), PushTicketURL: pushURL})
	for _, raw := range []string{"user@example.com", "someone-else"} {
		before := time.Now()
		r := e.do(req{method: post, path: wire.PushTicketPath, claims: map[string]string{"tenant": raw}, tenant: "victim", body: map[string]any{}})
		got := decode[wire.PushTicketResponse](t, r.wantStatusRaw(t, http.StatusOK))
		tenant, err := shiptoken.VerifyPushTicket(key, got.Ticket, time.Now())
		if err != nil || tenant != MapTenant(raw) || got.PushURL != pushURL {
			t.Fatalf("%s: ticket of tenant %q (%v) for %q; want %q", raw, tenant, err, got.PushURL, MapTenant(raw))
		}
		if exp := time.UnixMilli(got.ExpiresAt); exp.Before(before) || exp.After(time.Now().Add(shiptoken.PushTicketTTL)) {
			t.Fatalf("%s: expires at %v, not within %v", raw, exp, shiptoken.PushTicketTTL)
		}
		if _, err := shiptoken.VerifyPushTicket(key, got.Ticket, time.UnixMilli(got.ExpiresAt)); err == nil {
			t.Fatalf("%s: the ticket is still good at its expiresAt", raw)
		}
	}
	e.do(req{method: post, path: wire.PushTicketPath, claims: map[string]string{"tenant": "acme"}, body: map[string]any{"tenant": "other"}, specSays: "invalid"}).
		wantProblem(t, http.StatusBadRequest, CodeInvalid)
	e.do(req{method: post, path: wire.PushTicketPath, claims: map[string]string{"sub": "u-1"}, body: map[string]any{}}).
		wantProblem(t, http.StatusUnauthorized, CodeUnauthenticated)
}
