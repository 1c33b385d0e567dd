package wakeset_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/store/wakeset"
)

type key struct{ tenant, id string }

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestWakeOnlyItsKey: Wake closes the channels of its key's waiters only (another tenant's
// run of the same id stays asleep), once; a later Wait needs a later Wake; a stopped
// waiter is not woken.
func TestWakeOnlyItsKey(t *testing.T) {
	var s wakeset.Set[key]
	a1, stopA1 := s.Wait(key{"a", "run-x"})
	a2, stopA2 := s.Wait(key{"a", "run-x"})
	b, stopB := s.Wait(key{"b", "run-x"})
	gone, stopGone := s.Wait(key{"a", "run-x"})
	stopGone()
	defer stopA1()
	defer stopA2()
	defer stopB()
	s.Wake(key{"a", "run-x"})
	if !closed(a1) || !closed(a2) {
		t.Fatal("a waiter of the woken key is still waiting")
	}
	if closed(b) {
		t.Fatal("tenant b's run-x was woken by tenant a's")
	}
	if closed(gone) {
		t.Fatal("a stopped waiter was woken")
	}
	later, stopLater := s.Wait(key{"a", "run-x"})
	defer stopLater()
	s.Wake(key{"a", "run-x"}) // a second Wake must not close a1 again (no panic)
	if !closed(later) {
		t.Fatal("a later waiter missed the later wake")
	}
}
