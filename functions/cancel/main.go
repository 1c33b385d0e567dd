// Command cancel is sandkeep's Cancel Lambda (SPEC §8, §9): cancel of a run or of a thread's active run behind API Gateway.
// Everything but the choice of function lives in shared/awsfn.
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() { awsfn.Main(awsfn.Cancel) }
