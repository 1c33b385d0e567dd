// Command cancel is sandkeep's Cancel Lambda: the cancel (run, thread) routes of
// SPEC §8 behind API Gateway. Everything else lives in shared/awsfn (SPEC §9).
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() { awsfn.Main(awsfn.Cancel) }
