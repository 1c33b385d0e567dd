// Command cancel is sandkeep's Cancel Lambda: the cancel (run, thread) routes of
// docs/design.md §8 behind API Gateway. Everything else lives in shared/deploy/awsfn (docs/design.md §9).
package main

import "github.com/sandkeep/sandkeep/shared/deploy/awsfn"

func main() { awsfn.Main(awsfn.Cancel) }
