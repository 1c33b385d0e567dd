package httpapi

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// maxPageBody is the ceiling for one read page's encoded body, under Lambda's 6 MiB
// answer.
const maxPageBody = 5_500_000

// angleEvent is one event of the largest allowed size whose data is a JSON string of '<'
// (six bytes each when a JSON encoder escapes HTML).
func angleEvent() string {
	return `{"data":"` + strings.Repeat("<", 256<<10-2) + `"}`
}

// readAllPages reads run's log from 0 to its end, asserting each page's body is under
// maxPageBody and holds at least one event; it returns the events seen and the largest body.
func (e *env) readAllPages(t *testing.T, runID string, want int) (largest int) {
	t.Helper()
	after, seen := int64(0), 0
	for seen < want {
		r := e.do(req{method: get, path: fmt.Sprintf("/v1/runs/%s/events?after=%d&limit=1000", runID, after)})
		if r.Status != http.StatusOK {
			t.Fatalf("read after %d: status %d: %.300s", after, r.Status, r.Body)
		}
		largest = max(largest, len(r.Body))
		if len(r.Body) >= maxPageBody {
			t.Errorf("read after %d: page body is %d bytes, over %d", after, len(r.Body), maxPageBody)
		}
		if bytes.Contains(r.Body, []byte(`\u003c`)) {
			t.Errorf("read after %d: the page escapes HTML ('<' as \\u003c)", after)
		}
		page := decode[readResponse](t, r)
		if len(page.Events) == 0 {
			t.Fatalf("read after %d: empty page with %d of %d events seen", after, seen, want)
		}
		for _, ev := range page.Events {
			if ev.Offset <= after {
				t.Fatalf("event at offset %d on a page after %d", ev.Offset, after)
			}
		}
		seen += len(page.Events)
		after = page.Next
	}
	if seen != want {
		t.Fatalf("read %d events, want %d", seen, want)
	}
	return largest
}

// TestReadPagesAreBoundedInBytes appends n events of 256 KiB of '<' and reads them back:
// every page stays under the byte ceiling on every backend, and nothing is lost.
func TestReadPagesAreBoundedInBytes(t *testing.T) {
	for _, n := range []int{4, 24} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, nb backendFactory) {
				e := newEnv(t, DevAuth{}, nb(t))
				cur := e.start("", "run-big", "thread-big").Cursor
				for i := range n {
					r := e.do(req{method: post, path: "/v1/runs/run-big/events", specSays: "silent",
						body: `{"cursor":"` + cur + `","events":[` + angleEvent() + `]}`})
					if r.Status != http.StatusOK {
						t.Fatalf("append %d: status %d: %.300s", i, r.Status, r.Body)
					}
					cur = decode[appendResponse](t, r).Cursor
				}
				largest := e.readAllPages(t, "run-big", n)
				t.Logf("%d events of 256 KiB '<': largest page body %d bytes", n, largest)
			})
		})
	}
}
