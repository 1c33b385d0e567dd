package driver

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/journal"
	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Pump reads runID's journal from byte position from to its current end (or this run's
// sentinel) without following, translates each line into one event with tr (which keeps
// its state across calls), and hands the events to flush in batches of at most maxEvents
// events and maxBytes event bytes, the last partial batch included. perEvent, when set,
// runs after every event (a driver heartbeats there). The first error stops the read; the
// events of an unflushed batch are then not delivered (a successor resumes at the log's
// highest Src). The driver's loop and the reaper's replay share it.
func Pump(ctx context.Context, ex sandbox.Executor, psid, dir, runID string, from int64, tr *journal.Translator,
	maxEvents, maxBytes int, flush func([]sandbox.Event) error, perEvent func() error) (journal.End, error) {
	var (
		batch []sandbox.Event
		size  int
	)
	send := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := flush(batch)
		batch, size = nil, 0
		return err
	}
	end, err := journal.Read(ctx, ex, psid, dir, runID, from, false, func(l journal.Line) error {
		ev, ok := tr.Event(l)
		if !ok {
			return nil
		}
		batch, size = append(batch, ev), size+len(ev.Data)
		if len(batch) >= maxEvents || size >= maxBytes {
			if err := send(); err != nil {
				return err
			}
		}
		if perEvent != nil {
			return perEvent()
		}
		return nil
	})
	if err != nil {
		return end, err
	}
	return end, send()
}
