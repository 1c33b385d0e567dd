package apitransport_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/driver"
	"github.com/sandkeep/sandkeep/shared/host/driver/apitransport"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/providers/localprocess"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// TestTransportDrive: driver.Drive over the API transport delivers every line of a real
// agent exactly once and completes the run; a driver whose run was taken over stops as
// superseded, its pump refused with the sentinel.
func TestTransportDrive(t *testing.T) {
	url := clitest.ServeAPI(t, localprocess.New(t.TempDir()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := apiclient.New(apiclient.Config{BaseURL: url})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Start(ctx, startReq("run-1", "thread-1"))
	if err != nil {
		t.Fatal(err)
	}
	ag, err := c.Agent(ctx, "run-1", wire.AgentRequest{Cursor: st.Cursor, Command: `for i in 1 2 3 4 5; do echo "{\"n\":$i}"; done`})
	if err != nil || !ag.Launched {
		t.Fatalf("agent: %+v %v", ag, err)
	}
	if again, err := c.Agent(ctx, "run-1", wire.AgentRequest{Cursor: st.Cursor, Command: "echo twice"}); err != nil || again.Launched {
		t.Fatalf("second agent call: %+v %v", again, err)
	}
	tr := apitransport.New(c, "run-1", st.Cursor)
	res, err := driver.Drive(ctx, tr, driver.Config{RunID: "run-1", LeaseMs: st.LeaseMs})
	if err != nil || res.Outcome != driver.Completed || res.Events != 5 || tr.Cursor() == st.Cursor {
		t.Fatalf("drive: %+v %v", res, err)
	}
	page, err := c.ReadEvents(ctx, "run-1", apiclient.ReadOptions{})
	if err != nil || len(page.Events) != 5 || !page.Closed || string(page.Events[4].Data) != `{"n":5}` {
		t.Fatalf("log: %+v %v", page, err)
	}

	// Taken over: the old driver's pump is refused as superseded, and its drive stops quietly.
	st2, err := c.Start(ctx, startReq("run-2", "thread-2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Agent(ctx, "run-2", wire.AgentRequest{Cursor: st2.Cursor, Command: "sleep 30"}); err != nil {
		t.Fatal(err)
	}
	old := apitransport.New(c, "run-2", st2.Cursor)
	at, err := c.Attach(ctx, "run-2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Pump(ctx, 0); !errors.Is(err, contract.ErrSuperseded) || !strings.Contains(err.Error(), wire.CodeSuperseded) {
		t.Fatalf("stale pump: %v", err)
	}
	res, err = driver.Drive(ctx, old, driver.Config{RunID: "run-2", LeaseMs: st2.LeaseMs})
	if err != nil || res.Outcome != driver.Superseded {
		t.Fatalf("stale drive: %+v %v", res, err)
	}
	// The new holder aborts it (the server kills the agent).
	if rec, err := apitransport.New(c, "run-2", at.Cursor).Finish(ctx, keeperAborted()); err != nil || rec.Status != contract.StatusAborted {
		t.Fatalf("finish: %+v %v", rec, err)
	}
}

func startReq(run, thread string) wire.StartRequest {
	return wire.StartRequest{RunID: run, ThreadID: thread, Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}}
}

func keeperAborted() keeper.FinishInput {
	return keeper.FinishInput{Status: contract.StatusAborted, Error: &contract.RunError{Code: "cancelled", Message: "cancelled"}}
}

// TestKeeperSentinels: the client's unsupported and unavailable answers reach the driver
// loop as keeper's sentinels (driver.Drive fails at once on ErrUnsupported; a caller reads
// ErrUnavailable as "try again later"), with the client's message and *apiclient.Error
// kept; the sandbox sentinels pass through as before.
func TestKeeperSentinels(t *testing.T) {
	cases := []struct {
		status int
		code   string
		want   error
	}{
		{http.StatusNotImplemented, wire.CodeUnsupported, keeper.ErrUnsupported},
		{http.StatusServiceUnavailable, wire.CodeUnavailable, keeper.ErrUnavailable},
		{http.StatusBadGateway, "", keeper.ErrUnavailable},
		{http.StatusConflict, wire.CodeSuperseded, contract.ErrSuperseded},
	}
	for _, tc := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", wire.ProblemContentType)
			w.WriteHeader(tc.status)
			_ = json.NewEncoder(w).Encode(wire.Problem{Type: wire.ProblemTypePrefix + tc.code, Status: tc.status, Code: tc.code, Detail: "d"})
		}))
		c, err := apiclient.New(apiclient.Config{BaseURL: srv.URL, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		tr := apitransport.New(c, "run-1", "cursor")
		_, perr := tr.Pump(context.Background(), 0)
		_, herr := tr.Heartbeat(context.Background())
		_, ferr := tr.Finish(context.Background(), keeperAborted())
		srv.Close()
		for _, err := range []error{perr, herr, ferr} {
			var apiErr *apiclient.Error
			if !errors.Is(err, tc.want) || !errors.As(err, &apiErr) || apiErr.Status != tc.status || !strings.HasPrefix(err.Error(), "sandkeep API: ") {
				t.Errorf("%d %q: %v, want %v and the client's error", tc.status, tc.code, err, tc.want)
			}
		}
	}
}
