//go:build race

package clitest

// raceEnabled: the tests run under the race detector, so the binary is built with it too.
const raceEnabled = true
