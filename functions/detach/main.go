// Command detach is sandkeep's Detach Lambda (SPEC §8, §9): heartbeat and detach routes behind API Gateway.
// Everything but the choice of function lives in shared/awsfn.
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() { awsfn.Main(awsfn.Detach) }
