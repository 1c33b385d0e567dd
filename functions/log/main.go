// Command log is sandkeep's Log Lambda: the event-log writes (append, finish) of
// docs/design.md §8 behind API Gateway; reads and pumps, which may wait, are the Wait
// Lambda's. Everything else lives in shared/deploy/awsfn (docs/design.md §9).
package main

import "github.com/sandkeep/sandkeep/shared/deploy/awsfn"

func main() { awsfn.Main(awsfn.Log) }
