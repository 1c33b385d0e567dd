// Package bench is sandkeep's docs/design.md §11 benchmark against a DynamoDB endpoint (dynalite locally):
// latency percentiles and DynamoDB calls per operation, the bare PutItem/GetItem/UpdateItem
// calls measured in the same run through the same client, the start-latency check, 64-way
// start contention, and a reaper drain. It reports; it never decides pass/fail on timing.
// `sandkeep bench` prints its Markdown report.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore/callcount"
)

// Defaults of Config.
const (
	DefaultOps         = 200
	DefaultWarmup      = 20
	DefaultContention  = 64
	DefaultReap        = 1000
	DefaultReapBatch   = 25 // the reaper's production maxRuns (docs/design.md §5)
	DefaultAppendBytes = 1024
	DefaultWorkers     = 8 // setup parallelism of the reaper section
	DefaultDeliveries  = 40
)

// Config configures one benchmark run. Zero fields take the defaults; a negative
// Contention, Reap or Deliveries skips that section.
type Config struct {
	Endpoint    string // DynamoDB endpoint URL (required)
	Ops         int    // measured iterations per operation
	Warmup      int    // unmeasured iterations first (connections, engine warm-up)
	Contention  int    // concurrent starts on one new thread
	Reap        int    // detached, expired runs the reaper drains
	ReapBatch   int    // the reaper's maxRuns per sweep
	AppendBytes int    // data bytes of each appended event (one event per append)
	Workers     int    // parallel setup writers of the reaper section
	Deliveries  int    // long-poll deliveries measured per backend (memory, dynalite)
	// AgentLines is how many lines the agent delivery section's agent writes (on memory
	// and on the endpoint); negative skips the section.
	AgentLines int
	// AgentSilent is the window of the section's silent drive (default 12 s, over one pump
	// wait).
	AgentSilent time.Duration
	// PushLines is how many lines the push section's agent writes to a subscribed watcher
	// (on memory and on the endpoint); negative skips the push section.
	PushLines int
	// PushWatchers is how many idle watchers the push section holds on one server;
	// negative skips that part.
	PushWatchers int
	// PushIdle is the window over which an idle watcher's cost is counted (default 10 s).
	PushIdle time.Duration
	// ShipLines is how many lines the shipper section's agent writes (its delivery run);
	// negative skips the shipper section and the deployed push path.
	ShipLines int
	// ShipChatty is how many lines the section's chatty agent writes, one every 10 ms.
	ShipChatty int
	// ShipSilent is how long the section's silent shipped agent sleeps (default 25 s).
	ShipSilent time.Duration
	// ShipLaunches is how many launches the section times with and without a shipper.
	ShipLaunches int
	// Progress receives one line per section as it starts (nil: none).
	Progress io.Writer
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Ops, DefaultOps)
	def(&c.Warmup, DefaultWarmup)
	def(&c.Contention, DefaultContention)
	def(&c.Reap, DefaultReap)
	def(&c.ReapBatch, DefaultReapBatch)
	def(&c.AppendBytes, DefaultAppendBytes)
	def(&c.Workers, DefaultWorkers)
	def(&c.Deliveries, DefaultDeliveries)
	def(&c.AgentLines, DefaultAgentLines)
	def(&c.PushLines, DefaultPushLines)
	def(&c.PushWatchers, DefaultPushWatchers)
	def(&c.ShipLines, DefaultShipLines)
	def(&c.ShipChatty, DefaultShipChatty)
	def(&c.ShipLaunches, DefaultShipLaunches)
	if c.ShipSilent <= 0 {
		c.ShipSilent = DefaultShipSilent
	}
	if c.PushIdle <= 0 {
		c.PushIdle = DefaultPushIdle
	}
	if c.AgentSilent <= 0 {
		c.AgentSilent = DefaultAgentSilent
	}
	if c.Warmup < 0 {
		c.Warmup = 0
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// Report is everything one run measured.
type Report struct {
	Started    time.Time
	Endpoint   string
	Machine    Machine
	Config     Config
	Ops        []*OpStats // in the order of docs/design.md §11's table
	Bare       []*OpStats // PutItem, GetItem, UpdateItem, and the three in a start's pattern
	StartSplit []*OpStats // a resumed start's calls, timed inside it, and the rest
	StartCheck StartCheck
	Contention *Contention // nil when skipped
	Reap       *Reap       // nil when skipped
	Delivery   []*Delivery // memory and dynalite; nil when skipped
	// AgentDelivery extends Delivery with a real agent and the pump (memory, dynalite).
	AgentDelivery []*AgentDelivery
	// Push is the push section (nil when skipped).
	Push *Push
	// Ship is the shipper section (nil when skipped).
	Ship    *Ship
	Elapsed time.Duration
}

// Machine describes where the run happened.
type Machine struct {
	Host, GoVersion, OS, Arch, CPU string
	CPUs                           int
	// LoadStart and LoadEnd are the 1-minute load averages when the run began and ended
	// (Linux; ""): the machine may be shared, and latency percentiles depend on it.
	LoadStart, LoadEnd string
}

// Run creates fresh tables on cfg.Endpoint, measures every section and deletes the tables;
// errors of the operations themselves abort the run (a benchmark of failing calls means
// nothing), timing never does.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("bench: a DynamoDB endpoint is required")
	}
	if cfg.Ops < 0 || cfg.AppendBytes < 0 || cfg.ReapBatch < 0 || cfg.Workers < 0 {
		return nil, errors.New("bench: ops, append bytes, reap batch and workers must not be negative")
	}
	if cfg.AppendBytes > 256<<10-2 {
		return nil, fmt.Errorf("bench: append bytes %d over one event's limit (256 KiB)", cfg.AppendBytes)
	}
	cfg = cfg.withDefaults()
	rep := &Report{Started: time.Now(), Endpoint: cfg.Endpoint, Machine: machine(), Config: cfg}
	counter := callcount.New()
	client := dynamostore.LocalClient(cfg.Endpoint, counter.Attach, attachTimer)
	env := &env{cfg: cfg, client: client, counter: counter, quiet: slog.New(slog.DiscardHandler)}

	table, drop, err := env.freshTable(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	fmt.Fprintf(cfg.Progress, "bench: operations (%d warm-up + %d measured iterations) on table %s\n", cfg.Warmup, cfg.Ops, table)
	if err := env.measureOps(ctx, table, rep); err != nil {
		return nil, err
	}
	if cfg.Contention > 0 {
		fmt.Fprintf(cfg.Progress, "bench: %d concurrent starts on one new thread\n", cfg.Contention)
		c, err := env.contention(ctx, table)
		if err != nil {
			return nil, err
		}
		rep.Contention = c
	}
	if cfg.Reap > 0 {
		// Its own table: the runs the other sections leave behind (cancelled, leased)
		// would otherwise be reaper candidates too.
		rtable, rdrop, err := env.freshTable(ctx)
		if err != nil {
			return nil, err
		}
		defer rdrop()
		fmt.Fprintf(cfg.Progress, "bench: reaper drain of %d detached, expired runs on table %s\n", cfg.Reap, rtable)
		r, err := env.reap(ctx, rtable)
		if err != nil {
			return nil, err
		}
		rep.Reap = r
	}
	if cfg.Deliveries > 0 {
		fmt.Fprintf(cfg.Progress, "bench: %d long-poll deliveries per backend (memory, dynalite)\n", cfg.Deliveries)
		d, err := env.deliveries(ctx, table)
		if err != nil {
			return nil, err
		}
		rep.Delivery = d
	}
	if cfg.AgentLines > 0 {
		atable, adrop, err := env.freshTable(ctx)
		if err != nil {
			return nil, err
		}
		defer adrop()
		ad, err := env.agentDeliveries(ctx, atable)
		if err != nil {
			return nil, err
		}
		rep.AgentDelivery = ad
	}
	if cfg.PushLines > 0 {
		ptable, pdrop, err := env.freshTable(ctx)
		if err != nil {
			return nil, err
		}
		defer pdrop()
		p, err := env.pushSection(ctx, ptable)
		if err != nil {
			return nil, err
		}
		rep.Push = p
	}
	if cfg.ShipLines > 0 {
		stable, sdrop, err := env.freshTable(ctx)
		if err != nil {
			return nil, err
		}
		defer sdrop()
		s, err := env.shipSection(ctx, stable)
		if err != nil {
			return nil, err
		}
		rep.Ship = s
	}
	rep.Elapsed = time.Since(rep.Started)
	rep.Machine.LoadEnd = loadAverage()
	return rep, nil
}

// env is what every section shares: one client (with the call counter) and the config.
type env struct {
	cfg     Config
	client  *dynamodb.Client
	counter *callcount.Counter
	quiet   *slog.Logger
}

// freshTable creates a uniquely named table; drop deletes it (best effort, after the run).
func (e *env) freshTable(ctx context.Context) (string, func(), error) {
	name := "sandkeep-bench-" + randHex(6)
	if err := dynamostore.CreateTable(ctx, e.client, name); err != nil {
		return "", nil, fmt.Errorf("bench: create table %s: %w", name, err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := e.client.DeleteTable(dctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
			fmt.Fprintf(e.cfg.Progress, "bench: delete table %s: %v\n", name, err)
		}
	}
	return name, drop, nil
}

func machine() Machine {
	host, _ := os.Hostname()
	return Machine{Host: host, GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH,
		CPU: cpuModel(), CPUs: runtime.NumCPU(), LoadStart: loadAverage()}
}

// loadAverage returns the 1-minute load average on Linux; "" elsewhere.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// cpuModel reads the CPU model name on Linux; "" elsewhere.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	const tag = "model name"
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, tag); ok {
			if _, v, ok := strings.Cut(rest, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return ""
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b)
}
