package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/apiclient"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// pollWait is how long each poll of TestDevShutdownWakesPolls asks to wait. A server that
// waits its polls out exits pollWait after the signal at the earliest; one that wakes them
// exits within the promised 2 s (README.md, Quickstart; logged as a figure). The test tells
// the two apart at half of pollWait, so a loaded machine never decides it.
const pollWait = 20 * time.Second

// shutdownBound separates a shutdown that wakes polls from one that waits them out.
const shutdownBound = pollWait / 2

// shutdownPolls is how many polls wait at the SIGTERM, and the server's --max-waiting: a
// probe refused too-many-waiting proves every one of them waits in its handler.
const shutdownPolls = 50

// TestDevShutdownWakesPolls: 50 long polls wait on a run's log (waitMs=20000); SIGTERM
// wakes them — each answers 200 with what it has (an empty page) — and the process exits 0
// long before their wait could have ended, on both backends.
func TestDevShutdownWakesPolls(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		ctx := clitest.Context(t)
		c, err := apiclient.New(apiclient.Config{BaseURL: dev.URL})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Start(ctx, wire.StartRequest{RunID: "run-s", ThreadID: "thread-s",
			Sandbox: &wire.SetupRequest{ID: "default", Provider: "local-process"}}); err != nil {
			t.Fatal(err)
		}
		const polls = shutdownPolls
		type answer struct {
			status int
			events int
			err    error
			at     time.Time
		}
		var (
			wg      sync.WaitGroup
			answers [polls]answer
			client  = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: polls}}
		)
		// Open every connection first and leave it idle in the pool: a poll then goes out on a
		// connection the server has accepted and is reading, so none can sit unaccepted in
		// the listener's backlog when the shutdown closes it.
		var warm sync.WaitGroup
		for range polls {
			warm.Go(func() {
				resp, err := client.Get(dev.URL + "/v1/runs/run-s")
				if err != nil {
					t.Errorf("warming a connection: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		warm.Wait()
		var reused atomic.Int32
		trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
			if info.Reused {
				reused.Add(1)
			}
		}}
		for i := range polls {
			wg.Go(func() {
				for {
					req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet,
						fmt.Sprintf("%s/v1/runs/run-s/events?after=0&waitMs=%d", dev.URL, pollWait.Milliseconds()), nil)
					if err != nil {
						answers[i].err = err
						return
					}
					resp, err := client.Do(req)
					answers[i].at = time.Now()
					if err != nil {
						answers[i].err = err
						return
					}
					var page wire.ReadResponse
					answers[i].status = resp.StatusCode
					answers[i].err = json.NewDecoder(resp.Body).Decode(&page)
					answers[i].events = len(page.Events)
					resp.Body.Close()
					// Refused while a probe below held a place: ask again.
					if resp.StatusCode != http.StatusTooManyRequests {
						return
					}
				}
			})
		}
		// A request past its first read holds one of the tenant's --max-waiting places until
		// it answers: once a 1 ms probe is refused too-many-waiting, every poll waits in its
		// handler (none can be lost in a listener backlog or an unread keep-alive connection
		// when the shutdown closes them).
		for deadline := time.Now().Add(clitest.Deadline); ; {
			resp, err := client.Get(dev.URL + "/v1/runs/run-s/events?after=0&waitMs=1")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				break
			}
			if resp.StatusCode != http.StatusOK || time.Now().After(deadline) {
				t.Fatalf("probe: %d; want 429 once the %d polls wait (within %v)", resp.StatusCode, polls, clitest.Deadline)
			}
			time.Sleep(10 * time.Millisecond)
		}
		sigAt := time.Now()
		dev.Signal(t, syscall.SIGTERM)
		code := dev.Wait(t)
		took := time.Since(sigAt)
		wg.Wait()
		var lastAnswer time.Duration
		for _, a := range answers {
			lastAnswer = max(lastAnswer, a.at.Sub(sigAt))
		}
		t.Logf("SIGTERM to exit with %d polls waiting (%d on warmed connections): %v (exit %d); the last poll answered %v after the signal",
			polls, reused.Load(), took.Round(time.Millisecond), code, lastAnswer.Round(time.Millisecond))
		if code != 0 {
			t.Errorf("exit status %d after SIGTERM, want 0\nstderr:\n%s", code, dev.Stderr)
		}
		for i, a := range answers {
			if a.err != nil || a.status != http.StatusOK || a.events != 0 {
				t.Errorf("poll %d: status %d, %d events, %v; want 200 with an empty page", i, a.status, a.events, a.err)
			}
			if a.at.Before(sigAt) {
				t.Errorf("poll %d answered %v before the SIGTERM: it was not waiting", i, sigAt.Sub(a.at))
			}
		}
		if took > shutdownBound {
			t.Errorf("SIGTERM to exit took %v with %d polls waiting: the polls were waited out, not woken (want under %v)",
				took, polls, shutdownBound)
		}
	}, "--max-waiting", strconv.Itoa(shutdownPolls))
}

// TestDevSecondSignalExitsAtOnce: while a graceful shutdown waits for an in-flight request
// (an upload stalled mid-body), a second SIGTERM ends the process at once: it dies by the
// signal instead of finishing the shutdown.
func TestDevSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	dev := clitest.StartDev(t, nil)
	u, err := url.Parse(dev.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers and half of the body: the handler blocks reading the rest.
	body := `{"runId":"run-x","threadId":"thread-x","sandbox":{"id":"default","provider":"local-process"}}`
	fmt.Fprintf(conn, "POST /v1/runs HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		u.Host, len(body), body[:len(body)/2])
	dev.Signal(t, syscall.SIGTERM)
	dev.WaitFor(t, "stderr", regexp.MustCompile(`dev: shutting down`))
	dev.Signal(t, syscall.SIGTERM)
	code := dev.Wait(t)
	if code != -1 {
		t.Fatalf("exit status %d after a second SIGTERM, want death by the signal (-1)\nstderr:\n%s", code, dev.Stderr)
	}
}
