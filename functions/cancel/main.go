// Command cancel is sandkeep's Cancel Lambda: the cancel routes of SPEC §8 (a run, a thread's active run) behind
// API Gateway. Configuration, clients and the adapter live in shared/awsfn (SPEC §9).
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() { awsfn.Main(awsfn.Cancel) }
