package agentrun_test

// The attach decision of docs/design.md §8.3 on both backends: a live shipper with a fresh
// lease keeps the run (nothing claimed); a dead one is replaced by a shipper at the new
// epoch, whose token names that epoch; a run never shipped is the caller's to drive.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

// shipSink is a stand-in API for a shipper: it answers the probe and refuses every ship
// request as terminal (so the shipper exits), recording each request's token.
type shipSink struct {
	mu     sync.Mutex
	tokens []string
	got    chan struct{}
}

func (s *shipSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/ship" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	s.mu.Lock()
	s.tokens = append(s.tokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	s.mu.Unlock()
	select {
	case s.got <- struct{}{}:
	default:
	}
	w.WriteHeader(http.StatusGone)
}

func TestAttachShippingFollowsALiveShipperAndReplacesADeadOne(t *testing.T) {
	backends(t, func(t *testing.T, newBackend func() contract.Backend) {
		e := newEnvOn(t, time.Minute, newBackend())
		sink := &shipSink{got: make(chan struct{}, 1)}
		api := httptest.NewServer(sink)
		defer api.Close()
		key := []byte("0123456789abcdef0123456789abcdef")
		svc, err := agentrun.NewService(agentrun.ServiceConfig{Keeper: e.K, Dir: dir, Ship: &agentrun.ShipConfig{URL: api.URL, Key: key}})
		if err != nil {
			t.Fatal(err)
		}
		const runID = "r-reship"
		res := e.Start(runID, "sleep 30")
		psid := res.Sandbox.ProviderSandboxID
		p, err := journal.PathsIn(e.Ctx, e.Prov, dir, runID)
		if err != nil {
			t.Fatal(err)
		}
		epoch := res.Driver.Epoch

		// Never shipped: taken over, the caller drives with a cursor.
		at, err := svc.AttachShipping(e.Ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if at.Following || at.Shipping != agentrun.ShippingHost || at.Driver.Epoch != epoch+1 {
			t.Fatalf("never shipped: following=%v shipping=%q epoch=%d, want a takeover at %d for the host", at.Following, at.Shipping, at.Driver.Epoch, epoch+1)
		}
		epoch = at.Driver.Epoch

		// A live shipper (a process named by the pid file) and a fresh lease: left to it.
		pg, err := e.Prov.Start(e.Ctx, psid, "exec sleep 30")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Prov.Kill(context.Background(), psid, pg) })
		if r, err := e.Prov.Exec(e.Ctx, psid, "mkdir -p "+journal.Quote(p.Dir)+" && echo "+strconv.Itoa(pg)+" >"+journal.Quote(p.ShipPID)); err != nil || r.ExitCode != 0 {
			t.Fatalf("write the pid file: %v %+v", err, r)
		}
		at, err = svc.AttachShipping(e.Ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if !at.Following || at.Shipping != agentrun.ShippingSandbox || at.Driver.Epoch != epoch {
			t.Fatalf("live shipper: following=%v shipping=%q epoch=%d, want following at %d", at.Following, at.Shipping, at.Driver.Epoch, epoch)
		}
		if st, err := e.K.Get(e.Ctx, runID); err != nil || st.Epoch() != epoch {
			t.Fatalf("live shipper: the run was claimed: epoch %d (err %v), want %d", st.Epoch(), err, epoch)
		}

		// The shipper dies: the next attach takes over and starts one at the new epoch.
		if err := e.Prov.Kill(e.Ctx, psid, pg); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			s, err := agentrun.ShipperOf(e.Ctx, e.Prov, psid, dir, runID)
			if err != nil {
				t.Fatal(err)
			}
			if s == agentrun.ShipperDead {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the killed shipper still shows as %v", s)
			}
			time.Sleep(10 * time.Millisecond)
		}
		at, err = svc.AttachShipping(e.Ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if at.Following || at.Shipping != agentrun.ShippingSandbox || at.Driver.Epoch != epoch+1 {
			t.Fatalf("dead shipper: following=%v shipping=%q epoch=%d, want a new shipper at %d", at.Following, at.Shipping, at.Driver.Epoch, epoch+1)
		}
		select {
		case <-sink.got:
		case <-time.After(10 * time.Second):
			t.Fatal("the new shipper sent nothing")
		}
		sink.mu.Lock()
		tok := sink.tokens[0]
		sink.mu.Unlock()
		cl, err := shiptoken.Verify(key, tok, time.Now())
		if err != nil || cl.RunID != runID || cl.Tenant != "t1" || cl.Epoch != epoch+1 {
			t.Fatalf("the new shipper's token: %+v (err %v), want run %s tenant t1 epoch %d", cl, err, runID, epoch+1)
		}
	})
}

// TestAttachShippingUnreachableReplacement: a dead shipper's pid file is still there when
// attach starts its replacement, which cannot reach the API (it exits before writing its
// own): the run is the caller's to drive (host, with a cursor). Judging the start by any
// pid file took the predecessor's for the replacement's and answered sandbox, so nobody
// shipped the run.
func TestAttachShippingUnreachableReplacement(t *testing.T) {
	backends(t, func(t *testing.T, newBackend func() contract.Backend) {
		e := newEnvOn(t, time.Minute, newBackend())
		closed := httptest.NewServer(http.NotFoundHandler())
		closed.Close()
		svc, err := agentrun.NewService(agentrun.ServiceConfig{Keeper: e.K, Dir: dir,
			Ship: &agentrun.ShipConfig{URL: closed.URL, Key: []byte("0123456789abcdef0123456789abcdef")}})
		if err != nil {
			t.Fatal(err)
		}
		const runID = "r-unreachable"
		res := e.Start(runID, "sleep 30")
		p, err := journal.PathsIn(e.Ctx, e.Prov, dir, runID)
		if err != nil {
			t.Fatal(err)
		}
		// Above any pid_max: the shipper it names is dead.
		if r, err := e.Prov.Exec(e.Ctx, res.Sandbox.ProviderSandboxID, "mkdir -p "+journal.Quote(p.Dir)+" && echo 4194399 >"+journal.Quote(p.ShipPID)); err != nil || r.ExitCode != 0 {
			t.Fatalf("write the pid file: %v %+v", err, r)
		}
		at, err := svc.AttachShipping(e.Ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if at.Following || at.Shipping != agentrun.ShippingHost || at.Driver.Epoch != res.Driver.Epoch+1 || at.Driver.Cursor.Epoch == 0 && at.Driver.Cursor.Next == 0 {
			t.Fatalf("unreachable replacement: following=%v shipping=%q epoch=%d cursor %+v, want the host at %d with a cursor",
				at.Following, at.Shipping, at.Driver.Epoch, at.Driver.Cursor, res.Driver.Epoch+1)
		}
	})
}
