// Package dynamostore is sandkeep's DynamoDB single-table backend (SPEC §3): tenant-first
// keys, single-item conditional writes only, consistent reads for every decision, sparse
// indexes for discovery only, and no Scan.
package dynamostore

import (
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/sandbox"
)

// Config configures a Store. Client and Table are required.
type Config struct {
	Client *dynamodb.Client
	Table  string
	// DriverLease is the driver lease used for reclaimAt of runs never leased (default 60 s).
	DriverLease time.Duration
	// Lock configures lock leases (defaults 15 s / 5 s / 1 s).
	Lock sandbox.LockTiming
	// LogRetention is how long log items are kept (gcAt); it must exceed the longest run
	// (default 30 days).
	LogRetention time.Duration
	// Now is the wall clock (default time.Now); lock timing always uses the monotonic clock.
	Now func() time.Time
}

// Store is a DynamoDB-backed sandbox.Backend; safe for concurrent use.
type Store struct {
	cfg Config
}

// New returns a Store over cfg; it panics on a missing Client or Table (a programming
// error caught at start).
func New(cfg Config) *Store {
	if cfg.Client == nil || cfg.Table == "" {
		panic(fmt.Sprintf("dynamostore.New: Client and Table are required (table %q)", cfg.Table))
	}
	if cfg.DriverLease <= 0 {
		cfg.DriverLease = sandbox.DefaultDriverLease * time.Millisecond
	}
	cfg.Lock = cfg.Lock.WithDefaults()
	if cfg.LogRetention <= 0 {
		cfg.LogRetention = 30 * 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{cfg: cfg}
}

func (s *Store) nowMs() int64 { return s.cfg.Now().UnixMilli() }

// pad renders a number for a sort key: zero-padded to 20 digits so string order is
// numeric order.
func pad(n int64) string { return fmt.Sprintf("%020d", n) }
