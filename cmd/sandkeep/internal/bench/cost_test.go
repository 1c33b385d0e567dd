package bench

import (
	"math"
	"os"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestCostPricesWhatTheTemplateDeploys: the cost model prices Lambda as template.yaml
// deploys it (the Globals' architecture and memory size), and a shipped run's ship
// requests reach the Ship function through its function URL, which adds no request
// charge: 500 lone events cost their invocations, appends, subscription Queries and
// messages, their log lines and the posts' round trips, and what the run pays once (its
// probe, first request and end) is added once, not with every batch (docs/bench.md);
// computed here by hand from the published prices.
func TestCostPricesWhatTheTemplateDeploys(t *testing.T) {
	raw, err := os.ReadFile("../../../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tmpl struct {
		Globals struct {
			Function struct {
				Architectures []string `yaml:"Architectures"`
				MemorySize    int      `yaml:"MemorySize"`
			} `yaml:"Function"`
		} `yaml:"Globals"`
	}
	if err := yaml.Unmarshal(raw, &tmpl); err != nil {
		t.Fatal(err)
	}
	g := tmpl.Globals.Function
	if len(g.Architectures) != 1 || g.Architectures[0] != "arm64" || priceLambdaGBs != 0.0000133334 {
		t.Errorf("template architectures %v priced at $%v per GB-s; arm64 is $0.0000133334 (us-east-1)", g.Architectures, priceLambdaGBs)
	}
	if float64(g.MemorySize)/1024 != lambdaGB {
		t.Errorf("template memory %d MB, the model prices %.3f GB", g.MemorySize, lambdaGB)
	}
	// Ten appending ship requests, each storing one event and posting it once, 10 ms each;
	// the run's probe, first request and end (a fence read, two writes, the closed post)
	// paid once, not once a batch.
	d := &Deployed{Requests: map[string]int{"POST ship": 11, "GET ship": 1, "POST end": 1}, Posts: 11, EvPosts: 10,
		Appends: 10, AppendDynamo: map[string]int{"PutItem": 10, "Query": 10}, AppendBusy: 100 * time.Millisecond,
		OnceRequests: 3, OnceDynamo: map[string]int{"GetItem": 1, "UpdateItem": 2}, OnceBusy: 30 * time.Millisecond,
		AppendLogBytes: 3000, OnceLogBytes: 900, SumLogBytes: 700, DriverLease: time.Minute}
	const batches = 500.0
	want := batches*(0.20+0.625+0.125+1.00)/1e6 + // per batch: invocation, append, subscriptions, message
		3*0.20/1e6 + // the probe, the first request and the end
		(batches*0.010+0.030)*0.25*0.0000133334 + // 10 ms at 256 MB per batch and 30 ms once, arm64
		batches*0.020*0.25*0.0000133334 + // each post's 20 ms round trip, waited out in the request
		(batches*300+900+10*700)*0.50/1e9 + // CloudWatch Logs: 300 bytes a batch, 900 once, 700 of sums each minute
		(2*0.625+0.125)/1e6 + // the once requests' writes and read
		3*1.00/1e6 + // closed, the subscribe and its answer
		20*2*0.625/1e6 + // the lease renewed every half lease for ten minutes: the item, and reclaimAt's move once a step
		10*0.25/1e6 + // connection-minutes
		3*0.20/1e6 + 2*0.625/1e6 // the push function's three invocations, $disconnect's two writes
	if got := Total(shippedCost(d, 1)); math.Abs(got-want) > 1e-9 {
		t.Errorf("500 lone events cost $%.7f, want $%.7f", got, want)
	}
	for _, l := range shippedCost(d, 1) {
		if l.Unit == "req" && l.Dollars > 0 && l.Dollars >= l.Quantity*priceHTTPRequest {
			t.Errorf("%q is priced as API Gateway requests", l.What)
		}
	}
}
