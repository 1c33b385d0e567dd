package memstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// pushState models the deployed push's items of docs/design.md §3.1: a connection item
// per connection id (tenant, slot, runs), a slot set per tenant, and a subscription item
// per (run, connection). Guarded by Store.mu.
type pushState struct {
	conns map[string]*memConn                        // by connection id (tenant-free, as the table's key)
	slots map[string]map[string]int64                // tenant → connection id → slot expiry (s)
	subs  map[tkey]map[string]*contract.Subscription // (tenant, run) → connection id → subscription
}

type memConn struct {
	tenant string
	runs   map[string]bool
}

var _ contract.PushStore = (*Store)(nil)

func (p *pushState) init() {
	if p.conns == nil {
		p.conns, p.slots, p.subs = map[string]*memConn{}, map[string]map[string]int64{}, map[tkey]map[string]*contract.Subscription{}
	}
}

// pushScope is scope for the PushStore calls (contract.PushScope), yielding as scope does.
func pushScope(ctx context.Context, connID, runID string) (tkey, error) {
	t, err := contract.PushScope(ctx, connID, runID)
	return scoped(t, runID, err)
}

// Connect takes one of the tenant's slots (lapsed slots are free); an open connection
// keeps the one it holds.
func (s *Store) Connect(ctx context.Context, connID string, max int) error {
	k, err := pushScope(ctx, connID, "")
	if err != nil {
		return err
	}
	now := s.opts.now().Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.push.init()
	if c := s.push.conns[connID]; c != nil {
		// A repeated $connect: the connection keeps its one slot and its runs.
		if c.tenant != k.tenant {
			return fmt.Errorf("memstore: connect %q: open in another tenant: %w", connID, contract.ErrConflict)
		}
		if _, held := s.push.slots[k.tenant][connID]; held {
			return nil
		}
	}
	slots := s.push.slots[k.tenant]
	if slots == nil {
		slots = map[string]int64{}
		s.push.slots[k.tenant] = slots
	}
	if len(slots) >= max {
		for id, exp := range slots {
			if exp < now {
				delete(slots, id)
			}
		}
	}
	if _, mine := slots[connID]; !mine && len(slots) >= max {
		return fmt.Errorf("memstore: connect %q: the tenant holds %d push connections: %w", connID, max, contract.ErrConflict)
	}
	slots[connID] = now + int64(contract.PushLifetime.Seconds())
	if s.push.conns[connID] == nil {
		s.push.conns[connID] = &memConn{tenant: k.tenant, runs: map[string]bool{}}
	}
	return nil
}

// ConnectionTenant returns the tenant of an open connection.
func (s *Store) ConnectionTenant(_ context.Context, connID string) (string, bool, error) {
	if err := contract.CheckStoreID("connId", connID); err != nil {
		return "", false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.push.init()
	c := s.push.conns[connID]
	if c == nil {
		return "", false, nil
	}
	return c.tenant, true, nil
}

// Disconnect removes the connection, its subscriptions and its slot.
func (s *Store) Disconnect(ctx context.Context, connID string) error {
	k, err := pushScope(ctx, connID, "")
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.push.init()
	c := s.push.conns[connID]
	if c == nil || c.tenant != k.tenant {
		return nil
	}
	delete(s.push.conns, connID)
	for run := range c.runs {
		delete(s.push.subs[tkey{tenant: k.tenant, id: run}], connID)
	}
	delete(s.push.slots[k.tenant], connID)
	return nil
}

// Subscribe adds the run to the connection under the bound and (re)starts its item.
func (s *Store) Subscribe(ctx context.Context, connID, runID string, after int64, max int) error {
	k, err := pushScope(ctx, connID, runID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.push.init()
	c := s.push.conns[connID]
	switch {
	case c == nil || c.tenant != k.tenant:
		return fmt.Errorf("memstore: subscribe %q: connection not open: %w", connID, contract.ErrUnknownRun)
	case !c.runs[runID] && len(c.runs) >= max:
		return fmt.Errorf("memstore: subscribe %q: the connection holds %d subscriptions: %w", connID, max, contract.ErrConflict)
	}
	c.runs[runID] = true
	subs := s.push.subs[k]
	if subs == nil {
		subs = map[string]*contract.Subscription{}
		s.push.subs[k] = subs
	}
	subs[connID] = &contract.Subscription{RunID: runID, ConnID: connID, Next: after}
	return nil
}

// Unsubscribe deletes the subscription.
func (s *Store) Unsubscribe(ctx context.Context, connID, runID string) error {
	k, err := pushScope(ctx, connID, runID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.push.init()
	delete(s.push.subs[k], connID)
	if c := s.push.conns[connID]; c != nil && c.tenant == k.tenant {
		delete(c.runs, runID)
	}
	return nil
}

// Subscriptions lists the run's subscriptions in connection id order (the sort key's).
func (s *Store) Subscriptions(ctx context.Context, runID string) ([]contract.Subscription, error) {
	k, err := scope(ctx, "runId", runID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.push.init()
	var out []contract.Subscription
	for _, sub := range s.push.subs[k] {
		out = append(out, *sub)
	}
	slices.SortFunc(out, func(a, b contract.Subscription) int { return strings.Compare(a.ConnID, b.ConnID) })
	return out, nil
}
