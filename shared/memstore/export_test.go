package memstore

import "fmt"

// Knobs names the deliberate defects of the negative controls.
var Knobs = []string{"no-epoch-check", "unconditional-lease", "merge-upsert", "update-keeps-durable"}

// Break turns on one deliberate defect in s, so a negative control can prove the
// conformance suites catch it. It never exists outside this package's tests.
func Break(s *Store, knob string) {
	switch knob {
	case "no-epoch-check":
		s.broke.noEpochCheck = true
	case "unconditional-lease":
		s.broke.unconditionalLease = true
	case "merge-upsert":
		s.broke.mergeUpsert = true
	case "update-keeps-durable":
		s.broke.updateKeepsDurable = true
	default:
		panic(fmt.Sprintf("memstore: unknown negative-control knob %q", knob))
	}
}
