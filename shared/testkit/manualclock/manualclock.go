// Package manualclock is the clock a test moves by hand (a stand-in's billing clock, the
// keepers that share it, a function's metrics period). It depends on nothing of the
// project, so a provider's own tests can use it.
package manualclock

import (
	"sync"
	"time"
)

// Clock is a clock a test moves by hand; safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock at a fixed instant.
func New() *Clock {
	return &Clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock forward by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set puts the clock at t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}
