package clitest

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// ShipWorld is a hosted provider's stand-in for ShippedRunCalls: a provider aimed at a fresh
// stand-in whose clock is Now, Advance moves that clock, and Calls counts the requests
// the stand-in got so far.
type ShipWorld struct {
	Provider contract.Provider
	Advance  func(time.Duration)
	Now      func() time.Time
	Calls    func() int
}

// ShipCalls is what one shipped run cost its provider: the requests of its launch (start
// and agent routes) and those made while it ran to its end.
type ShipCalls struct{ Launch, During int }

// ShippedRunCalls plays one run of length runFor (whole minutes) with no host on the
// provider's stand-in, every clock the stand-in's: the whole API in this process (memstore,
// the provider, its own address as the shipper's), the run started and its agent launched
// with plain calls, then each simulated minute the agent writes a line, its shipper (a real
// process the stand-in runs) stores it and the reaper sweeps, as a deployment's does; the
// agent exits and the run ends completed with every line. It counts the stand-in's
// requests of the launch and of the rest (docs/design.md §8.2: the ship routes hold no
// provider, so a run's length costs no provider call).
func ShippedRunCalls(t *testing.T, w ShipWorld, runFor time.Duration) ShipCalls {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{w.Provider}, Now: w.Now, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("clitest-cursor-key-0123456789abcdef")
	var api http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { api.ServeHTTP(rw, r) }))
	t.Cleanup(srv.Close)
	api = httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{}, CursorKey: key, PublicURL: srv.URL, Logger: quiet, Now: w.Now})
	rp, err := reaper.New(reaper.Config{Keeper: k, DetachedRunTTL: 15 * time.Minute, QuietReport: true,
		Ship: &agentrun.ShipConfig{URL: srv.URL, Key: key}})
	if err != nil {
		t.Fatal(err)
	}

	call := func(method, path, body string, out any) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, res.StatusCode, b)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	ticks := t.TempDir()
	minutes := int(runFor / time.Minute)
	// Line i once the test made tick-i; exit 0 once it made "end".
	agent := fmt.Sprintf(`d='%s'; i=1; while [ ! -e "$d/end" ]; do if [ -e "$d/tick-$i" ]; then echo $i; i=$((i+1)); fi; sleep 0.02; done`, ticks)
	touch := func(name string) {
		if err := os.WriteFile(filepath.Join(ticks, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A stand-in runs its sandboxes' commands on this machine, where every hosted
	// provider's journal directory is one shared path: the run id is this call's own.
	runID := fmt.Sprintf("run-shipped-%d-%d", time.Now().UnixNano(), os.Getpid())
	before := w.Calls()
	var st struct{ Cursor string }
	call(http.MethodPost, "/v1/runs", fmt.Sprintf(`{"runId":%q,"threadId":"thread-%s","sandbox":{"id":"default","provider":%q}}`, runID, runID, w.Provider.Name()), &st)
	body, _ := json.Marshal(map[string]string{"cursor": st.Cursor, "command": agent})
	var ag struct{ Shipping string }
	call(http.MethodPost, "/v1/runs/"+runID+"/agent", string(body), &ag)
	if ag.Shipping != agentrun.ShippingSandbox {
		t.Fatalf("shipping %q, want sandbox", ag.Shipping)
	}
	t.Cleanup(func() { touch("end") })
	launched := w.Calls()

	type page struct {
		Events []struct{ Data json.RawMessage }
		Next   int64
		Closed bool
	}
	// lines counts the agent's lines read; after is the log position to read from (the
	// page's next): a log's offsets are positions, not a count of lines.
	lines, after := 0, int64(0)
	for m := 1; m <= minutes; m++ {
		w.Advance(time.Minute)
		touch(fmt.Sprintf("tick-%d", m))
		for deadline := time.Now().Add(Deadline); lines < m; {
			if time.Now().After(deadline) {
				t.Fatalf("minute %d: line %d never stored", m, m)
			}
			var pg page
			call(http.MethodGet, fmt.Sprintf("/v1/runs/%s/events?after=%d&waitMs=1000", runID, after), "", &pg)
			for _, e := range pg.Events {
				if lines++; string(e.Data) != fmt.Sprint(lines) {
					t.Fatalf("event %d is %s, want %d", lines, e.Data, lines)
				}
			}
			after = pg.Next
		}
		if _, err := rp.Sweep(t.Context()); err != nil {
			t.Fatalf("sweep: %v", err)
		}
	}
	touch("end")
	for deadline := time.Now().Add(Deadline); ; {
		var run struct{ Run struct{ Status string } }
		call(http.MethodGet, "/v1/runs/"+runID, "", &run)
		if run.Run.Status == string(contract.StatusCompleted) {
			break
		}
		if run.Run.Status != string(contract.StatusRunning) || time.Now().After(deadline) {
			t.Fatalf("run %s, want completed", run.Run.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var last page
	call(http.MethodGet, fmt.Sprintf("/v1/runs/%s/events?after=%d", runID, after), "", &last)
	if len(last.Events) != 0 || !last.Closed {
		t.Fatalf("after %d lines: %+v, want the log closed", lines, last)
	}
	return ShipCalls{Launch: launched - before, During: w.Calls() - launched}
}
