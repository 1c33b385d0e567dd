package keeper_test

import (
	"testing"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
	"github.com/sandkeep/sandkeep/shared/testkit/idlerace"
)

// TestIdleStopSerializesWithStart: a start that meets an idle stop half way (row marked
// stopping, provider stop pending) waits for the sandbox lock the stop holds and resumes
// the stopped sandbox: it never gets a sandbox that is stopping under it. The same race
// against a stop that skips the lock leaves the new run's sandbox stopped, which the test
// detects — on both backends.
func TestIdleStopSerializesWithStart(t *testing.T) {
	backends := map[string]func(t *testing.T) contract.Backend{
		"memory": func(*testing.T) contract.Backend { return memstore.New() },
		"dynamodb": func(t *testing.T) contract.Backend {
			client := dynamotest.Client(t)
			return dynamostore.New(dynamostore.Config{Client: client, Table: dynamotest.FreshTable(t, client)})
		},
	}
	for name, nb := range backends {
		t.Run(name, func(t *testing.T) {
			if !idlerace.RaceStopStart(t, nb(t), idlerace.LockedStop) {
				t.Fatal("the start got a sandbox that was stopped under it")
			}
			if idlerace.RaceStopStart(t, nb(t), idlerace.UnlockedStop) {
				t.Fatal("the broken variant (a stop that skips the lock) was not caught")
			}
		})
	}
}
