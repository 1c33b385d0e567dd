package viewer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m) }

// xssPayload is an event the agent prints: it must render as text, never as markup.
const xssPayload = `<img src=x onerror=alert(1)>`

// screenshotsEnv names a directory to write the README's screenshots into
// (SANDKEEP_VIEWER_SCREENSHOTS=docs go test -run TestBrowser ./cmd/sandkeep/internal/viewer).
const screenshotsEnv = "SANDKEEP_VIEWER_SCREENSHOTS"

// chromium returns Debian's chromium (scripts/test.sh installs it when absent). Without it
// the test skips, except under CI=true, where it fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: scripts/test.sh installs Debian's chromium; CI must have it")
	}
	t.Skip("no chromium on PATH (make test installs it)")
	return ""
}

// tab is a headless Chromium tab and what the test observes of it.
type tab struct {
	ctx context.Context
	// dialogs counts every JavaScript dialog the page opened (an alert is an XSS).
	dialogs atomic.Int32
	// exceptions counts the page's uncaught exceptions (a route that throws freezes the page).
	exceptions atomic.Int32
	// failNext makes that many intercepted requests fail as a lost connection (requests are
	// intercepted only while Fetch is enabled; the others are let through).
	failNext, failed atomic.Int32
}

// call runs one DevTools command in the tab.
func call[P, R any](t *testing.T, ctx context.Context, cmd cdp.Command[P, R], params P) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, cmd, params)
		return err
	})); err != nil {
		t.Fatalf("%s: %v", cmd.Method, err)
	}
}

// browser starts a headless Chromium with the flags a closed network needs and returns a
// tab.
func browser(t *testing.T) *tab {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(cancelB)
	tb := &tab{ctx: ctx}
	// Commands from the listener run on their own goroutine: the listener must not block.
	send := func(f func(ctx context.Context, tg *chromedp.Target) error) {
		go func() { _ = chromedp.Do(ctx, chromedp.Func(f)) }()
	}
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			tb.exceptions.Add(1)
		case *page.EventJavascriptDialogOpening:
			tb.dialogs.Add(1)
			send(func(ctx context.Context, tg *chromedp.Target) error { // an open dialog blocks the page
				_, err := cdp.Call(ctx, tg, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{})
				return err
			})
		case *fetch.EventRequestPaused:
			id := ev.RequestID
			if tb.failNext.Add(-1) >= 0 {
				tb.failed.Add(1)
				send(func(ctx context.Context, tg *chromedp.Target) error {
					_, err := cdp.Call(ctx, tg, fetch.FailRequest, fetch.FailRequestParams{RequestID: id, ErrorReason: network.ErrorReasonInternetDisconnected})
					return err
				})
				return
			}
			send(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := cdp.Call(ctx, tg, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: id})
				return err
			})
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return tb
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// do runs browser actions, failing the test on an error.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls a JavaScript condition until it is true, failing after the deadline with
// what describe evaluates to.
func waitFor(t *testing.T, ctx context.Context, what, cond, describe string) {
	t.Helper()
	deadline := time.Now().Add(clitest.Deadline)
	for {
		if ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+cond+")")); err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			got, _ := chromedp.Run(ctx, chromedp.Evaluate[any](describe))
			t.Fatalf("%s: not seen within %v; page shows %v", what, clitest.Deadline, got)
		}
		time.Sleep(50 * time.Millisecond) // polling a page: there is no signal to wait on
	}
}

// shownEvent is one event as the page lists it.
type shownEvent struct {
	Offset int64  `json:"offset"`
	Text   string `json:"text"`
}

const shownEventsJS = `[...document.querySelectorAll('#events li.event')].map(li => ({offset: Number(li.dataset.offset), text: li.querySelector('.data').textContent}))`

func shown(t *testing.T, ctx context.Context) []shownEvent {
	t.Helper()
	return eval[[]shownEvent](t, ctx, shownEventsJS)
}

// logEvents reads the run's whole log through the API: what the page must show, once each.
func logEvents(t *testing.T, base, runID string) []shownEvent {
	t.Helper()
	var out []shownEvent
	after := int64(0)
	for {
		res, err := http.Get(fmt.Sprintf("%s/v1/runs/%s/events?after=%d&limit=1000", base, runID, after))
		if err != nil {
			t.Fatal(err)
		}
		var page struct {
			Events []struct {
				Offset int64           `json:"offset"`
				Data   json.RawMessage `json:"data"`
			} `json:"events"`
			Next   int64 `json:"next"`
			Closed bool  `json:"closed"`
		}
		err = json.NewDecoder(res.Body).Decode(&page)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			var s string
			text := string(e.Data)
			if json.Unmarshal(e.Data, &s) == nil {
				text = s
			} else {
				var buf bytes.Buffer
				if json.Compact(&buf, e.Data) == nil {
					text = buf.String()
				}
			}
			out = append(out, shownEvent{e.Offset, text})
		}
		if len(page.Events) == 0 {
			return out
		}
		after = page.Next
	}
}

// checkOnceInOrder fails unless got is a prefix of want (the log): every event once, in
// order, none skipped.
func checkOnceInOrder(t *testing.T, what string, got, want []shownEvent) {
	t.Helper()
	if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
		t.Fatalf("%s: the page shows\n%v\nthe log holds\n%v", what, got, want)
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", "..", "..", "..", dir) // relative to the repository root
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", filepath.Join(dir, name))
}

func getBody(t *testing.T, url string) (http.Header, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, b)
	}
	return res.Header, string(b)
}

// TestBrowserRunViewer drives the page `sandkeep dev` serves in headless Chromium while an
// agent runs, driven by a host: the run appears running in the list, its
// events arrive in order while it runs, pushed over /v1/subscribe (no long poll of its
// log), a reload and a dropped socket continue without a duplicate or a gap, the agent's hostile output renders
// as text (no element, no dialog, and the CSP refuses an HTML sink), and Cancel ends the
// run aborted with its log closed. A run whose host detached (on a server whose sandboxes
// cannot reach it, so a host drives) is expired by the reaper, and its page shows that.
func TestBrowserRunViewer(t *testing.T) {
	tb := browser(t)
	ctx, dialogs := tb.ctx, &tb.dialogs
	call(t, ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: fetchSpy + wsSpy})
	// Host-driven (a closed --public-url): Cancel and Ctrl-C's detach are the host's here;
	// the push is the same whoever drives the run.
	dev := hostDev(t, "--reap-every", "1s", "--detached-ttl", "6s")
	hdev := dev
	base := dev.URL

	h, html := getBody(t, base+"/")
	if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") ||
		!strings.Contains(csp, "require-trusted-types-for 'script'") || !strings.Contains(html, "/assets/app.js") {
		t.Fatalf("GET /: CSP %q\n%s", csp, html)
	}

	const runID, thread = "run-view-1", "thread-view"
	agent := startAgent(t, dev, runID, thread)
	// An abandoned run: its viewer detached and never came back; the reaper expires it
	// after the TTL, and the reaper page shows it.
	const abandoned = "run-abandoned"
	abandonRun(t, hdev, abandoned, "thread-abandoned")

	// The runs list: the run appears, running, with its epoch, lease and sandbox.
	do(t, ctx, chromedp.Navigate(base+"/"))
	row := fmt.Sprintf(`document.querySelector('tr[data-run-id=%q]')`, runID)
	waitFor(t, ctx, "the run listed as running", row+` && `+row+`.querySelector('td.status').textContent === 'running'`,
		`document.getElementById('main').innerText`)
	rowText := eval[string](t, ctx, row+`.innerText`)
	if !strings.Contains(rowText, thread) || !strings.Contains(rowText, "local-process") || !strings.Contains(rowText, "left") {
		t.Fatalf("the run's row lacks thread, sandbox provider or lease: %q", rowText)
	}
	screenshot(t, ctx, "viewer-runs.png")

	// The run: events arrive while it runs, in order, each once.
	do(t, ctx, chromedp.Click(chromedp.JSPath(row+`.querySelector('a')`)))
	waitFor(t, ctx, "four events while running", `document.querySelectorAll('#events li.event').length >= 4 && document.getElementById('record-status')?.textContent === 'running'`,
		`document.getElementById('main').innerText`)
	first := shown(t, ctx)
	checkOnceInOrder(t, "while running", first, logEvents(t, base, runID))
	waitFor(t, ctx, "more events while running", fmt.Sprintf(`document.querySelectorAll('#events li.event').length > %d`, len(first)),
		`document.getElementById('event-count').textContent`)
	checkOnceInOrder(t, "still running", shown(t, ctx), logEvents(t, base, runID))
	state := eval[string](t, ctx, `document.getElementById('log-state').textContent + ' / ' + document.getElementById('record-status').textContent`)
	if state != "log open / running" {
		t.Fatalf("mid-stream the page shows %q", state)
	}
	// What the sandbox costs now, and since when (docs/design.md §5): running under a live run.
	if lc := eval[string](t, ctx, `document.getElementById('sandbox-lifecycle').textContent`); !regexp.MustCompile(`^running since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`).MatchString(lc) {
		t.Fatalf("the sandbox's lifecycle on the run page: %q", lc)
	}
	cmds := eval[[]string](t, ctx, `[...document.querySelectorAll('.cmd code')].map(c => c.textContent)`)
	if len(cmds) != 2 || cmds[0] != "sandkeep attach --api "+base+" "+runID || cmds[1] != "sandkeep tail --api "+base+" --follow "+runID {
		t.Fatalf("commands to copy: %q", cmds)
	}
	if ds := eval[string](t, ctx, `document.getElementById('driver-state').dataset.state + ': ' + document.getElementById('driver-state').textContent`); !strings.HasPrefix(ds, "live: Driven at epoch 1") {
		t.Fatalf("driver state of a driven run: %q", ds)
	}
	screenshot(t, ctx, "viewer-run.png")
	// Pushed, not polled: the page subscribed to the run and never long-polled its log.
	pushedOnly := func(what string) {
		t.Helper()
		for _, u := range eval[[]string](t, ctx, `window.__fetched`) {
			if strings.Contains(u, "/v1/runs/"+runID+"/events") {
				t.Fatalf("%s: the page long-polled the log: %s", what, u)
			}
		}
		subs := eval[[]string](t, ctx, `window.__wsSent`)
		if len(subs) == 0 || !strings.Contains(subs[0], `"type":"subscribe","runId":"`+runID+`"`) {
			t.Fatalf("%s: the page subscribed with %q", what, subs)
		}
	}
	pushedOnly("while running")

	// A reload starts over from the log and continues: no duplicate, no gap, still live.
	before := len(shown(t, ctx))
	do(t, ctx, chromedp.Reload())
	waitFor(t, ctx, "events after the reload", fmt.Sprintf(`document.querySelectorAll('#events li.event').length > %d`, before),
		`document.getElementById('event-count')?.textContent`)
	afterReload := shown(t, ctx)
	checkOnceInOrder(t, "after the reload", afterReload, logEvents(t, base, runID))
	pushedOnly("after the reload")

	// A dropped socket: the page says so, subscribes again from the last offset it shows,
	// and continues without a duplicate or a gap.
	lost := eval[int](t, ctx, `(() => { const n = document.querySelectorAll('#events li.event').length; window.__wsOpen.at(-1).close(); return n; })()`)
	lastShown := eval[int](t, ctx, `Number([...document.querySelectorAll('#events li.event')].at(-1).dataset.offset)`)
	waitFor(t, ctx, "live again, with new events", fmt.Sprintf(`window.__wsSent.length >= 2 && document.getElementById('conn').dataset.state === 'ok' && document.querySelectorAll('#events li.event').length > %d`, lost),
		`document.getElementById('conn').textContent + ' ' + document.getElementById('event-count').textContent`)
	if again := eval[string](t, ctx, `window.__wsSent[1]`); !strings.Contains(again, fmt.Sprintf(`"after":%d}`, lastShown)) {
		t.Fatalf("the resubscribe after the drop: %s, want after %d", again, lastShown)
	}
	afterReload = shown(t, ctx)
	checkOnceInOrder(t, "after the reconnect", afterReload, logEvents(t, base, runID))
	pushedOnly("after the reconnect")

	// The hostile event is text: no element was made of it, no dialog opened, and the
	// page's CSP refuses an HTML sink outright.
	found := false
	for _, e := range afterReload {
		found = found || e.Text == xssPayload
	}
	imgs := eval[int](t, ctx, `document.querySelectorAll('img').length`)
	sink := eval[string](t, ctx, `(() => { try { document.createElement('div').innerHTML = '<b>x</b>'; return 'allowed'; } catch (e) { return 'refused'; } })()`)
	if !found || imgs != 0 || dialogs.Load() != 0 || sink != "refused" {
		t.Fatalf("hostile event: shown as text %v, <img> elements %d, dialogs %d, innerHTML %s", found, imgs, dialogs.Load(), sink)
	}

	// Cancel ends the run aborted and closes its log; the page shows all of it, once.
	do(t, ctx, chromedp.Click(chromedp.ID("cancel")))
	waitFor(t, ctx, "aborted and closed", `document.getElementById('record-status')?.textContent === 'aborted' && document.getElementById('log-state').dataset.closed === 'true'`,
		`document.getElementById('main').innerText`)
	// An ended run offers its log, not a takeover that cannot work.
	waitFor(t, ctx, "the ended run's commands", `document.getElementById('driver-state')?.dataset.state === 'ended' && document.querySelectorAll('.cmd code').length === 1`,
		`document.getElementById('cmds').innerText`)
	if c := eval[string](t, ctx, `document.querySelector('.cmd code').textContent`); c != "sandkeep tail --api "+base+" "+runID {
		t.Fatalf("the ended run offers %q", c)
	}
	if code := agent.Wait(t); code != 130 {
		t.Fatalf("sandkeep run after Cancel: exit %d, want 130 (aborted)\nstderr:\n%s", code, agent.Stderr)
	}
	final := logEvents(t, base, runID)
	if got := shown(t, ctx); !slices.Equal(got, final) {
		t.Fatalf("after cancel the page shows\n%v\nthe log holds\n%v", got, final)
	}
	pushedOnly("to the close")
	if dialogs.Load() != 0 {
		t.Fatalf("%d dialogs opened", dialogs.Load())
	}
	// The host-driven server: the abandoned run listed detached, then its sweep, outcome
	// expired, and the list shows it aborted.
	do(t, ctx, chromedp.Navigate(hdev.URL+"/"))
	arow := fmt.Sprintf(`document.querySelector('tr[data-run-id=%q]')`, abandoned)
	waitFor(t, ctx, "the abandoned run listed as detached or expired", arow+` && (/detached for \d+s/.test(`+arow+`.innerText) || `+arow+`.querySelector('td.status').textContent === 'aborted')`,
		`document.getElementById('main').innerText`)
	do(t, ctx, chromedp.Navigate(hdev.URL+"/#/reaper"))
	swept := fmt.Sprintf(`document.querySelector('#sweeps tr[data-run-id=%q]')`, abandoned)
	waitFor(t, ctx, "the abandoned run expired by a sweep", swept+` && `+swept+`.innerText.includes('expired')`,
		`document.getElementById('main').innerText`)
	if txt := eval[string](t, ctx, `document.getElementById('main').innerText`); strings.Contains(txt, "probed") || strings.Contains(txt, "Housekeeping") {
		t.Fatalf("the reaper page shows sweep-wide counts:\n%s", txt)
	}
	if fate := eval[string](t, ctx, swept+`.querySelector('.sandbox-fate').textContent`); fate != "reclaimed" && !strings.HasPrefix(fate, "kept") {
		t.Fatalf("the expired run's sandbox: %q", fate)
	}
	screenshot(t, ctx, "viewer-reaper.png")
	do(t, ctx, chromedp.Navigate(base+"/#/?status=aborted"))
	waitFor(t, ctx, "both runs listed aborted", arow+` && `+row+` && document.querySelectorAll('#runs-body tr').length === 2`,
		`document.getElementById('main').innerText`)
}

// TestBrowserCancelShipped: a run whose output its sandbox ships (docs/design.md §8.2; the
// dev server's default, which sandboxes reach) is watched over push, and the page's
// Cancel ends it: the shipper ships the end, and the page shows it aborted with its log
// closed, every event once, pushed to the close with no long poll of the log.
func TestBrowserCancelShipped(t *testing.T) {
	tb := browser(t)
	ctx := tb.ctx
	call(t, ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: fetchSpy + wsSpy})
	dev := clitest.StartDev(t, nil)
	base := dev.URL
	const runID, thread = "run-shipped-cancel", "thread-shipped"
	agent := startAgent(t, dev, runID, thread)
	if !strings.Contains(agent.Stderr.String(), "its sandbox ships its output") {
		t.Fatalf("the run is not shipped by its sandbox:\n%s", agent.Stderr)
	}
	do(t, ctx, chromedp.Navigate(base+"/#/runs/"+runID))
	waitFor(t, ctx, "events while running", `document.querySelectorAll('#events li.event').length >= 2 && document.getElementById('record-status')?.textContent === 'running'`,
		`document.getElementById('main').innerText`)
	checkOnceInOrder(t, "while running", shown(t, ctx), logEvents(t, base, runID))
	do(t, ctx, chromedp.Click(chromedp.ID("cancel")))
	waitFor(t, ctx, "aborted and closed", `document.getElementById('record-status')?.textContent === 'aborted' && document.getElementById('log-state').dataset.closed === 'true'`,
		`document.getElementById('main').innerText`)
	if code := agent.Wait(t); code != 130 {
		t.Fatalf("sandkeep run watching the shipped run after Cancel: exit %d, want 130 (aborted)\nstderr:\n%s", code, agent.Stderr)
	}
	if got, final := shown(t, ctx), logEvents(t, base, runID); !slices.Equal(got, final) {
		t.Fatalf("after cancel the page shows\n%v\nthe log holds\n%v", got, final)
	}
	for _, u := range eval[[]string](t, ctx, `window.__fetched`) {
		if strings.Contains(u, "/v1/runs/"+runID+"/events") {
			t.Fatalf("the page long-polled the shipped run's log: %s", u)
		}
	}
	if subs := eval[[]string](t, ctx, `window.__wsSent`); len(subs) == 0 || !strings.Contains(subs[0], `"type":"subscribe","runId":"`+runID+`"`) {
		t.Fatalf("the page subscribed with %q", subs)
	}
}

// TestBrowserPollFallback: with push off (`sandkeep dev --no-push`) the page's socket
// cannot open, so it long-polls the log: events arrive in order, a lost connection resumes
// from the last offset without a duplicate or a gap, and Cancel shows the log closed.
func TestBrowserPollFallback(t *testing.T) {
	tb := browser(t)
	ctx := tb.ctx
	call(t, ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: fetchSpy + wsSpy})
	dev := hostDev(t, "--no-push") // host-driven: Cancel is the host's here
	base := dev.URL
	const runID = "run-polled"
	agent := startAgent(t, dev, runID, "thread-polled")
	do(t, ctx, chromedp.Navigate(base+"/#/runs/"+runID))
	waitFor(t, ctx, "four events while running", `document.querySelectorAll('#events li.event').length >= 4`,
		`document.getElementById('main').innerText`)
	checkOnceInOrder(t, "while running", shown(t, ctx), logEvents(t, base, runID))
	polled := false
	for _, u := range eval[[]string](t, ctx, `window.__fetched`) {
		polled = polled || strings.HasPrefix(u, "/v1/runs/"+runID+"/events?")
	}
	if tried := eval[int](t, ctx, `window.__wsTried`); !polled || tried == 0 || eval[int](t, ctx, `window.__wsOpen.length`) != 0 {
		t.Fatalf("with push off: long-polled %v, sockets tried %d, opened %d", polled, tried, eval[int](t, ctx, `window.__wsOpen.length`))
	}

	// A lost connection: the next three reads of the log fail as if the network dropped;
	// the page says so, reconnects from its last offset, and continues without a duplicate
	// or a gap.
	tb.failNext.Store(3)
	call(t, ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/v1/runs/" + runID + "/events*"}}})
	waitFor(t, ctx, "the page shows the connection lost", `document.getElementById('conn').dataset.state === 'down'`,
		`document.getElementById('conn').textContent`)
	for deadline := time.Now().Add(clitest.Deadline); tb.failed.Load() < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 reads failed", tb.failed.Load())
		}
	}
	lost := len(shown(t, ctx))
	call(t, ctx, fetch.Disable, cdp.Empty{})
	waitFor(t, ctx, "live again, with new events", fmt.Sprintf(`document.getElementById('conn').dataset.state === 'ok' && document.querySelectorAll('#events li.event').length > %d`, lost),
		`document.getElementById('conn').textContent + ' ' + document.getElementById('event-count').textContent`)
	checkOnceInOrder(t, "after the reconnect", shown(t, ctx), logEvents(t, base, runID))

	do(t, ctx, chromedp.Click(chromedp.ID("cancel")))
	waitFor(t, ctx, "aborted and closed", `document.getElementById('record-status')?.textContent === 'aborted' && document.getElementById('log-state').dataset.closed === 'true'`,
		`document.getElementById('main').innerText`)
	if code := agent.Wait(t); code != 130 {
		t.Fatalf("sandkeep run after Cancel: exit %d, want 130 (aborted)\nstderr:\n%s", code, agent.Stderr)
	}
	if got, final := shown(t, ctx), logEvents(t, base, runID); !slices.Equal(got, final) {
		t.Fatalf("after cancel the page shows\n%v\nthe log holds\n%v", got, final)
	}
}

// fetchSpy records the URL of every fetch the page makes, installed before its script runs.
const fetchSpy = `window.__fetched = []; { const f = window.fetch; window.fetch = function (u) { window.__fetched.push(String(u)); return f.apply(this, arguments); }; }`

// wsSpy records the page's WebSockets, installed before its script runs: how many it
// tried, those that opened, and every message it sent.
const wsSpy = `window.__wsTried = 0; window.__wsOpen = []; window.__wsSent = []; { const W = window.WebSocket;
window.WebSocket = function (u, p) { window.__wsTried++; const s = new W(u, p);
  s.addEventListener('open', () => window.__wsOpen.push(s));
  const send = s.send.bind(s); s.send = (m) => { window.__wsSent.push(String(m)); return send(m); }; return s; };
window.WebSocket.prototype = W.prototype; }`

// TestBrowserBadAddresses loads hostile and malformed addresses into the page: each one
// shows an error view saying what is wrong, fetches nothing and throws nothing, whether it
// is the page's first address or a hash change away from a view that was showing. A run with
// no live driver (its host detached) says so and offers the exact takeover command; a run
// whose watcher stopped goes on, driven by its sandbox's shipper, and says that.
func TestBrowserBadAddresses(t *testing.T) {
	tb := browser(t)
	ctx := tb.ctx
	dev := clitest.StartDev(t, nil)
	base := dev.URL
	call(t, ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: fetchSpy})
	const mainText = `document.getElementById('main').innerText`
	fetched := func() []string { return eval[[]string](t, ctx, `window.__fetched`) }
	says := func(what, text string) {
		t.Helper()
		q, _ := json.Marshal(text)
		waitFor(t, ctx, what, fmt.Sprintf(`document.getElementById('route-error')?.textContent.includes(%s)`, q), mainText)
	}

	// A good address fetches (the spy works): an unknown run is the API's 404, shown.
	do(t, ctx, chromedp.Navigate(base+"/#/runs/no-such-run"))
	waitFor(t, ctx, "an unknown run's error", `document.getElementById('record')?.innerText.includes('unknown-run')`, mainText)
	if f := fetched(); !slices.Contains(f, "/v1/runs/no-such-run/view") {
		t.Fatalf("a good address fetched %q", f)
	}

	for _, c := range []struct{ addr, says string }{
		{"/#/runs/%E0%A4%A", `the run id "%E0%A4%A" is not validly percent-encoded`},
		{"/#/runs/.", `the run id "." is not a run id`},
		{"/#/runs/%2E%2E", `the run id ".." is not a run id`},
		{"/#/runs/a%2Fb", `the run id "a/b" is not a run id`},
		{"/#/runs/", `the run id "" is not a run id`},
		{"/?tenant=a%0Ab", `the tenant "a\nb" is not a tenant name`},
		{"/?tenant=a&tenant=b", "the tenant is given 2 times"},
		{"/?tenant=" + strings.Repeat("t", 65), "is not a tenant name"},
		{"/?who=me", `the page takes only ?tenant=NAME, not "who"`},
		{"/#/nowhere", `no page of this viewer is at "#/nowhere"`},
		{"/#/reaper?x=1", "no page of this viewer"},
		{"/#/?status=bogus", `the status "bogus" is not one of`},
		{"/#/?thread=%zz", `the thread "%zz" is not a thread id`},
		{"/#/?thread=a&thread=b", `"thread" is given more than once`},
	} {
		do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(base+c.addr))
		says(c.addr, c.says)
		if f := fetched(); len(f) != 0 {
			t.Errorf("%s fetched %q", c.addr, f)
		}
		if txt := eval[string](t, ctx, mainText); strings.Contains(txt, "Loading") {
			t.Errorf("%s still shows %q", c.addr, txt)
		}
	}

	// From a view that was showing: a hash change to a bad address replaces it.
	do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(base+"/"))
	waitFor(t, ctx, "the runs list", `document.getElementById('runs-note')?.textContent.startsWith('No runs yet')`, mainText)
	for _, c := range []struct{ hash, says string }{
		{"#/runs/%E0%A4%A", "is not validly percent-encoded"},
		{"#/runs/.", `the run id "." is not a run id`},
	} {
		do(t, ctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf("location.hash = %q", c.hash)))
		says(c.hash, c.says)
		if eval[bool](t, ctx, `!!document.getElementById('runs-body')`) {
			t.Errorf("%s left the runs list showing", c.hash)
		}
		for _, u := range fetched() {
			if !strings.HasPrefix(u, "/v1/runs?") {
				t.Errorf("%s fetched %s", c.hash, u)
			}
		}
		do(t, ctx, chromedp.Evaluate[chromedp.Void](`location.hash = '#/'`))
		waitFor(t, ctx, "the runs list again", `!!document.getElementById('runs-body')`, mainText)
	}
	if n := tb.exceptions.Load(); n != 0 {
		t.Fatalf("the page threw %d uncaught exceptions", n)
	}

	// A run whose host detached: no live driver, said plainly, with the takeover command.
	const detached = "run-no-driver"
	hdev := hostDev(t)
	abandonRun(t, hdev, detached, "thread-no-driver")
	do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(hdev.URL+"/#/runs/"+detached))
	waitFor(t, ctx, "no live driver", `document.getElementById('driver-state')?.dataset.state === 'none'`, mainText)
	if txt := eval[string](t, ctx, `document.getElementById('driver-state').textContent`); !strings.HasPrefix(txt, "No live driver: its driver detached") {
		t.Fatalf("driver state %q", txt)
	}
	cmds := eval[[]string](t, ctx, `[...document.querySelectorAll('.cmd code')].map(c => c.textContent)`)
	if len(cmds) != 2 || cmds[0] != "sandkeep attach --api "+hdev.URL+" "+detached {
		t.Fatalf("commands offered for a run with no driver: %q", cmds)
	}
	screenshot(t, ctx, "viewer-no-driver.png")

	// A shipped run whose `sandkeep run` was interrupted: only the watching stopped; the
	// shipper drives it on, and the page says who drives it.
	const watched = "run-watch-stopped"
	stopWatching(t, dev, watched, "thread-watch-stopped")
	do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(base+"/#/runs/"+watched))
	waitFor(t, ctx, "driven by its shipper", `document.getElementById('driver-state')?.dataset.state === 'live'`, mainText)
	if txt := eval[string](t, ctx, `document.getElementById('driver-state').textContent`); !strings.HasPrefix(txt, "Driven at epoch 1 (by the shipper in its sandbox") {
		t.Fatalf("driver state %q", txt)
	}
}
