package dynamostore

import "github.com/sandkeep/sandkeep/shared/sandbox"

// BrokenLogNoEpochCheck returns s's event log with the epoch check of Append removed (it
// steps past other epochs' items): the negative control of the fencing tests.
func BrokenLogNoEpochCheck(s *Store) sandbox.EventLog {
	return eventLog{s: s, brokenNoEpochCheck: true}
}
