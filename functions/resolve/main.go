// Command resolve is sandkeep's Resolve Lambda (SPEC §8, §9): start, attach, get, snapshot and active-run routes behind API Gateway.
// Everything but the choice of function lives in shared/awsfn.
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() { awsfn.Main(awsfn.Resolve) }
