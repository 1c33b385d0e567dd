package wire

// The ship routes (docs/design.md §8.2): a run's shipper, inside its sandbox, sends the
// journal's raw bytes and finishes the run with its ship token as the only credential.
const (
	// ShipProbePath answers 204 to anyone: the launcher's reachability probe.
	ShipProbePath = "/v1/ship"
	// MaxShipBytes bounds a ship request's body (raw journal bytes).
	MaxShipBytes = 1 << 20
	// MaxShipEndBytes bounds a ship end's body (the stderr tail).
	MaxShipEndBytes = 4 << 10
	// Answer headers, the same as the JSON's members, so a shell shipper reads them with sed.
	ShipNextHeader  = "Sandkeep-Next"
	ShipStateHeader = "Sandkeep-State"
	ShipTokenHeader = "Sandkeep-Token"
	// ShipContentType is a ship request's body type.
	ShipContentType = "application/octet-stream"
)

// States a ship answer names.
const (
	ShipRunning = "running" // ship on
	ShipCancel  = "cancel"  // a cancel was requested: kill the agent's process group, ship on
	ShipExited  = "exited"  // the exit sentinel was reached and every line before it is stored: end
	ShipEnded   = "ended"   // the end's answer: the run is terminal and its log closed
)

// ShipResponse answers POST /v1/runs/{runId}/ship (also as the Sandkeep-* headers).
type ShipResponse struct {
	// Next is the journal position the shipper sends from next (a byte before the position
	// stored, so the server sees whether that position starts a line).
	Next  int64  `json:"next"`
	State string `json:"state"`
	// Token is the renewed ship token; ExpiresAt its expiry (Unix ms).
	Token     string `json:"token"`
	ExpiresAt int64  `json:"expiresAt"`
}

// ShipEndResponse answers POST /v1/runs/{runId}/ship/end.
type ShipEndResponse struct {
	State  string `json:"state"`  // ShipEnded
	Status string `json:"status"` // the run's terminal status
}
