package httpapi

import (
	"fmt"
	"net/http"
	"sync"
)

// DefaultMaxWaiting is each tenant's bound of concurrently waiting requests on one server
// (Config.MaxWaiting unset).
const DefaultMaxWaiting = 16

// waiters bounds, per tenant, the requests of one server that wait (a long poll past its
// empty first page, a pump asked to wait), so that one tenant's idle waits cannot hold
// every connection, goroutine and backend poll of the server (docs/design.md §8).
type waiters struct {
	max int
	mu  sync.Mutex
	n   map[string]int // tenant → requests waiting now
}

func newWaiters(limit int) *waiters {
	if limit <= 0 {
		limit = DefaultMaxWaiting
	}
	return &waiters{max: limit, n: map[string]int{}}
}

// acquire takes one of tenant's waiting places; release gives it back and must be called
// once. Past the bound it returns the 429 too-many-waiting refusal (with Retry-After).
func (w *waiters) acquire(tenant string) (release func(), err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n[tenant] >= w.max {
		return nil, &apiError{http.StatusTooManyRequests, CodeTooManyWaiting,
			fmt.Sprintf("the tenant already has %d requests waiting on this server (long polls, waiting pumps); retry after the Retry-After delay, or without waitMs", w.max)}
	}
	w.n[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.n[tenant]--; w.n[tenant] == 0 {
				delete(w.n, tenant)
			}
		})
	}, nil
}
