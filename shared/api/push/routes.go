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
		if err := r.unsubscribe(ctx, connID, req.RunID); err != nil {
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
	// Then the watch marker, before the catch-up reads: a deliverer that listed the run's
	// subscriptions before ours lists them again at the first write that meets the marker,
	// and a write it does not list for lies below the marker, so in our catch-up (subsCache).
	if err := markWatch(ctx, d.cfg.Log, req.RunID); err != nil {
		// Without its marker the subscription may miss posts and never learn it: end it.
		if uerr := r.cfg.Store.Unsubscribe(context.WithoutCancel(ctx), connID, req.RunID); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return r.answer(ctx, connID, req.RunID, requestID, err)
	}
	if err := d.send(ctx, connID, wire.PushMessage{Type: wire.PushSubscribed, RunID: req.RunID, Next: after}); err != nil {
		return settled(err)
	}
	return settled(d.pages(ctx, req.RunID, after, func(msgs []wire.PushMessage) error {
		return d.postAll(ctx, req.RunID, connID, msgs)
	}))
}

// unsubscribe ends connID's subscription to runID, then puts a watch marker so deliverers
// holding it in their cached lists list again (a run that is not the caller's gets none).
func (r *Routes) unsubscribe(ctx context.Context, connID, runID string) error {
	if err := r.cfg.Store.Unsubscribe(ctx, connID, runID); err != nil {
		return err
	}
	if _, err := r.cfg.Keeper.Get(ctx, runID); err != nil {
		if errors.Is(err, contract.ErrUnknownRun) {
			return nil // unsubscribing from no run of the caller's ends nothing more
		}
		return err
	}
	return markWatch(ctx, r.cfg.Deliverer.cfg.Log, runID)
}

// markWatch puts a watch marker on runID's log; a closed log needs none (the catch-up
// meets its close, and no write follows it).
func markWatch(ctx context.Context, log contract.EventLog, runID string) error {
	if err := log.MarkWatch(ctx, runID); err != nil && !errors.Is(err, contract.ErrLogClosed) {
		return fmt.Errorf("push: watch marker on %q: %w", runID, err)
	}
	return nil
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
