package stalltest_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandkeep/sandkeep/shared/testkit/stalltest"
)

// held reports whether a Hold of key on s is held back (checked with a cancelled context,
// so it returns at once either way).
func held(s *stalltest.Set, key string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return s.Hold(ctx, key) != nil
}

func TestStallsNestAndResumeIsIdempotent(t *testing.T) {
	var s stalltest.Set
	r1 := s.Stall("k")
	r2 := s.Stall("k")
	if !held(&s, "k") || held(&s, "other") {
		t.Fatal("stall not scoped to its key")
	}
	r1()
	r1()
	if !held(&s, "k") {
		t.Fatal("a repeated resume undid another stall")
	}
	r2()
	if held(&s, "k") {
		t.Fatal("still stalled after every resume")
	}
	if s.Held() != 2 {
		t.Fatalf("held %d calls, want 2", s.Held())
	}
}

// TestHoldEndsWithItsContextOrTheLift: a held call waits for its context's end or the
// stall's lift, and fails either way (it never reaches the store).
func TestHoldEndsWithItsContextOrTheLift(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var s stalltest.Set
		resume := s.Stall("k")
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		if err := s.Hold(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Fatalf("held %v, err %v; want the context's full second and its deadline", time.Since(start), err)
		}
		done := make(chan error)
		go func() { done <- s.Hold(t.Context(), "k") }()
		synctest.Wait()
		resume()
		if err := <-done; err == nil {
			t.Fatal("a call held until the lift proceeded: it must fail")
		}
		if err := s.Hold(t.Context(), "k"); err != nil {
			t.Fatalf("after the lift: %v", err)
		}
	})
}
