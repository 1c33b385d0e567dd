// Command sandkeep is the operator CLI and the local dev server.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "usage: sandkeep dev | table create | runs get|list|finish | reap --once")
	os.Exit(2)
}
