package memstore

import (
	"context"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// intentStore is the Store's contract.IntentStore view. Intents hold only strings and
// integers, so storing and returning them by value never aliases.
type intentStore struct{ view }

var _ contract.IntentStore = intentStore{}

// Put opens an intent for key with token, replacing one with a lower token; a higher token
// is ErrConflict; the same token again is success (a retry) and changes nothing.
func (v intentStore) Put(ctx context.Context, key string, token, now int64) error {
	k := v.key(key)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.intents[k]; cur != nil {
		switch {
		case cur.Token == token:
			return nil
		case cur.Token > token:
			return fmt.Errorf("memstore: put intent %q: token %d, held by %d: %w", key, token, cur.Token, contract.ErrConflict)
		}
	}
	s.putIntent(k, contract.Intent{Key: key, Token: token, CreatedAt: now})
	return nil
}

// Record sets the created sandbox id on the intent only while it carries token; else
// ErrConflict.
func (v intentStore) Record(ctx context.Context, key string, token int64, psid string) error {
	k := v.key(key)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.intents[k]
	if cur == nil || cur.Token != token {
		return fmt.Errorf("memstore: record intent %q: token %d does not hold it: %w", key, token, contract.ErrConflict)
	}
	next := *cur
	next.ProviderSandboxID = psid
	s.putIntent(k, next)
	return nil
}

// Get returns the open intent of key; none: (nil, nil).
func (v intentStore) Get(ctx context.Context, key string) (*contract.Intent, error) {
	return load(v.s, v.s.intents, v.key(key))
}

// Drop removes the intent only while it carries token; a missing intent is success;
// another token is ErrConflict.
func (v intentStore) Drop(ctx context.Context, key string, token int64) error {
	k := v.key(key)
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.intents[k]
	switch {
	case cur == nil:
		return nil
	case cur.Token != token:
		return fmt.Errorf("memstore: drop intent %q: token %d, held by %d: %w", key, token, cur.Token, contract.ErrConflict)
	}
	delete(s.intents, k)
	s.reindexIntent(k, nil)
	s.written()
	return nil
}

// putIntent stores in and its index entry. Call with s.mu held.
func (s *Store) putIntent(k tkey, in contract.Intent) {
	s.intents[k] = &in
	s.reindexIntent(k, &in)
	s.written()
}
