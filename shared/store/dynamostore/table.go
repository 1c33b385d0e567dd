package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// ErrTableSchema: the table exists with keys or indexes other than CreateTableInput's.
var ErrTableSchema = errors.New("table exists with another schema")

// Base key attributes of the table (docs/design.md §3).
const (
	attrPK = "pk"
	attrSK = "sk"
)

// Index names. Tenant-scoped indexes carry the tenant in their partition key value; the
// global ones (the reaper source, docs/design.md §2.7) are sharded and project the item's tenant.
const (
	// IndexActiveByThread: running runs by <tenant>#<threadId>, sorted by startedAt, runId.
	IndexActiveByThread = "activeByThread"
	// IndexRunsByThread: every run by <tenant>#<threadId> (terminal too; gcAt bounds it).
	IndexRunsByThread = "runsByThread"
	// IndexRunsByTenant: every run by <tenant>#, sorted by startedAt, runId (the run
	// listing; terminal runs too, gcAt bounds it). Keys and status only: later writes that
	// leave the status alone (claims, heartbeats, detach, cancel) never write the index.
	IndexRunsByTenant = "runsByTenant"
	// IndexRunsByKey: non-terminal runs by <tenant>#<sandboxKey> (the in-use check).
	IndexRunsByKey = "runsByKey"
	// IndexReclaim: running runs by shard, sorted by reclaimAt (global).
	IndexReclaim = "reclaimCandidates"
	// IndexIdleInstances: instance rows by shard, sorted by updatedAt (global).
	IndexIdleInstances = "instancesByUpdatedAt"
	// IndexPendingReclaims: instance rows with a pending reclaim, by shard (global).
	IndexPendingReclaims = "pendingReclaims"
	// IndexStopCandidates: running or stopping instance rows by shard, sorted by idleSince
	// (global; the idle stop, docs/design.md §5).
	IndexStopCandidates = "instancesToStop"
	// IndexOpenIntents: open intents by shard, sorted by createdAt (global).
	IndexOpenIntents = "openIntents"
)

// Index helper attributes; each is present only while its item qualifies, so every index
// is sparse. They are named apart from record attributes so a record attribute can never
// collide with an index key's type.
const (
	attrByThread     = "byThread"     // S <tenant>#<threadId>, every run
	attrByTenant     = "byTenant"     // S <tenant>#, every run
	attrActiveThread = "activeThread" // S <tenant>#<threadId>, running runs only
	attrThreadSort   = "threadSort"   // S sortInt(startedAt)#<runId>, every run
	attrKeyRef       = "keyRef"       // S <tenant>#<sandboxKey>, non-terminal runs with a key
	attrReclaimShard = "reclaimShard" // S shard, running runs only
	attrReclaimAt    = "reclaimAt"    // N contract.ReclaimAt, running runs only
	attrIdleShard    = "idleShard"    // S shard, every instance row
	attrIdleAt       = "idleAt"       // N updatedAt of an instance row
	attrPendingShard = "pendingShard" // S shard, instance rows with a pending reclaim
	attrPendingAt    = "pendingAt"    // N updatedAt of a tombstoned row
	attrStopShard    = "stopShard"    // S shard, running or stopping instance rows without a tombstone
	attrStopAt       = "stopAt"       // N idleSince of an instance row
	attrIntentShard  = "intentShard"  // S shard, open intents only
	attrIntentAt     = "intentAt"     // N createdAt of an open intent
	attrTenant       = "tenant"       // S the item's tenant (projected by global indexes)
	attrGCAt         = "gcAt"         // N epoch seconds: DynamoDB TTL; never relied upon
)

// Shards is the number of partitions of each global index; an item's shard is a hash of
// its tenant and id, so the reaper's listings query every shard and merge.
const Shards = 8

// CreateTableInput returns the table's full definition (docs/design.md §3): pk/sk strings, on-demand
// billing and the sparse indexes. template.yaml must declare the same (a test compares).
func CreateTableInput(table string) *dynamodb.CreateTableInput {
	s := func(name string) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: types.ScalarAttributeTypeS}
	}
	n := func(name string) types.AttributeDefinition {
		return types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: types.ScalarAttributeTypeN}
	}
	keys := func(hash, rng string) []types.KeySchemaElement {
		ks := []types.KeySchemaElement{{AttributeName: aws.String(hash), KeyType: types.KeyTypeHash}}
		if rng != "" {
			ks = append(ks, types.KeySchemaElement{AttributeName: aws.String(rng), KeyType: types.KeyTypeRange})
		}
		return ks
	}
	keysOnly := &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly}
	include := func(attrs ...string) *types.Projection {
		return &types.Projection{ProjectionType: types.ProjectionTypeInclude, NonKeyAttributes: attrs}
	}
	gsi := func(name, hash, rng string, p *types.Projection) types.GlobalSecondaryIndex {
		return types.GlobalSecondaryIndex{IndexName: aws.String(name), KeySchema: keys(hash, rng), Projection: p}
	}
	return &dynamodb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			s(attrPK), s(attrSK),
			s(attrActiveThread), s(attrByThread), s(attrByTenant), s(attrThreadSort), s(attrKeyRef),
			s(attrReclaimShard), n(attrReclaimAt),
			s(attrIdleShard), n(attrIdleAt),
			s(attrPendingShard), n(attrPendingAt),
			s(attrIntentShard), n(attrIntentAt),
			s(attrStopShard), n(attrStopAt),
		},
		KeySchema: keys(attrPK, attrSK),
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
			// Hits are re-read from the base item, so keys suffice.
			gsi(IndexActiveByThread, attrActiveThread, attrThreadSort, keysOnly),
			// ListByThread is a listing, not a decision: served from the index in one Query,
			// so it holds the record's fields; none a heartbeat writes (leaseUntil, ver), so a
			// renewal writes no copy here (docs/design.md §3.1).
			gsi(IndexRunsByThread, attrByThread, attrThreadSort, include(recordAttrs...)),
			// The run listing: hits are re-read; status lets the index filter by it.
			gsi(IndexRunsByTenant, attrByTenant, attrThreadSort, include(attrStatus)),
			gsi(IndexRunsByKey, attrKeyRef, "", keysOnly),
			gsi(IndexReclaim, attrReclaimShard, attrReclaimAt, include(attrTenant, attrRunID)),
			gsi(IndexIdleInstances, attrIdleShard, attrIdleAt, include(attrTenant, attrKey)),
			gsi(IndexPendingReclaims, attrPendingShard, attrPendingAt, include(attrTenant, attrKey)),
			gsi(IndexOpenIntents, attrIntentShard, attrIntentAt, include(attrTenant, attrKey)),
			gsi(IndexStopCandidates, attrStopShard, attrStopAt, include(attrTenant, attrKey)),
		},
	}
}

// CreateTable creates table with its indexes and waits until the table and every index
// are ACTIVE (bounded by ctx). A table of that name that exists already — made by another
// creator, or by this call's own request whose response was lost and which the SDK retried
// (ResourceInUseException) — is accepted once ACTIVE when its keys and indexes are
// CreateTableInput's; otherwise the error wraps ErrTableSchema and names each difference.
func CreateTable(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := client.CreateTable(ctx, CreateTableInput(table))
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("dynamostore: create table %q: %w", table, err)
	}
	return VerifyTable(ctx, client, table)
}

// VerifyTable waits until table and its indexes are ACTIVE, then checks its keys and
// indexes against CreateTableInput (a mismatch wraps ErrTableSchema, naming each
// difference). Indexes the table has beyond ours are left alone.
func VerifyTable(ctx context.Context, client *dynamodb.Client, table string) error {
	desc, err := waitActive(ctx, client, table)
	if err != nil {
		return err
	}
	if diffs := schemaDiff(CreateTableInput(table), desc); len(diffs) > 0 {
		return fmt.Errorf("dynamostore: table %q: %w: %s", table, ErrTableSchema, strings.Join(diffs, "; "))
	}
	return nil
}

// WaitActive polls until table and all of its indexes are ACTIVE, or ctx ends.
func WaitActive(ctx context.Context, client *dynamodb.Client, table string) error {
	_, err := waitActive(ctx, client, table)
	return err
}

func waitActive(ctx context.Context, client *dynamodb.Client, table string) (*types.TableDescription, error) {
	delay := 20 * time.Millisecond
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		var nf *types.ResourceNotFoundException
		switch {
		case errors.As(err, &nf):
			// Eventually consistent control plane: a just-created table may not be visible yet.
		case err != nil:
			return nil, fmt.Errorf("dynamostore: describe table %q: %w", table, err)
		case tableActive(out.Table):
			return out.Table, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dynamostore: waiting for table %q to become ACTIVE: %w", table, context.Cause(ctx))
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// schemaDiff lists how the described table differs from want in what the store relies
// on: the key schema, the types of key attributes, and each index's keys and projection.
func schemaDiff(want *dynamodb.CreateTableInput, got *types.TableDescription) []string {
	var diffs []string
	if w, g := keyText(want.KeySchema), keyText(got.KeySchema); w != g {
		diffs = append(diffs, fmt.Sprintf("key schema is %s, want %s", g, w))
	}
	gotTypes := map[string]types.ScalarAttributeType{}
	for _, a := range got.AttributeDefinitions {
		gotTypes[aws.ToString(a.AttributeName)] = a.AttributeType
	}
	for _, a := range want.AttributeDefinitions {
		name := aws.ToString(a.AttributeName)
		if g, ok := gotTypes[name]; ok && g != a.AttributeType {
			diffs = append(diffs, fmt.Sprintf("attribute %s has type %s, want %s", name, g, a.AttributeType))
		}
	}
	gotIdx := map[string]types.GlobalSecondaryIndexDescription{}
	for _, g := range got.GlobalSecondaryIndexes {
		gotIdx[aws.ToString(g.IndexName)] = g
	}
	for _, w := range want.GlobalSecondaryIndexes {
		name := aws.ToString(w.IndexName)
		g, ok := gotIdx[name]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("index %s is missing", name))
			continue
		}
		if wk, gk := keyText(w.KeySchema), keyText(g.KeySchema); wk != gk {
			diffs = append(diffs, fmt.Sprintf("index %s has keys %s, want %s", name, gk, wk))
		}
		if wp, gp := projectionText(w.Projection), projectionText(g.Projection); wp != gp {
			diffs = append(diffs, fmt.Sprintf("index %s has projection %s, want %s", name, gp, wp))
		}
	}
	return diffs
}

// keyText renders a key schema as "pk HASH, sk RANGE" (hash first).
func keyText(ks []types.KeySchemaElement) string {
	parts := make([]string, 0, len(ks))
	for _, k := range ks {
		parts = append(parts, aws.ToString(k.AttributeName)+" "+string(k.KeyType))
	}
	sort.SliceStable(parts, func(i, j int) bool {
		return strings.HasSuffix(parts[i], " HASH") && !strings.HasSuffix(parts[j], " HASH")
	})
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ", ")
}

// projectionText renders a projection as its type and sorted non-key attributes.
func projectionText(p *types.Projection) string {
	if p == nil {
		return "(none)"
	}
	attrs := append([]string(nil), p.NonKeyAttributes...)
	sort.Strings(attrs)
	if len(attrs) == 0 {
		return string(p.ProjectionType)
	}
	return fmt.Sprintf("%s [%s]", p.ProjectionType, strings.Join(attrs, " "))
}

func tableActive(t *types.TableDescription) bool {
	if t == nil || t.TableStatus != types.TableStatusActive {
		return false
	}
	for _, g := range t.GlobalSecondaryIndexes {
		if g.IndexStatus != types.IndexStatusActive {
			return false
		}
	}
	return true
}
