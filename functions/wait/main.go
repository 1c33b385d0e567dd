// Command wait is sandkeep's Wait Lambda: the routes of docs/design.md §8 that may wait
// (read long polls, pumps), on their own reserved concurrency so that waiting requests
// never take the capacity of appends, finishes and cancels. Everything else lives in
// shared/deploy/awsfn (docs/design.md §9).
package main

import "github.com/sandkeep/sandkeep/shared/deploy/awsfn"

func main() { awsfn.Main(awsfn.Wait) }
