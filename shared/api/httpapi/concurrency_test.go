package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/providers/counting"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/storetest"
)

// TestConcurrentStartsOneSandbox: 64 concurrent POST /v1/runs on one new thread, with a
// provider whose every Create mints a fresh id, yield exactly one create, 64 equal ids and
// no destroy. The first Create is held until every starter has queued on the sandbox lock,
// and the test asserts that contention actually happened.
func TestConcurrentStartsOneSandbox(t *testing.T) {
	const n = 64
	fb := storetest.NewFaultBackend(memstore.New())
	cp := counting.New("counting")
	cp.BeforeCreate(func(ctx context.Context, i int, _ contract.CreateInput) {
		if i != 1 {
			return
		}
		// Generous: the wait ends as soon as every starter queued; the deadline only
		// keeps a broken run from hanging.
		deadline := time.Now().Add(60 * time.Second)
		for fb.Calls("Locks.WithLock") < n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	})
	e := newEnvWith(t, DevAuth{}, fb, cp)
	type result struct {
		status  int
		outcome string
		psid    string
	}
	results := make([]result, n)
	// e.do validates against the document; a failure there ends only its goroutine (its
	// deferred Done still runs) and fails the test.
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := map[string]any{"runId": fmt.Sprintf("run-%02d", i), "threadId": "thread-hot",
				"sandbox": map[string]any{"id": "default", "provider": "counting"}}
			rec := e.do(req{method: http.MethodPost, path: "/v1/runs", body: body})
			results[i].status = rec.Status
			var s startResponse
			if rec.Status == http.StatusOK && json.Unmarshal(rec.Body, &s) == nil {
				results[i].outcome, results[i].psid = string(s.Outcome), s.Sandbox.ProviderSandboxID
			}
		}()
	}
	wg.Wait()
	queued := fb.Calls("Locks.WithLock") - 1
	t.Logf("%d starters queued on the sandbox lock behind the creator", queued)
	if queued < 1 {
		t.Fatalf("only %d starters contended for the lock: the dangerous path was not exercised", queued)
	}
	outcomes := map[string]int{}
	for i, r := range results {
		if r.status != http.StatusOK || r.psid != results[0].psid {
			t.Fatalf("start %d: status %d sandbox %q, want 200 and %q", i, r.status, r.psid, results[0].psid)
		}
		outcomes[r.outcome]++
	}
	c := cp.Counts()
	if c.Creates != 1 || c.Destroys != 0 || outcomes["created"] != 1 {
		t.Fatalf("provider counts %+v, outcomes %v: want exactly one create, no destroy", c, outcomes)
	}
}

// TestConcurrentRetriedStartsOneRun: 400 concurrent POST /v1/runs of ONE run id while its
// first start is held inside Create (until the other starts have each read the run):
// none answers sandbox-gone; each answers 200 (created or taken-over),
// 409 superseded (another retry claimed the run after it) or 503 with Retry-After (it
// outwaited the creation), with one create.
func TestConcurrentRetriedStartsOneRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb backendFactory) {
		const n = 400
		fb := storetest.NewFaultBackend(nb(t))
		cp := counting.New("counting")
		seen := make(chan struct{})
		fb.Hook("Runs.State", func(_ context.Context, call int) {
			if call == n-1 {
				close(seen)
			}
		})
		cp.BeforeCreate(func(ctx context.Context, _ int, _ contract.CreateInput) {
			select {
			case <-seen:
			case <-time.After(60 * time.Second): // only keeps a broken run from hanging
				t.Errorf("the retried starts never read the run")
			}
		})
		e := newEnvWith(t, DevAuth{}, fb, cp)
		body := map[string]any{"runId": "run-1", "threadId": "thread-1",
			"sandbox": map[string]any{"id": "default", "provider": "counting"}}
		answers := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				rec := e.do(req{method: http.MethodPost, path: "/v1/runs", body: body})
				var s struct {
					Outcome string `json:"outcome"`
					Code    string `json:"code"`
				}
				_ = json.Unmarshal(rec.Body, &s)
				answers[i] = fmt.Sprintf("%d %s%s", rec.Status, s.Outcome, s.Code)
				if rec.Status == http.StatusServiceUnavailable && rec.Header.Get("Retry-After") == "" {
					answers[i] += " without Retry-After"
				}
			})
		}
		wg.Wait()
		count := map[string]int{}
		for _, a := range answers {
			count[a]++
		}
		t.Logf("%d concurrent starts of one run id: %v, creates %d", n, count, cp.Counts().Creates)
		for a, c := range count {
			switch a {
			case "200 created", "200 taken-over", "409 superseded", "503 unavailable":
			default:
				t.Errorf("%d starts answered %q", c, a)
			}
		}
		if count["200 taken-over"] == 0 || cp.Counts().Creates != 1 {
			t.Fatalf("answers %v, creates %d: want a taken-over and one create", count, cp.Counts().Creates)
		}
	})
}
