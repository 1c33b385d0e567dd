// Command reaper is sandkeep's scheduled reaper Lambda (SPEC §5, §9), invoked by
// EventBridge Scheduler. Everything but the choice of sweep lives in shared/awsfn.
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() {
	// The seam to the reaper (§5): until shared/reaper lands, ListingSweep only lists what
	// the reaper source offers and acts on nothing. Replace it with a factory returning the
	// reaper's sweep (func(ctx) (awsfn.Report, error)).
	awsfn.MainReaper(awsfn.ListingSweep)
}
