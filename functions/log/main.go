// Command log is sandkeep's Log Lambda: the event-log routes of SPEC §8 (append, read, finish) behind
// API Gateway. Configuration, clients and the adapter live in shared/awsfn (SPEC §9).
package main

import "github.com/sandkeep/sandkeep/shared/awsfn"

func main() { awsfn.Main(awsfn.Log) }
