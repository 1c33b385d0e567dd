// Command log is sandkeep's Log Lambda (SPEC §8, §9): append, read (long-poll) and finish of a run's event log behind API Gateway.
// Everything but the choice of function lives in shared/awsfn.
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() { awsfn.Main(awsfn.Log) }
