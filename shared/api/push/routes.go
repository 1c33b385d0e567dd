package push

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// RoutesConfig configures Routes. Keeper, Store and Deliverer are required.
type RoutesConfig struct {
	Keeper    *keeper.Keeper // resolves a subscribed run in the caller's tenant
	Store     contract.PushStore
	Deliverer *Deliverer
	// MaxConnections bounds a tenant's open connections (default wire.DefaultMaxConnections).
	MaxConnections int
	// MaxSubscriptions bounds a connection's subscriptions (default wire.DefaultMaxSubscriptions).
	MaxSubscriptions int
	Logger           *slog.Logger // default slog.Default()
}

// Routes are the WebSocket API's routes as plain Go: $connect (Connect), $disconnect
// (Disconnect) and a client's messages (Message), answered by posting to the connection.
type Routes struct{ cfg RoutesConfig }

// NewRoutes returns the routes of cfg.
func NewRoutes(cfg RoutesConfig) *Routes {
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = wire.DefaultMaxConnections
	}
	if cfg.MaxSubscriptions <= 0 {
		cfg.MaxSubscriptions = wire.DefaultMaxSubscriptions
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Routes{cfg: cfg}
}

// Connect opens connID for tenant, which the caller has authenticated: an error is the
// refusal of the upgrade (httpapi.PushRefusal 429 too-many-connections for a full tenant).
func (r *Routes) Connect(ctx context.Context, tenant, connID string) error {
	err := r.cfg.Store.Connect(contract.WithTenant(ctx, tenant), connID, r.cfg.MaxConnections)
	if errors.Is(err, contract.ErrConflict) {
		return httpapi.PushRefusal(http.StatusTooManyRequests, httpapi.CodeTooManyConnections,
			fmt.Sprintf("the tenant holds %d push connections, its bound", r.cfg.MaxConnections))
	}
	return err
}

// Disconnect removes connID and its subscriptions (the push service's $disconnect).
func (r *Routes) Disconnect(ctx context.Context, connID string) error {
	tenant, ok, err := r.cfg.Store.ConnectionTenant(ctx, connID)
	if err != nil || !ok {
		return err
	}
	return r.cfg.Store.Disconnect(contract.WithTenant(ctx, tenant), connID)
}

// Message serves one client message on connID: a subscribe is answered subscribed, then
// the run's stored events after its offset in pages, then the later ones as writers store
// them (the deliverer); a later batch may also reach the client before the catch-up's
// pages, or twice, and the client orders them by offset (After, docs/design.md §8.1);
// an unsubscribe ends the subscription; anything wrong is an error message carrying the
// HTTP API's problem (requestID is the push service's). The error returned is the
// infrastructure's, already answered.
func (r *Routes) Message(ctx context.Context, connID, requestID string, body []byte) error {
	tenant, ok, err := r.cfg.Store.ConnectionTenant(ctx, connID)
	if err == nil && !ok {
		err = httpapi.PushRefusal(http.StatusServiceUnavailable, httpapi.CodeUnavailable, "the connection is not open; connect again")
	}
	if err != nil {
		return r.answer(ctx, connID, "", requestID, err)
	}
	ctx = contract.WithTenant(ctx, tenant)
	req, err := httpapi.DecodePushRequest(body)
	if err != nil {
		return r.answer(ctx, connID, req.RunID, requestID, err)
	}
	if req.Type == wire.PushUnsubscribe {
		if err := r.cfg.Store.Unsubscribe(ctx, connID, req.RunID); err != nil {
			return r.answer(ctx, connID, req.RunID, requestID, err)
		}
		return nil
	}
	// The run must be the caller's: another tenant's and none look alike (unknown-run).
	if _, err := r.cfg.Keeper.Get(ctx, req.RunID); err != nil {
		return r.answer(ctx, connID, req.RunID, requestID, err)
	}
	d, after := r.cfg.Deliverer, *req.After
	// Stored before the catch-up reads: a batch stored after that read is posted to it
	// by its writer, whose Query comes after its own write (docs/design.md §8.1).
	err = r.cfg.Store.Subscribe(ctx, connID, req.RunID, after, r.cfg.MaxSubscriptions)
	switch {
	case errors.Is(err, contract.ErrConflict):
		err = httpapi.PushRefusal(http.StatusTooManyRequests, httpapi.CodeTooManySubscriptions,
			fmt.Sprintf("the connection holds %d subscriptions, its bound; unsubscribe first", r.cfg.MaxSubscriptions))
	case errors.Is(err, contract.ErrUnknownRun): // the connection closed meanwhile
		err = httpapi.PushRefusal(http.StatusServiceUnavailable, httpapi.CodeUnavailable, "the connection is not open; connect again")
	}
	if err != nil {
		return r.answer(ctx, connID, req.RunID, requestID, err)
	}
	if err := d.send(ctx, connID, wire.PushMessage{Type: wire.PushSubscribed, RunID: req.RunID, Next: after}); err != nil {
		return settled(err)
	}
	return settled(d.pages(ctx, req.RunID, after, func(msgs []wire.PushMessage) error {
		return d.postAll(ctx, req.RunID, connID, msgs)
	}))
}

// answer posts the error message of err (an infrastructure error is logged, not told).
func (r *Routes) answer(ctx context.Context, connID, runID, requestID string, err error) error {
	m, infra := httpapi.PushError(runID, err, requestID)
	if perr := r.cfg.Deliverer.send(ctx, connID, m); perr != nil {
		return settled(perr)
	}
	if infra {
		r.cfg.Logger.LogAttrs(ctx, slog.LevelError, "push", slog.String("requestId", requestID),
			slog.String("runId", runID), slog.String("error", err.Error()))
		return err
	}
	return nil
}
