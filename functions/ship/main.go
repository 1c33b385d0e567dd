// Command ship is sandkeep's Ship Lambda: the ship routes of docs/design.md §8.2 alone,
// a run's shipper's, behind the function's own URL and the HTTP API (docs/design.md §9).
// Everything else lives in shared/deploy/awsfn.
package main

import "github.com/sandkeep/sandkeep/shared/deploy/awsfn"

func main() { awsfn.Main(awsfn.Ship) }
