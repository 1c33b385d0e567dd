package dynamostore

import "github.com/sandkeep/sandkeep/shared/sandbox"

// BrokenLogNoEpochCheck returns s's event log with the epoch check of Append removed (it
// steps past other epochs' items): the negative control of the fencing tests.
func BrokenLogNoEpochCheck(s *Store) sandbox.EventLog {
	return eventLog{s: s, brokenNoEpochCheck: true}
}

// LogWithReaderCloseHook returns s's event log calling hook between a read's page and the
// reader's close of a terminal run's log.
func LogWithReaderCloseHook(s *Store, hook func()) sandbox.EventLog {
	return eventLog{s: s, beforeReaderClose: hook}
}
