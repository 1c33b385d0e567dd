package storecall_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/storecall"
)

var errInfra = errors.New("throttled")

// counting returns a call that fails with errs in turn (nil once they run out).
func counting(errs ...error) (func() (int, error), *int) {
	n := new(int)
	return func() (int, error) {
		*n++
		if *n <= len(errs) {
			return *n, errs[*n-1]
		}
		return *n, nil
	}, n
}

func TestDoRepeatsInfrastructureErrorsUntilSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, n := counting(errInfra, errInfra)
		start := time.Now()
		v, err := storecall.Do(t.Context(), storecall.Policy{}, f)
		if err != nil || v != 3 || *n != 3 {
			t.Fatalf("v %d, err %v, calls %d; want the third call's success", v, err, *n)
		}
		// 5 ms then 20 ms of (fake) backoff: the schedule, not a timing assertion on real time.
		if got := time.Since(start); got != 25*time.Millisecond {
			t.Fatalf("backoff %v, want 25ms", got)
		}
	})
}

func TestDoGivesUpAfterAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, n := counting(errInfra, errInfra, errInfra, errInfra)
		_, err := storecall.Do(t.Context(), storecall.Policy{}, f)
		if *n != storecall.Attempts || err != errInfra {
			t.Fatalf("calls %d, err %v; want %d calls and the raw error", *n, err, storecall.Attempts)
		}
		sentinel := errors.New("unavailable")
		f, n = counting(errInfra, errInfra, errInfra)
		_, err = storecall.Do(t.Context(), storecall.Policy{Exhausted: sentinel}, f)
		if *n != storecall.Attempts || !errors.Is(err, sentinel) || !errors.Is(err, errInfra) {
			t.Fatalf("calls %d, err %v; want both the sentinel and the cause", *n, err)
		}
	})
}

func TestDoReturnsAnswersAtOnce(t *testing.T) {
	extra := errors.New("unsupported")
	for _, e := range []error{contract.ErrConflict, contract.ErrSuperseded, fmt.Errorf("wrapped: %w", contract.ErrUnknownRun),
		context.Canceled, extra} {
		f, n := counting(e)
		_, err := storecall.Do(t.Context(), storecall.Policy{Answers: []error{extra}, Exhausted: errInfra}, f)
		if *n != 1 || err != e {
			t.Errorf("%v: %d calls, err %v; want one call and the answer unwrapped", e, *n, err)
		}
	}
}

func TestDoStopsWhenTheContextEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		calls := 0
		err := storecall.Do0(ctx, storecall.Policy{}, func() error {
			calls++
			cancel() // the caller gives up during the first call
			return errInfra
		})
		if calls != 1 || err != errInfra {
			t.Fatalf("calls %d, err %v", calls, err)
		}
	})
}

func TestTokenIsFreshHex(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tok := storecall.Token()
		if len(tok) != 32 || seen[tok] {
			t.Fatalf("token %q (len %d, seen %v)", tok, len(tok), seen[tok])
		}
		seen[tok] = true
	}
}
