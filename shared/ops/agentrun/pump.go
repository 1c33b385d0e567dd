package agentrun

import (
	"context"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
)

// Pump reads runID's journal from byte position from to its current end (or this run's
// sentinel) without following, translates each line or piece into events with tr, and
// hands the events to flush in batches of at most maxEvents events and maxBytes event
// bytes, the last partial batch included. perEvent, when set, runs after every event (a
// driver heartbeats there). The first error stops the read; the events of an unflushed
// batch are then not delivered (a successor resumes at the log's highest Src). The
// driver's loop and the reaper's replay share it.
func Pump(ctx context.Context, ex contract.Executor, psid, dir, runID string, from int64, tr *journal.Translator,
	maxEvents, maxBytes int, flush func([]contract.Event) error, perEvent func() error) (journal.End, error) {
	rd, err := journal.NewReader(ctx, ex, psid, dir, runID, from)
	if err != nil {
		return journal.End{Pos: from}, err
	}
	return PumpFrom(ctx, rd, 0, tr, maxEvents, maxBytes, flush, perEvent)
}

// PumpFrom is Pump over a reader that keeps its place between calls (a waiting pump step
// never fetches a byte twice), fetching at most limit journal bytes when limit > 0
// (End.Limited when it stopped there). After an error the reader must be dropped.
func PumpFrom(ctx context.Context, rd *journal.Reader, limit int64, tr *journal.Translator,
	maxEvents, maxBytes int, flush func([]contract.Event) error, perEvent func() error) (journal.End, error) {
	var (
		batch []contract.Event
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
	end, err := rd.Next(ctx, limit, func(l journal.Line) error {
		for _, ev := range tr.Events(l) {
			batch, size = append(batch, ev), size+len(ev.Data)
			if len(batch) >= maxEvents || size >= maxBytes {
				if err := send(); err != nil {
					return err
				}
			}
			if perEvent != nil {
				if err := perEvent(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return end, err
	}
	return end, send()
}
