package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sandkeep/sandkeep/shared/journal"
	"github.com/sandkeep/sandkeep/shared/keeper"
	"github.com/sandkeep/sandkeep/shared/sandbox"
	"github.com/sandkeep/sandkeep/shared/shiptoken"
)

// Start starts a shipper of runID in psid at the epoch of at (at.Epoch set): a ship token
// for (the context's tenant, runID, at.Epoch) and the URL go to its environment alone, and
// it learns from its first answer where the log stands (docs/design.md §8.3).
// started=false: the sandbox cannot run one (no curl, the API unreachable from it).
func (c *ShipConfig) Start(ctx context.Context, k *keeper.Keeper, ex sandbox.Executor, psid, dir, runID string, at sandbox.Cursor) (bool, error) {
	tenant, err := sandbox.Tenant(ctx)
	if err != nil {
		return false, err
	}
	ttl := ShipTokenLeases * k.DriverLease()
	o := c.Options
	if o.Beat <= 0 {
		o.Beat = k.DriverLease() / 3
	}
	if o.GiveUp <= 0 {
		o.GiveUp = ttl
	}
	token := shiptoken.Mint(c.Key, shiptoken.Claims{Tenant: tenant, RunID: runID, Epoch: at.Epoch,
		Expires: k.Config().Now().Add(ttl)})
	return journal.StartShipper(ctx, ex, psid, dir, runID, c.URL, token, o)
}

// ShipAttach is an attach's answer in a world with shippers.
type ShipAttach struct {
	keeper.AttachResult
	// Following: a live shipper holds the run, so nothing was claimed (the epoch is the
	// shipper's; the result carries no cursor).
	Following bool
	Shipping  string // ShippingSandbox or ShippingHost
}

// Shipper is what a sandbox shows of a run's shipper.
type Shipper int

const (
	ShipperNone Shipper = iota // no pid file: the run was never shipped, or its shipper ended it
	ShipperDead                // a pid file naming no live process: killed, out of memory
	ShipperLive
)

// ShipperOf reads the run's .ship.pid and probes the process it names, in one shell call.
func ShipperOf(ctx context.Context, ex sandbox.Executor, psid, dir, runID string) (Shipper, error) {
	p, err := journal.PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return ShipperNone, err
	}
	res, err := ex.Exec(ctx, psid, "s=$(cat -- "+journal.Quote(p.ShipPID)+" 2>/dev/null) || { echo none; exit 0; }\n"+
		"if [ -n \"$s\" ] && kill -0 \"$s\" 2>/dev/null; then echo live; else echo dead; fi\n")
	if err != nil {
		return ShipperNone, fmt.Errorf("driver: probe the shipper of %s: %w", runID, err)
	}
	switch strings.TrimSpace(string(res.Stdout)) {
	case "live":
		return ShipperLive, nil
	case "dead":
		return ShipperDead, nil
	}
	return ShipperNone, nil
}

// AttachShipping is attach for runs that may be shipped (docs/design.md §8.3). A run whose
// driver lease is fresh and whose shipper process lives is left to it: nothing is claimed
// and the caller only follows (Following). Otherwise the run is taken over as Attach does
// (a new epoch, the log fenced, so a shipper that is only cut off stores nothing more); a
// run that was shipped (its shipper's pid file is there) then gets a new shipper at the new
// epoch, which learns from its first answer where the log stands and ships on from there
// (ShippingSandbox). A run never shipped, or whose new shipper cannot start (no ship URL,
// the API unreachable from the sandbox), is the caller's to drive (ShippingHost).
func (s *Service) AttachShipping(ctx context.Context, runID string) (ShipAttach, error) {
	k := s.cfg.Keeper
	var (
		ex    sandbox.Executor
		psid  string
		found = ShipperNone
	)
	rs, err := k.RunSandbox(ctx, runID)
	switch {
	case err == nil && rs.State.Status == sandbox.StatusRunning:
		ex, _ = rs.Provider.(sandbox.Executor)
		psid = rs.Sandbox.ProviderSandboxID
		if ex != nil {
			if found, err = ShipperOf(ctx, ex, psid, s.cfg.Dir, runID); err != nil {
				// Unknown is not alive: the attach takes over, and a shipper that does live
				// is fenced out and exits at its next answer.
				s.cfg.Logger.WarnContext(ctx, "driver: attach: the shipper probe failed", "runId", runID, "err", err)
				found = ShipperNone
			}
		}
	case err != nil && !errors.Is(err, sandbox.ErrSandboxGone) && !errors.Is(err, keeper.ErrUnsupported):
		return ShipAttach{}, err
	}
	if found == ShipperLive && k.LeaseFresh(rs.State) {
		return ShipAttach{Following: true, Shipping: ShippingSandbox, AttachResult: keeper.AttachResult{
			Run:      rs.State.RunRecord,
			LaunchBy: rs.State.LaunchBy,
			Sandbox:  rs.Sandbox,
			Driver: keeper.Driver{Epoch: rs.State.Epoch(), LeaseMs: k.DriverLease().Milliseconds(),
				LeaseUntil: rs.State.LeaseUntil, CancelRequested: rs.State.Cancelled()},
		}}, nil
	}
	res, err := s.Attach(ctx, runID)
	if err != nil {
		return ShipAttach{}, err
	}
	out := ShipAttach{AttachResult: res, Shipping: ShippingHost}
	if found == ShipperNone || ex == nil || s.cfg.Ship == nil || s.cfg.Ship.URL == "" {
		return out, nil
	}
	at := res.Driver.Cursor
	at.Epoch = res.Driver.Epoch
	started, err := s.cfg.Ship.Start(ctx, k, ex, psid, s.cfg.Dir, runID, at)
	if err != nil {
		s.cfg.Logger.WarnContext(ctx, "driver: attach: starting a new shipper failed; the caller drives", "runId", runID, "err", err)
		return out, nil
	}
	if started {
		out.Shipping = ShippingSandbox
	}
	return out, nil
}
