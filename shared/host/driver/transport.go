package driver

import (
	"context"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// Transport is one driver's hold on one run, wherever the run's keeper and sandbox are:
// in this process (Local) or behind the API (shared/host/driver/apitransport). It carries the driver's
// cursor between calls itself; a drive calls it from one goroutine.
type Transport interface {
	// Pump stores the journal lines after the cursor's Src as events fenced by its epoch
	// (exactly once across retries, racing pumpers and successors), waiting up to wait for
	// new bytes when there are none, and advances the cursor.
	Pump(ctx context.Context, wait time.Duration) (PumpResult, error)
	// Heartbeat extends the driver lease of the cursor's epoch; refused: ErrSuperseded or
	// ErrTerminalRun.
	Heartbeat(ctx context.Context) (keeper.HeartbeatResult, error)
	// Finish ends the run fenced by the cursor's epoch and closes its log; aborted also kills
	// the agent's process group; the journal is removed once the terminal write landed.
	Finish(ctx context.Context, in keeper.FinishInput) (contract.RunRecord, error)
}

// PumpResult is one pump's answer (the pump route's answer without its cursor).
type PumpResult struct {
	Appended        int   // events this pump stored
	LastOffset      int64 // the driver's last offset in the log after it
	Src             int64 // journal position stored up to (the log's highest Src)
	Exited          bool  // the exit sentinel was reached and every line before it is stored
	ExitCode        int   // when Exited
	CancelRequested bool
}
