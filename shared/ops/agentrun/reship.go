package agentrun

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Start starts a shipper of runID in psid at the epoch of at (at.Epoch set): a ship token
// for (the context's tenant, runID, at.Epoch) and the URL (urlFor) go to its environment
// alone. The token carries at's position as its hint (docs/design.md §8.2), so the
// shipper's first request appends at it without first fencing the log to learn it; a
// stale hint only costs that fence later (the log, not the hint, keeps exactly-once).
// started=false: the sandbox cannot run one (no curl, the API unreachable from it, no URL).
func (c *ShipConfig) Start(ctx context.Context, k *keeper.Keeper, ex contract.Executor, psid, dir, runID string, at contract.Cursor) (bool, error) {
	url := c.urlFor(ctx)
	if url == "" {
		return false, nil
	}
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return false, err
	}
	ttl := ShipTokenLeases * k.DriverLease()
	o := c.Options
	if o.Beat <= 0 {
		o.Beat = ShipBeat(k.DriverLease())
	}
	if o.GiveUp <= 0 {
		o.GiveUp = ttl
	}
	token := ShipToken(c.Key, tenant, runID, at, false, k.Config().Now().Add(ttl))
	return journal.StartShipper(ctx, ex, psid, dir, runID, url, token, o)
}

// ShipToken mints the ship token of runID of tenant at at.Epoch expiring at exp, with at's
// position and cancel as its hints (docs/design.md §8.2): the one minting of the shipper's
// credential, at launch, at a replacement and in every ship answer.
func ShipToken(key []byte, tenant, runID string, at contract.Cursor, cancel bool, exp time.Time) string {
	return shiptoken.Mint(key, shiptoken.Claims{Tenant: tenant, RunID: runID, Epoch: at.Epoch,
		Expires: exp, Next: at.Next, Src: at.Src, Cancel: cancel})
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
func ShipperOf(ctx context.Context, ex contract.Executor, psid, dir, runID string) (Shipper, error) {
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
//
// The claim comes first, conditioned on nobody holding the run (contract.ClaimCond.Unheld),
// so the usual attach — a run its host left or whose lease lapsed — costs what a plain
// attach costs (docs/design.md §11) and its liveness probe runs on the takeover's own read
// of the sandbox. A held run's refusal carries the state the claim read (consistent), so
// only the instance row is read before the probe; a holder that is not a live shipper (a
// host, a shipper killed within its lease) is then taken over unconditionally.
func (s *Service) AttachShipping(ctx context.Context, runID string) (ShipAttach, error) {
	k := s.cfg.Keeper
	now := k.Config().Now().UnixMilli()
	res, err := s.attachIf(ctx, runID, contract.ClaimCond{Unheld: &now})
	var refused *contract.ClaimRefused
	if !errors.As(err, &refused) {
		if err != nil {
			return ShipAttach{}, err
		}
		var ex contract.Executor
		if prov := k.Provider(res.Sandbox.Provider); prov != nil {
			ex, _ = prov.(contract.Executor)
		}
		return s.reship(ctx, res, ex, s.probe(ctx, ex, res.Sandbox.ProviderSandboxID, runID)), nil
	}
	// A driver holds the run: follow it if it is a live shipper.
	st := refused.State
	var (
		ex    contract.Executor
		psid  string
		found = ShipperNone
	)
	rs, err := k.SandboxOf(ctx, st)
	switch {
	case err == nil:
		ex, _ = rs.Provider.(contract.Executor)
		psid = rs.Sandbox.ProviderSandboxID
		found = s.probe(ctx, ex, psid, runID)
	case !errors.Is(err, contract.ErrSandboxGone) && !errors.Is(err, keeper.ErrUnsupported):
		return ShipAttach{}, err
	}
	if found == ShipperLive && k.LeaseFresh(st) {
		return ShipAttach{Following: true, Shipping: ShippingSandbox, AttachResult: keeper.AttachResult{
			Run:      st.RunRecord,
			LaunchBy: st.LaunchBy,
			Sandbox:  rs.Sandbox,
			Driver: keeper.Driver{Epoch: st.Epoch(), LeaseMs: k.DriverLease().Milliseconds(),
				LeaseUntil: st.LeaseUntil, CancelRequested: st.Cancelled()},
		}}, nil
	}
	res, err = s.Attach(ctx, runID)
	if err != nil {
		return ShipAttach{}, err
	}
	return s.reship(ctx, res, ex, found), nil
}

// probe is ShipperOf for attach: no executor, or a probe that fails, is ShipperNone
// (unknown is not alive: the attach takes over, and a shipper that does live is fenced
// out and exits at its next answer).
func (s *Service) probe(ctx context.Context, ex contract.Executor, psid, runID string) Shipper {
	if ex == nil {
		return ShipperNone
	}
	found, err := ShipperOf(ctx, ex, psid, s.cfg.Dir, runID)
	if err != nil {
		s.cfg.Logger.WarnContext(ctx, "driver: attach: the shipper probe failed", "runId", runID, "err", err)
		return ShipperNone
	}
	return found
}

// reship completes an attach that took the run over: a run that was shipped (found is
// not ShipperNone) gets a new shipper at the new epoch when it can start one.
func (s *Service) reship(ctx context.Context, res keeper.AttachResult, ex contract.Executor, found Shipper) ShipAttach {
	out := ShipAttach{AttachResult: res, Shipping: ShippingHost}
	url := s.cfg.Ship.urlFor(ctx)
	if found == ShipperNone || ex == nil || url == "" {
		return out
	}
	runID := res.Run.RunID
	at := res.Driver.Cursor
	at.Epoch = res.Driver.Epoch
	started, err := s.cfg.Ship.Start(ctx, s.cfg.Keeper, ex, res.Sandbox.ProviderSandboxID, s.cfg.Dir, runID, at)
	if err != nil {
		s.cfg.Logger.WarnContext(ctx, "driver: attach: starting a new shipper failed; the caller drives", "runId", runID, "err", err)
		return out
	}
	if started {
		out.Shipping = ShippingSandbox
	}
	return out
}
