package agentrun_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/ops/agentrun"
)

// TestPumpBatchesAndStops: 5 lines in batches of at most 2 (the last one partial), one
// perEvent call per event, positions increasing; a flush error stops the read and the
// events after it are not handed out; a second pump from the delivered position resumes.
func TestPumpBatchesAndStops(t *testing.T) {
	e := newEnv(t, 0)
	runID := "r-pump"
	res := e.Start(runID, `printf '{"n":1}\n{"n":2}\n{"n":3}\n{"n":4}\n{"n":5}\n'`)
	psid := res.Sandbox.ProviderSandboxID
	deadline := time.Now().Add(30 * time.Second)
	for journal.Probe(e.Ctx, e.Prov, psid, dir, runID).State != journal.Finished {
		if time.Now().After(deadline) {
			t.Fatal("the agent never finished")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var sizes []int
	var last int64
	perEvent := 0
	end, err := agentrun.Pump(e.Ctx, e.Prov, psid, dir, runID, 0, journal.NewTranslator(runID), 2, 1<<20,
		func(b []contract.Event) error {
			sizes = append(sizes, len(b))
			for _, ev := range b {
				if ev.Src <= last {
					t.Errorf("src %d after %d", ev.Src, last)
				}
				last = ev.Src
			}
			return nil
		}, func() error { perEvent++; return nil })
	if err != nil || !end.Finished || end.ExitCode != 0 {
		t.Fatalf("pump: %+v, %v", end, err)
	}
	if len(sizes) != 3 || sizes[0] != 2 || sizes[1] != 2 || sizes[2] != 1 || perEvent != 5 {
		t.Fatalf("batches %v, perEvent %d; want [2 2 1], 5", sizes, perEvent)
	}

	stop := errors.New("refused")
	var got []contract.Event
	_, err = agentrun.Pump(e.Ctx, e.Prov, psid, dir, runID, 0, journal.NewTranslator(runID), 2, 1<<20,
		func(b []contract.Event) error {
			if len(got) == 2 {
				return stop
			}
			got = append(got, b...)
			return nil
		}, nil)
	if !errors.Is(err, stop) || len(got) != 2 {
		t.Fatalf("after a refused flush: %v, %d events delivered", err, len(got))
	}
	var rest int
	end, err = agentrun.Pump(e.Ctx, e.Prov, psid, dir, runID, got[1].Src, journal.NewTranslator(runID), 10, 1<<20,
		func(b []contract.Event) error { rest += len(b); return nil }, nil)
	if err != nil || !end.Finished || rest != 3 {
		t.Fatalf("resume from %d: %d events, %+v, %v", got[1].Src, rest, end, err)
	}
}
