package dynamostore

import (
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// RunItemForTest renders the full item of a run as every write of s stores it (test setup
// of large tables through BatchWriteItem).
func RunItemForTest(s *Store, tenant string, st contract.RunState) map[string]types.AttributeValue {
	return TokenRunItemForTest(s, tenant, st, "", "")
}

// TokenRunItemForTest is RunItemForTest carrying the create and claim tokens a retried
// write recognises itself by (the property tests' arbitrary stored states).
func TokenRunItemForTest(s *Store, tenant string, st contract.RunState, createToken, claimToken string) map[string]types.AttributeValue {
	m, err := s.runItem(tenant, &storedRun{st: st, ver: 1, createToken: createToken, claimToken: claimToken})
	if err != nil {
		panic(err) // test setup: a state that does not encode is the test's bug
	}
	return m
}

// DecodeRunForTest decodes a stored run item: its state and its create and claim tokens.
func DecodeRunForTest(item map[string]types.AttributeValue) (st contract.RunState, createToken, claimToken string, err error) {
	r, err := decodeRun(item)
	if err != nil {
		return contract.RunState{}, "", "", err
	}
	return r.st, r.createToken, r.claimToken, nil
}

// HelperAttrs are the index helper attributes of a run item.
var HelperAttrs = []string{attrByThread, attrThreadSort, attrActiveThread, attrReclaimShard, attrReclaimAt, attrKeyRef, attrGCAt}

// WantHelpersForTest decodes a stored run item and returns the helper attributes the
// rule of docs/design.md §3.1 derives from its state.
func WantHelpersForTest(s *Store, tenant string, item map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	r, err := decodeRun(item)
	if err != nil {
		return nil, err
	}
	full, err := s.runItem(tenant, r)
	if err != nil {
		return nil, err
	}
	out := map[string]types.AttributeValue{}
	for _, name := range HelperAttrs {
		if v, ok := full[name]; ok {
			out[name] = v
		}
	}
	return out, nil
}

// PushItemKeysForTest are the keys of connID's connection item and of its subscription
// to tenant's runID, and PushGCAtForTest the gcAt both carry when written at now (unix s).
func PushItemKeysForTest(tenant, runID, connID string) (conn, sub map[string]types.AttributeValue) {
	conn, _ = encodeItem(connKey(connID))
	sub, _ = encodeItem(subKey(tenant, runID, connID))
	return conn, sub
}

func PushGCAtForTest(now int64) int64 {
	return now + int64(contract.PushLifetime.Seconds()) + pushGrace
}
