// Command reaper is sandkeep's scheduled reaper Lambda (docs/design.md §5, §9), invoked by
// EventBridge Scheduler. Everything but the choice of sweep lives in shared/deploy/awsfn.
package main

import "github.com/sandkeep/sandkeep/shared/deploy/awsfn"

func main() {
	// The seam to the reaper (docs/design.md §5): awsfn.ReaperSweep builds shared/ops/reaper's sweep.
	awsfn.MainReaper(awsfn.ReaperSweep)
}
