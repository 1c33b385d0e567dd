// Command resolve is sandkeep's Resolve Lambda: the start, attach, get, snapshot and active-run routes of
// docs/design.md §8 behind API Gateway. Everything else lives in shared/deploy/awsfn (docs/design.md §9).
package main

import "github.com/sandkeep/sandkeep/shared/deploy/awsfn"

func main() { awsfn.Main(awsfn.Resolve) }
