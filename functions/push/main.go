// Command push is sandkeep's Push Lambda: the WebSocket API of the deployed push
// (docs/design.md §8.1: $connect, $disconnect and the watchers' subscribe and unsubscribe
// messages). One function serves the three routes: they share the connection items and the
// catch-up, and one role holds the management permission of this API. Everything else
// lives in shared/deploy/awsfn (docs/design.md §9).
package main

import "github.com/sandkeep/sandkeep/shared/deploy/awsfn"

func main() { awsfn.MainPush() }
